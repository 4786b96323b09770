"""The one HTTP server: hypercorn under the caller's trio nursery, behind a listener that caps connections.

It serves metrics_addr (`/metrics`, and the catalogue page with ui_enabled) and `ckptfs ui`. Hypercorn's
trio worker has no connection limit, and every accepted connection is a file descriptor: a flood of idle
connections would take the descriptors the file system needs (EMFILE on the mount). So connections are
accepted through `CappedListener`: at most `MAX_CONNECTIONS` open at once; past that, the one open
longest is closed to make room, so a scrape always gets in. A client must send a whole request within
`read_timeout` seconds of connecting or of its previous answer (hypercorn's keep-alive timer, which runs
until a request's headers are complete), so a client trickling header bytes cannot hold a connection.

The hypercorn pieces used here (`TCPServer`, `WorkerContext`, `wrap_app`) are the ones its own
`hypercorn.trio.serve` assembles; pyproject.toml pins the minor version they were checked with.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from typing import Any, Awaitable, Callable

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64  # connections open at once; the oldest is closed for a new one
MAX_HEADER_BYTES = 16384  # a request whose headers are longer is refused (431)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


class OpenConnections:
    """The connections accepted and not closed yet, oldest first, at most `limit` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.streams: deque[trio.SocketStream] = deque()

    def admit(self, stream: trio.SocketStream) -> None:
        """Count `stream` in; close the oldest connections if that makes more than `limit`.

        Closing the socket wakes hypercorn's task reading or writing it (ClosedResourceError), which ends
        that connection as if the client had gone."""
        self.streams = deque(s for s in self.streams if s.socket.fileno() != -1)  # hypercorn closed them
        while len(self.streams) >= self.limit:
            self.streams.popleft().socket.close()
        self.streams.append(stream)


class CappedListener(trio.abc.Listener[trio.SocketStream]):
    """A listener whose accepted streams count against one `OpenConnections` (shared by every address)."""

    def __init__(self, inner: trio.SocketListener, open_connections: OpenConnections) -> None:
        self.inner, self.open_connections = inner, open_connections
        self.socket = inner.socket

    async def accept(self) -> trio.SocketStream:
        stream = await self.inner.accept()
        self.open_connections.admit(stream)
        return stream

    async def aclose(self) -> None:
        await self.inner.aclose()


def hypercorn_config(read_timeout: float) -> HypercornConfig:
    config = HypercornConfig()
    config.errorlog = log  # hypercorn's lines go to the daemon's or the command's log, not straight to stderr
    config.accesslog = None
    config.keep_alive_timeout = read_timeout  # from the connection (or the last answer) to a complete request
    config.read_timeout = read_timeout  # type: ignore[assignment]  # a body stalled after its headers
    config.graceful_timeout = 1
    config.h11_max_incomplete_size = MAX_HEADER_BYTES
    return config


async def serve(app: ASGIApp, host: str, port: int, *, read_timeout: float, max_connections: int = MAX_CONNECTIONS,
                task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on host:port until cancelled; reports the port bound (port 0: one the system picked).

    An address it cannot listen on raises the bare OSError before anything is served, so the caller can
    say it in one line."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    open_connections = OpenConnections(max_connections)
    config = hypercorn_config(read_timeout)
    connection = functools.partial(TCPServer, wrap_app(app, config.wsgi_max_body_size, "asgi"), config,  # type: ignore[arg-type]
                                   WorkerContext(None), ConnectionState({}))
    task_status.started(listeners[0].socket.getsockname()[1])
    # serve_listeners waits and retries when accept fails for want of descriptors or memory, and closes each
    # connection when its handler ends, cancelled or not
    await trio.serve_listeners(connection, [CappedListener(listener, open_connections) for listener in listeners])
