"""A fault-injecting HTTP proxy between ckptfs and the S3 server, for tests.

It understands just enough HTTP/1.1 (request line, headers, Content-Length
bodies; boto3 neither pipelines nor chunks our requests) to act per request:

* ``pass``      forward everything (optionally throttled to ``rate`` bytes/s upstream)
* ``refuse``    reset every new connection: the endpoint is down
* ``blackhole`` accept and read, never answer: the endpoint hangs
* ``fail(status, code, count, methods)``  answer the next ``count`` matching requests
  with an S3 error (503 SlowDown, 500 InternalError, 403 AccessDenied ...)
* ``deny(path_contains, methods)``  answer every matching request whose key contains ``path_contains``
  with 403 AccessDenied, in any mode, until ``allow()`` (a bucket policy that does not cover a prefix)
* ``hold(path_contains, methods)``  read every matching request whole and keep it, neither forwarded nor answered,
  until ``release()``: then each reaches the server (on a connection of its own) and its answer goes back to the
  client if it still waits (a request held up in the network that lands late: issue 42, case 7); ``held`` counts
  them, ``landed`` those the server answered since

and, whatever the mode, archived objects (``archive(bucket, key)``) as an archive storage class
behaves on AWS (SeaweedFS keeps a StorageClass given at PUT and reports it, but never archives):
a GET answers 403 InvalidObjectState until the object is restored; RestoreObject (POST ?restore)
answers 202 and makes it ``ongoing`` (409 RestoreAlreadyInProgress while it is), HEAD then carries
``x-amz-restore: ongoing-request="true"``; ``restored(bucket, key)`` finishes the restore (HEAD:
``ongoing-request="false", expiry-date=...``; GET passes).

Switching modes drops the open connections, so the new mode applies to the
next request. ``bytes_up`` counts request bytes forwarded to the server; ``writes`` logs every
PUT and POST forwarded (object key, query, body length, when it started and when its whole body was
forwarded), so a test can count the uploads of each key (tests/support/peer_nodes.py).
Test support code: plain threads, not part of the product.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from tests.support.seaweed import free_port

_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>{code}</Code><Message>injected by faultproxy</Message><RequestId>fault</RequestId></Error>"
)
_REASONS = {200: "OK", 202: "Accepted", 403: "Forbidden", 404: "Not Found", 409: "Conflict", 500: "Internal Server Error",
            503: "Service Unavailable"}
_RESTORE_HEADER = {"ongoing": b'ongoing-request="true"',
                   "restored": b'ongoing-request="false", expiry-date="Fri, 23 Dec 2039 00:00:00 GMT"'}


@dataclass
class _Failure:
    status: int
    code: str
    count: int
    methods: frozenset[str] | None


@dataclass(frozen=True)
class ForwardedWrite:
    """One PUT or POST passed to the server: a PutObject, an UploadPart, a copy, a Create/CompleteMultipartUpload."""

    method: str
    key: str  # "/bucket/key", unquoted
    query: str
    length: int  # body bytes
    copy: bool  # x-amz-copy-source: no body bytes of the object crossed
    started: float  # time.monotonic() when its head arrived
    forwarded: float | None  # when its whole body had been forwarded upstream (None: cut off before)

    @property
    def subresource(self) -> bool:
        """A request on an object's tags, ACL or retention, not on its bytes."""
        params = {q.split("=", 1)[0] for q in self.query.lstrip("?").split("&") if q}
        return bool(params & {"tagging", "acl", "retention", "legal-hold"})

    @property
    def sends_object_bytes(self) -> bool:
        """A PutObject or an UploadPart (not a copy): its body is object bytes."""
        return self.method == "PUT" and not self.copy and not self.subresource

    @property
    def completes_object(self) -> bool:
        """A PutObject or a CompleteMultipartUpload whose request reached the server whole: it makes the object."""
        if self.forwarded is None:
            return False
        if self.method == "PUT":
            return "uploadId=" not in self.query and not self.subresource
        return self.method == "POST" and "uploadId=" in self.query


