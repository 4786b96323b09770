"""The one HTTP server (gateway/httpserver.py) on a real loopback socket: a flood of idle connections is
capped (the oldest closed, a scrape still answered), a client trickling its headers is disconnected,
and /metrics is the same text with and without the page beside it."""

from __future__ import annotations

import functools
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Callable

import trio

from ckptfs.httpserver import serve
from ckptfs.metrics import Metrics
from ckptfs.ui.app import CatalogueApp
from ckptfs.ui.snapshot import Snapshots

from tests.conftest import wait_for


async def no_catalogue(request: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "path": "", "checkpoints": []}


def with_server(app: Any, check: Callable[[int], Any], **options: Any) -> Any:
    """Serve `app` on a loopback port and run `check(port)` in a thread; its result."""

    async def main() -> Any:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(serve, app, "127.0.0.1", 0, **options))
            out = await trio.to_thread.run_sync(check, port)
            nursery.cancel_scope.cancel()
        return out

    return trio.run(main)


def get(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, r.headers["content-type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["content-type"], e.read().decode()


def closed_by_server(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        s.setblocking(True)


def test_more_idle_connections_than_the_cap_close_the_oldest_and_metrics_still_answers() -> None:
    cap, flood = 8, 40
    metrics = Metrics(lambda: {"dirty_files": 3})

    def check(port: int) -> tuple[tuple[int, str, str], int, list[int]]:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(flood)]
        try:
            answer = get(port)
            # every connection but the newest cap - 1 (the scrape took a place) was closed by the server
            wait_for("the oldest idle connections to be closed", lambda: sum(map(closed_by_server, idle)) >= flood - cap + 1, timeout=60)
            still_open = [i for i, s in enumerate(idle) if not closed_by_server(s)]
            return answer, sum(map(closed_by_server, idle)), still_open
        finally:
            for s in idle:
                s.close()

    (status, _, body), closed, still_open = with_server(metrics.app(), check, read_timeout=60, max_connections=cap)
    assert status == 200 and "ckptfs_dirty_files 3.0" in body
    assert closed >= flood - cap + 1
    assert all(i >= flood - cap for i in still_open), still_open  # the oldest went first


def test_a_client_trickling_its_headers_is_disconnected_after_the_read_timeout() -> None:
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: " + b"x" * 200 + b"\r\n\r\n"

    def check(port: int) -> int:
        """Bytes sent, one a second, before the server closed the connection."""
        with socket.create_connection(("127.0.0.1", port)) as s:
            for sent, byte in enumerate(request):
                try:
                    s.send(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    return sent
                if closed_by_server(s):
                    return sent + 1
                time.sleep(1)
        return len(request)

    sent = with_server(Metrics(lambda: {}).app(), check, read_timeout=2)
    assert sent < 60, f"still connected after {sent} bytes at one a second"  # the whole request would have been answered


def test_metrics_is_the_same_text_with_and_without_the_page() -> None:
    metrics = Metrics(lambda: {"dirty_files": 2, "source": "s3://b/p", "mountpoint": "/m"})
    page = CatalogueApp(Snapshots(no_catalogue, ""), "/m", prefix="/ui")

    def check(port: int) -> list[tuple[int, str, str]]:
        return [get(port, "/metrics"), get(port, "/"), get(port, "/ui/")]

    alone = with_server(metrics.app(), check, read_timeout=10)
    beside = with_server(metrics.app(page), check, read_timeout=10)
    process = ("process_", "# HELP process_", "# TYPE process_")  # CPU time and memory move between the scrapes
    for (s1, type1, text1), (s2, type2, text2) in zip(alone[:2], beside[:2]):
        assert (s1, s2) == (200, 200)
        assert type1 == type2 == "text/plain; version=0.0.4; charset=utf-8"
        assert [line for line in text1.splitlines() if not line.startswith(process)] == \
               [line for line in text2.splitlines() if not line.startswith(process)]
    assert alone[2][0] == 404 and "try /metrics" in alone[2][2]
    assert beside[2][0] == 200 and "<html" in beside[2][2].lower()