@dataclass
class FaultProxy:
    upstream_port: int
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    mode: str = "pass"
    rate: float = 0.0  # bytes/s upstream in "pass" mode; 0 = unlimited
    bytes_up: int = 0
    requests: int = 0
    injected: int = 0
    archived: dict[str, str] = field(default_factory=dict)  # "/bucket/key" -> archived | ongoing | restored
    restore_requests: int = 0
    put_agents: collections.Counter[str] = field(default_factory=collections.Counter)  # User-Agent product of each PUT
    writes: list[ForwardedWrite] = field(default_factory=list)  # every PUT and POST forwarded, in order
    held: int = 0  # requests held (hold)
    landed: list[int] = field(default_factory=list)  # the HTTP status the server gave each held request once released

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._failure: _Failure | None = None
        self._denied: list[tuple[str, frozenset[str]]] = []
        self._holding: tuple[str, frozenset[str]] | None = None
        self._released = threading.Event()
        self._next_free = 0.0
        self._conns: set[socket.socket] = set()
        self._stop = threading.Event()
        self._listener = socket.create_server((self.host, self.port))
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ control
    def set_mode(self, mode: str, rate: float | None = None) -> None:
        assert mode in ("pass", "refuse", "blackhole")
        with self._lock:
            self.mode = mode
            if rate is not None:
                self.rate = rate
            self._failure = None
        self.drop_connections()

    def fail(self, status: int, code: str, count: int, methods: set[str] | None = None) -> None:
        with self._lock:
            self.mode = "pass"
            self._failure = _Failure(status, code, count, frozenset(methods) if methods else None)
        self.drop_connections()

    def deny(self, path_contains: str, methods: set[str] | None = None) -> None:
        """403 AccessDenied for every request (of `methods`, default PUT) whose path contains `path_contains`."""
        with self._lock:
            self._denied.append((path_contains, frozenset(methods or {"PUT"})))

    def hold(self, path_contains: str, methods: set[str] | None = None) -> None:
        with self._lock:
            self._holding = (path_contains, frozenset(methods or {"PUT", "POST"}))
            self._released.clear()

    def release(self) -> None:
        with self._lock:
            self._holding = None
        self._released.set()

    def _held(self, method: str, target: str) -> bool:
        with self._lock:
            rule = self._holding
        return rule is not None and method in rule[1] and rule[0] in urllib.parse.unquote(target)

    def _land_late(self, client: socket.socket, method: str, target: str, head: bytes, body: bytes) -> None:
        """A held request, once released: sent on a connection of its own (closed by the server after its answer),
        the answer relayed to the client if it is still there."""
        with self._lock:
            self.held += 1
        self._released.wait(600)
        # the body is in hand: no `Expect: 100-continue` (the server's interim answer would come first)
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith((b"connection:", b"expect:"))]
        server = socket.create_connection((self.host, self.upstream_port))
        try:
            started = time.monotonic()
            server.sendall(b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n" + body)
            answer = b""
            while chunk := server.recv(65536):
                answer += chunk
        finally:
            server.close()
        with self._lock:
            self.requests += 1
            self.writes.append(_forwarded(method, target, head, len(body), started))
            statuses = [int(line.split(b" ", 2)[1]) for line in answer.split(b"\r\n") if line.startswith(b"HTTP/")]
            self.landed.append(next((st for st in statuses if st >= 200), 0))
        try:
            client.sendall(answer)
        except OSError:
            pass  # the client gave up on it long ago

    def allow(self) -> None:
        with self._lock:
            self._denied.clear()

    def _deny(self, method: str, target: str) -> _Failure | None:
        path = urllib.parse.unquote(target.partition("?")[0])
        with self._lock:
            if any(part in path and method in methods for part, methods in self._denied):
                self.injected += 1
                return _Failure(403, "AccessDenied", 1, None)
        return None

    def archive(self, bucket: str, key: str) -> None:
        with self._lock:
            self.archived[f"/{bucket}/{key}"] = "archived"

    def restored(self, bucket: str, key: str) -> None:
        with self._lock:
            self.archived[f"/{bucket}/{key}"] = "restored"

    def archive_state(self, bucket: str, key: str) -> str | None:
        with self._lock:
            return self.archived.get(f"/{bucket}/{key}")

    def failures_left(self) -> int:
        with self._lock:
            return self._failure.count if self._failure else 0

    def drop_connections(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            _reset(c)

    def close(self) -> None:
        self._stop.set()
        self._released.set()  # a request still held goes nowhere: its thread ends
        self._listener.close()
        self.drop_connections()

    # ----------------------------------------------------------------- serving
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == "refuse":
                _reset(client)
                continue
            with self._lock:
                self._conns.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        server: socket.socket | None = None
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = client.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = _content_length(head)
                if self.mode == "blackhole":
                    while client.recv(65536):
                        pass
                    return
                method, target = head.split(b" ", 2)[:2]
                method = method.decode()
                if method == "PUT":
                    with self._lock:
                        self.put_agents[_user_agent(head).split("/", 1)[0]] += 1
                if self._held(method, target.decode()):
                    while len(buf) < length:
                        chunk = client.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    self._land_late(client, method, target.decode(), head, buf[:length])
                    return
                failure = self._deny(method, target.decode()) or self._take_failure(method)
                archived = self._archived_answer(method, target.decode()) if failure is None else None
                if failure is not None or archived is not None:
                    while len(buf) < length:
                        chunk = client.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    body_up, buf = buf[:length], buf[length:]
                if failure is None and isinstance(archived, bytes):
                    # HEAD of an object being (or done being) restored: the server's answer plus x-amz-restore
                    client.sendall(self._head_with(head + b"\r\n\r\n" + body_up, archived))
                    continue
                if failure is None and archived is not None:
                    failure = archived
                if failure is not None:
                    body = _ERROR_BODY.format(code=failure.code).encode() if failure.code else b""
                    client.sendall(
                        b"HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                        % (failure.status, _REASONS.get(failure.status, "Error").encode(), len(body)) + body
                    )
                    return
                if server is None:
                    server = socket.create_connection((self.host, self.upstream_port))
                    with self._lock:
                        self._conns.add(server)
                    threading.Thread(target=_pump, args=(server, client), daemon=True).start()
                started = time.monotonic()
                self._send_up(server, head + b"\r\n\r\n")
                sent = 0
                while sent < length:
                    if not buf:
                        buf = client.recv(65536)
                        if not buf:
                            return
                    piece, buf = buf[: length - sent], buf[length - sent:]
                    self._send_up(server, piece)
                    sent += len(piece)
                with self._lock:
                    self.requests += 1
                    if method in ("PUT", "POST"):
                        self.writes.append(_forwarded(method, target.decode(), head, length, started))
        except OSError:
            pass
        finally:
            _reset(client)
            if server is not None:
                _reset(server)

    def _archived_answer(self, method: str, target: str) -> _Failure | bytes | None:
        """What an archived object's request gets: an answer of our own, an x-amz-restore value for HEAD, or None (pass)."""
        path, _, query = target.partition("?")
        key = urllib.parse.unquote(path)
        with self._lock:
            state = self.archived.get(key)
            if state is None:
                return None
            if method == "GET" and state != "restored":
                self.injected += 1
                return _Failure(403, "InvalidObjectState", 1, None)
            if method == "POST" and "restore" in urllib.parse.parse_qs(query, keep_blank_values=True):
                self.restore_requests += 1
                if state == "archived":
                    self.archived[key] = "ongoing"
                    return _Failure(202, "", 1, None)
                if state == "ongoing":
                    return _Failure(409, "RestoreAlreadyInProgress", 1, None)
                return _Failure(200, "", 1, None)
            if method == "HEAD" and state in _RESTORE_HEADER:
                return _RESTORE_HEADER[state]
            return None

    def _head_with(self, request: bytes, restore: bytes) -> bytes:
        """Send a HEAD request to the server on a connection of its own; its answer with x-amz-restore added."""
        up = socket.create_connection((self.host, self.upstream_port))
        try:
            up.sendall(request)
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = up.recv(65536)
                if not chunk:
                    break
                answer += chunk
        finally:
            _reset(up)
        status_and_headers, _, rest = answer.partition(b"\r\n\r\n")
        return status_and_headers + b"\r\nx-amz-restore: " + restore + b"\r\n\r\n" + rest

    def _take_failure(self, method: str) -> _Failure | None:
        with self._lock:
            f = self._failure
            if f is None or f.count <= 0 or (f.methods is not None and method not in f.methods):
                return None
            f.count -= 1
            self.injected += 1
            return f

    def _send_up(self, server: socket.socket, data: bytes) -> None:
        step = 64 << 10
        for i in range(0, len(data), step):
            piece = data[i: i + step]
            with self._lock:
                # one budget for all connections: `rate` is the link's speed, not each connection's
                delay = 0.0
                if self.rate:
                    now = time.monotonic()
                    start = max(now, self._next_free)
                    self._next_free = start + len(piece) / self.rate
                    delay = start - now
            if delay:
                time.sleep(delay)
            server.sendall(piece)
            with self._lock:
                self.bytes_up += len(piece)


def _forwarded(method: str, target: str, head: bytes, length: int, started: float) -> ForwardedWrite:
    path, _, query = target.partition("?")
    return ForwardedWrite(method, urllib.parse.unquote(path), query, length, _header(head, b"x-amz-copy-source") is not None,
                          started, time.monotonic())


def _header(head: bytes, wanted: bytes) -> bytes | None:
    """The value of header `wanted` (lower case) in a request head, or None."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == wanted:
            return value.strip()
    return None


def _user_agent(head: bytes) -> str:
    return (_header(head, b"user-agent") or b"").decode(errors="replace")


def _content_length(head: bytes) -> int:
    return int(_header(head, b"content-length") or 0)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _reset(dst)


def _reset(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
