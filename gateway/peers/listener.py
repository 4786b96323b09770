"""The replication listener on `peer_addr` (docs/peers.md): other nodes' links connect here, prove the shared
secret, and stream their files' entries and bytes into the ReplicaStore.

One task per connection, frames applied in the order they arrive, so an owner's renames, deletes and seals
keep its order. Nothing a client does takes the listener down: a connection that does not complete the
handshake within `peer_timeout`, proves a wrong secret, sends a frame with a wrong MAC or a malformed one, or
stalls mid-frame for `peer_timeout`, is closed without a word, counted and logged in one line (at most a
few a minute). An authenticated owner's frames that fail on this disk (capacity, ENOSPC, EIO) are remembered
per file and answered at its seal (`PeerFull`, an error): the connection goes on, the owner tries another peer.

Whose replicas (docs/peers.md, identity): only an owner's incarnation whose node record is live in the bucket
(read at the connection, one GET) may send; every frame is checked again against the records as last read,
so frames of an incarnation claimed since (by this node at once, by another at the next read of the records)
are refused: the owner's seal fails and its write is not counted as replicated, where the takeover that
claimed it would have dropped the bytes. Entries are tagged with the owner's journal id and incarnation, and a
new journal's forgets and holdings concern its own files only.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import sqlite3
import threading
import time
from typing import Any, Callable, Protocol

import trio

from ..dbconnection import DiskFull
from ..peering import PeerOptionError, parse_addr

from .replicas import ReplicaFull, ReplicaMismatch, ReplicaStore, ReplicaUnknown
from .spread import redirect
from .wire import (ENC_CHUNK, GCM_TAG, META_MAX, Frame, Kind, Reader, Session, WireError, plain_length, server_handshake,
                   tune_socket)

log = logging.getLogger(__name__)

LOG_EVERY = 10.0  # seconds between two log lines about refused connections
# Connections not yet authenticated, at once: more are closed at once (a flood costs no memory). Addresses the node
# records announce (the cluster's nodes) have slots of their own and the whole of peer_timeout; anyone else ("a
# stranger": a flood, a scanner) shares the other slots, at most a few per address, each for a short deadline, so
# that no number of strangers keeps a node's owners from connecting (issue 43: about 7 connections a second from
# one process held all 64 shared slots, each for peer_timeout).
MAX_HANDSHAKES = 64  # of strangers, at once
MAX_KNOWN_HANDSHAKES = 64  # of the nodes' own addresses, at once
MAX_HANDSHAKES_PER_ADDRESS = 4  # of one stranger address, at once
STRANGER_HANDSHAKE_SECONDS = 2.0  # a handshake is three small frames: a network does it in milliseconds
WRITE_BUFFER = 1 << 20  # bytes per recv and pwrite (and xxh3 update): small enough to stay in the CPU's cache
RECEIVE_CHUNK = 16 << 20  # bytes a worker thread receives per call: what a cancel may wait for
RECEIVE_LOWAT = 256 << 10  # a worker thread wakes when this much has arrived (SO_RCVLOWAT), not at every segment
REFUSED_BYTES = 64 << 20  # a refused owner's write frame read off (its seal then answered why), at most
STOP_POLL_MS = 200  # how often a worker thread waiting for an owner's bytes looks whether the listener is stopping


class _Dropped(Exception):
    """The connection is closed: the peer broke the protocol or stalled."""


class _OutsidePrefix(_Dropped):
    """A frame names a key outside the mount's prefix (or in its `.ckptfs/`): a takeover would write or delete it."""


def confined(key: str, prefix: str) -> bool:
    """`key` is one a file or directory of this mount can have: under the prefix (the bucket's root when it is
    empty), not in its `.ckptfs/` (node records, probes), not climbing out of it. A node that holds the secret but
    names other keys (another prefix's, a record) would have a takeover here write or delete them: refused."""
    base = prefix.strip("/")
    rel = key[len(base) + 1:] if base and key.startswith(base + "/") else key if not base else None
    if not rel:
        return False
    parts = rel.rstrip("/").split("/")
    return parts[0] != ".ckptfs" and not any(p in ("", ".", "..") for p in parts)


class _Stopping(Exception):
    """The listener is being stopped while a worker thread receives a frame's bytes."""


class _RateLimitedLog:
    def __init__(self, every: float) -> None:
        self.every = every
        self.last = -1e9
        self.suppressed = 0

    def warning(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            self.suppressed += 1
            return
        more = f" ({self.suppressed} more since the last line)" if self.suppressed else ""
        self.last, self.suppressed = now, 0
        log.warning(msg + more, *args)


class OwnerJudge(Protocol):
    """Whose replicas this node takes (membership.Membership)."""

    async def admit_owner(self, node: str, incarnation: str, journal: str) -> tuple[str | None, Any]: ...

    def owner_refused(self, node: str, incarnation: str, journal: str, admitted: Any = None) -> str | None: ...


class Listener:
    def __init__(self, cfg: Any, store: ReplicaStore, secret: bytes | list[bytes], me: str, judge: OwnerJudge | None = None) -> None:
        self.cfg, self.store, self.me = cfg, store, me
        self.secret = secret  # or the secrets of a rotation: the current one and peer_secret_previous_file's
        self.judge = judge  # None: every authenticated owner is taken (a listener without node records: tests only)
        self.refused_owners = 0  # connections or frames refused: the owner's incarnation has no live record
        self._by_owner: dict[str, "_Connection"] = {}  # the connection each owner sends on now
        self.host, self.port = parse_addr(cfg.peer_addr)  # port: the bound one once `run` started
        self.configured_port = self.port
        self.on_listening: Callable[[str], None] = lambda addr: None  # the address bound (the node record announces it)
        self.timeout: float = cfg.peer_timeout
        self.connections = 0  # open, authenticated
        self.accepted_connections = 0
        self.refused_connections = 0  # never authenticated: wrong secret, not a peer, too slow
        self.keys_refused = 0  # frames naming a key outside the mount's prefix (their connection dropped)
        self.prefix: str = getattr(cfg, "prefix", "")  # the mount's: the keys a frame may name (`confined`)
        self.encryption: str = getattr(cfg, "peer_encryption", "none")  # every connection's data: wire.py
        self.dropped_connections = 0  # authenticated, then a wrong MAC, a malformed frame, a stall
        self.full_answers = 0  # seals answered PeerFull
        self.owners_redirected = 0  # owners sent to their next candidate: this node's share taken (spread.py)
        self.replicas: int = getattr(cfg, "peer_replicas", 1)  # R: the mean number of owners a node takes
        self.bytes_received = 0
        self._handshakes = 0  # strangers' handshakes now
        self._known_handshakes = 0
        self._by_address: dict[str, int] = {}  # a stranger address -> its handshakes now
        # the hosts the nodes' records (and the static `peers`) announce: their connections are served first
        self.known_hosts: Callable[[], set[str]] = lambda: set()
        self._log = _RateLimitedLog(LOG_EVERY)
        # set when the listener is cancelled: a worker thread receiving from a silent owner returns within STOP_POLL
        # instead of waiting out peer_timeout (a thread cannot be cancelled, and the cancel waits for it)
        self.stopping = threading.Event()

    @property
    def addr(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports started with the bound port (peer_addr may give port 0).

        Run again by the supervisor after a failure, it binds the port it had (its peers know it); with port 0
        configured and that port taken meanwhile, any free one: `on_listening` hands it to the node record."""
        try:
            try:
                listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            except OSError:
                if self.port == self.configured_port:
                    raise
                listeners = await trio.open_tcp_listeners(self.configured_port, host=self.host)
        except OSError as e:  # at start: the daemon's one line (run_daemon); later: one more failure, restarted
            raise PeerOptionError(f"peer_addr = {self.cfg.peer_addr} cannot be listened on ({e.strerror}): "
                                  "give a free port of an address of this node (port 0: any free port)") from None
        self.port = listeners[0].socket.getsockname()[1]
        log.info("peer listener on %s", self.addr)
        self.on_listening(self.addr)
        task_status.started(self.port)
        self.stopping.clear()  # run again by the supervisor
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._stop_flag)
                await trio.serve_listeners(self._serve, listeners)
        finally:
            self.stopping.set()

    async def _stop_flag(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.stopping.set()  # cancelled: before the connections' tasks, which may wait for a worker thread

    def _take_slot(self, host: str, known: bool) -> str | None:
        """A handshake slot for a connection from `host`, or why there is none (the connection is closed)."""
        if known:
            if self._known_handshakes >= MAX_KNOWN_HANDSHAKES:
                return f"{self._known_handshakes} connections from the nodes' addresses are not authenticated yet"
            self._known_handshakes += 1
            return None
        if self._by_address.get(host, 0) >= MAX_HANDSHAKES_PER_ADDRESS:
            return f"{MAX_HANDSHAKES_PER_ADDRESS} others from this address (not a node's) are not authenticated yet"
        if self._handshakes >= MAX_HANDSHAKES:
            return f"{self._handshakes} others from addresses no node announces are not authenticated yet"
        self._handshakes += 1
        self._by_address[host] = self._by_address.get(host, 0) + 1
        return None

    def _free_slot(self, host: str, known: bool) -> None:
        if known:
            self._known_handshakes -= 1
            return
        self._handshakes -= 1
        left = self._by_address.pop(host, 1) - 1
        if left:
            self._by_address[host] = left

    async def _serve(self, stream: trio.SocketStream) -> None:
        try:
            host, port = stream.socket.getpeername()[:2]
            where = f"{host}:{port}"
        except OSError:
            host = where = "?"
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
            tune_socket(stream.socket, self.timeout)  # an owner whose host died silently: the connection ends
            reader = Reader(stream)
            known = host in self.known_hosts()
            full = self._take_slot(host, known)
            if full is not None:
                self.refused_connections += 1
                self._log.warning("peer connection from %s refused: %s", where, full)
                return
            deadline = self.timeout if known else min(self.timeout, STRANGER_HANDSHAKE_SECONDS)
            try:
                with trio.fail_after(deadline):
                    session = await server_handshake(stream, reader, self.secret, self.me, self.encryption)
            except (WireError, trio.TooSlowError, trio.BrokenResourceError, OSError) as e:
                self.refused_connections += 1
                why = f"no handshake within {deadline:g}s" if isinstance(e, trio.TooSlowError) else str(e) or type(e).__name__
                self._log.warning("peer connection from %s refused: %s", where, why)
                return
            finally:
                self._free_slot(host, known)
            admitted = None
            if self.judge is not None:
                why = "its node record could not be read within peer_timeout"
                with trio.move_on_after(self.timeout / 2):  # a hung store: judged by the records as last read
                    why = self.judge.owner_refused(session.peer, session.peer_incarnation, session.peer_journal)
                    why, admitted = await self.judge.admit_owner(session.peer, session.peer_incarnation, session.peer_journal)
                if why is not None:
                    self.refused_owners += 1
                    self._log.warning("replicas of %s (incarnation %s) refused: %s", session.peer, session.peer_incarnation, why)
                    await _refuse(stream, reader, session, why, self.timeout)
                    return
            self.accepted_connections += 1
            self.connections += 1
            log.info("peer %s (incarnation %s, journal %s) connected from %s", session.peer, session.peer_incarnation,
                     session.peer_journal or "-", where)
            conn = _Connection(self, stream, reader, session, admitted)
            old = self._by_owner.get(session.peer)
            if old is not None:
                old.superseded = True  # one connection per owner: the old one applies nothing more (its frames may
                # still be buffered while the new one seals: they would land after the seal)
            self._by_owner[session.peer] = conn
            try:
                await conn.serve()
            except _Stopping:
                pass
            except (_Dropped, WireError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                if isinstance(e, WireError) and str(e) == "connection closed":
                    log.info("peer %s disconnected", session.peer)
                else:
                    self.dropped_connections += 1
                    why = "stalled mid-frame for peer_timeout" if isinstance(e, trio.TooSlowError) else str(e) or type(e).__name__
                    self._log.warning("peer connection from %s (%s) dropped: %s", where, session.peer, why)
            finally:
                self.connections -= 1
                if self._by_owner.get(session.peer) is conn:
                    del self._by_owner[session.peer]
        except Exception as e:  # noqa: BLE001 - one connection never takes the listener down
            self.dropped_connections += 1
            log.error("peer connection from %s failed: %s", where, e, exc_info=True)
        finally:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()


DATA_KINDS = (Kind.ENTRY, Kind.WRITE, Kind.TRUNCATE, Kind.DELETE)  # frames that give this node something to hold


class _Connection:
    """One authenticated owner's frames applied to the store, in order."""

    def __init__(self, listener: Listener, stream: trio.SocketStream, reader: Reader, session: Session,
                 admitted: Any = None) -> None:
        self.listener, self.stream, self.reader, self.session = listener, stream, reader, session
        self.store = listener.store
        self.owner = session.peer
        self.journal, self.incarnation = session.peer_journal, session.peer_incarnation
        self.admitted = admitted  # the owner's record this connection was admitted by
        self.superseded = False  # the owner connected again: this connection is closed at its next frame
        self.failed: dict[int, Exception] = {}  # ino -> the first failure of its frames since its last seal
        self.failed_other: Exception | None = None  # a delete's: answered at the next barrier
        self.buffer = bytearray(WRITE_BUFFER)
        self.may_redirect = False  # its HOLDINGS said it knows a redirect (spread.py); an earlier release's does not
        self.insist = False  # every other candidate redirected it: taken past the share
        self.sends_data = False  # it sent something to hold since it connected: it counts in this node's share

    async def serve(self) -> None:
        while True:
            frame = await self._next_frame()
            if self.superseded:
                log.info("peer %s: an older connection closed (the owner connected again)", self.owner)
                raise _Stopping
            judge = self.listener.judge
            why = None if judge is None else judge.owner_refused(self.owner, self.incarnation, self.journal, self.admitted)
            if why is not None:  # claimed since it connected: nothing more of it is kept
                self.listener.refused_owners += 1
                self.listener._log.warning("replicas of %s (incarnation %s) refused from now on: %s", self.owner,
                                           self.incarnation, why)
                if "id" in frame.meta and frame.data_length == 0:
                    await self._reply(Kind.ERROR, {"id": int(frame.meta["id"]), "error": "refused", "message": why})
                raise _Stopping  # closed: the owner's pending seals fail, its sender reconnects and is refused
            if not self.sends_data and frame.kind in DATA_KINDS:
                await self._first_data(frame)
            try:
                await self._apply(frame)
            except (ValueError, KeyError, TypeError) as e:
                raise _Dropped(f"malformed {frame.kind.name} frame ({e})") from None

    async def _first_data(self, frame: Frame) -> None:
        """The owner's first frame that brings something to hold: taken, or (this node already holds for its share of
        owners: spread.py) the owner is told at its next request to send to its next candidate, and nothing it sent
        on this connection is kept. Owners connect to their candidates at once and may send nothing for long: only
        those that send count, so an idle connection takes no one's place."""
        loaded = [c.owner for c in self.listener._by_owner.values() if c.sends_data and c is not self]
        why = redirect(self.owner, loaded, (), self.listener.replicas, self.insist, self.may_redirect)
        if why is not None and self.owner in await trio.to_thread.run_sync(self.store.owners):
            why = None  # its replicas are here (it reconnected): the index is read only when the share is full
        if why is None:
            self.sends_data = True
            return
        self.listener.owners_redirected += 1
        log.info("peer %s sent on to its next candidate: %s", self.owner, why)
        await _refuse(self.stream, self.reader, self.session, why, self.listener.timeout, error="busy",
                      first=frame)
        raise _Stopping

    async def _next_frame(self) -> Frame:
        if not self.reader.pending():  # between frames an owner may be idle as long as it likes
            await self.reader.fill(1)
        with trio.fail_after(self.listener.timeout):
            return await self.session.receive(self.reader, META_MAX)

    def _confine(self, *keys: Any) -> None:
        for key in keys:
            if key is not None and not (isinstance(key, str) and confined(key, self.listener.prefix)):
                self.listener.keys_refused += 1
                raise _OutsidePrefix(f"it names {str(key)[:200]!r}, outside this mount's prefix "
                                     f"{self.listener.prefix or '(the bucket)'!r}: refused (same bucket and prefix on every node?)")

    async def _reply(self, kind: Kind, meta: dict[str, Any]) -> None:
        with trio.fail_after(self.listener.timeout):
            await self.stream.send_all(self.session.encode(kind, meta))

    async def _apply(self, frame: Frame) -> None:
        m, store, owner = frame.meta, self.store, self.owner
        kind = frame.kind
        if kind is Kind.WRITE:
            await self._write(int(m["ino"]), int(m["offset"]), frame.data_length)
        elif kind is Kind.ENTRY:
            ino = int(m["ino"])
            self._confine(m["meta"].get("key"), m["meta"].get("copy_from"))
            await self._run(ino, store.put_entry, owner, ino, m["meta"], self.journal, self.incarnation)
        elif kind is Kind.TRUNCATE:
            ino = int(m["ino"])
            await self._unseal(ino)
            await self._run(ino, store.truncate, owner, ino, int(m["size"]))
        elif kind is Kind.FORGET:
            ino = int(m["ino"])
            version = m.get("version")
            self.failed.pop(ino, None)  # whatever failed of it, the replica goes
            await self._run(ino, store.forget, owner, ino, None if version is None else int(version), self.journal)
        elif kind is Kind.DELETE:
            self._confine(m.get("key"))
            after = m.get("after_ino")
            await self._run(None, store.add_delete, owner, int(m["op_id"]), str(m["key"]), int(m["seq"]),
                            None if after is None else int(after), self.journal, self.incarnation, str(m.get("etag") or ""))
        elif kind is Kind.DELETE_DONE:
            await self._run(None, store.drop_delete, owner, int(m["op_id"]), self.journal)
        elif kind is Kind.SEAL:
            await self._seal(m)
        elif kind is Kind.BARRIER and m.get("ping"):
            # an idle owner asking whether this node is still there (link.watch): answered at once, nothing to fsync;
            # a failed delete stays for the owner's next real barrier
            await self._reply(Kind.ACK, {"id": int(m["id"])})
        elif kind is Kind.BARRIER:
            await self._run(None, store.sync)  # the deletes and entries before it are on the disk
            failed, self.failed_other = self.failed_other, None
            await self._answer(int(m["id"]), failed)
        elif kind is Kind.HOLDINGS:
            self.may_redirect, self.insist = bool(m.get("may_redirect")), bool(m.get("insist"))
            try:
                held = await trio.to_thread.run_sync(store.holdings, owner, self.journal or None)
            except (OSError, sqlite3.Error) as e:  # the index cannot be read: the owner takes another peer
                await self._answer(int(m["id"]), e)
                return
            await self._reply(Kind.HELD, {"id": int(m["id"]), "held": held})
        else:
            raise _Dropped(f"unexpected frame {kind.name} from an owner")

    async def _run(self, ino: int | None, fn: Any, *args: Any) -> None:
        """A store change in a thread; its failure is remembered for the file's seal (or the next barrier)."""
        if ino is not None and ino in self.failed:
            return  # the file's replica is already broken here: its seal says so
        try:
            await trio.to_thread.run_sync(fn, *args)
        except ValueError:
            raise
        except (OSError, sqlite3.Error) as e:
            if ino is None:
                self.failed_other = self.failed_other or e
            else:
                self.failed[ino] = e

    async def _unseal(self, ino: int) -> None:
        """A sealed replica about to change is first recorded unsealed: a takeover never takes changed bytes for the
        sealed ones (it would find the xxh3 wrong and skip the file)."""
        if self.store.is_sealed(self.owner, ino):
            await self._run(ino, self.store.unseal, self.owner, ino)

    async def _write(self, ino: int, offset: int, length: int) -> None:
        """Receive `length` bytes into the replica at `offset`; bytes that cannot be kept are still read off the
        connection (it stays usable), the failure answered at the seal.

        Bytes that continue the replica's hashed prefix are hashed as they arrive, while still in the CPU's cache,
        so the seal of a file streamed in order only fsyncs. The bulk is received by a worker thread, RECEIVE_CHUNK
        per call, from the raw socket (after the bytes the Reader already buffered): the event loop is not woken per
        64 KiB segment (measured: about half the receiver's CPU per GiB), and a cancel waits for one chunk at most.
        A sender silent for `peer_timeout` mid-frame is a stall (TooSlowError), however long the frame."""
        inner = _Sink(self, ino, offset)
        plain = plain_length(length) if self.session.aead is not None else length
        sink: _Sink | _Decrypting = inner if plain == length else _Decrypting(inner, self.session, length)
        await self._unseal(ino)
        if ino not in self.failed:
            try:
                inner.fd = self.store.reserve(self.owner, ino, offset + plain)
                inner.hashed = self.store.writing(self.owner, ino, offset)
            except OSError as e:
                self.failed[ino] = e
        buffered = self.reader.take(length)
        if buffered:
            sink.put(memoryview(buffered))
        sock = self.stream.socket.fileno()
        while sink.done < length:
            await trio.to_thread.run_sync(sink.receive, sock, min(RECEIVE_CHUNK, length - sink.done))
        self.listener.bytes_received += length

    async def _seal(self, m: dict[str, Any]) -> None:
        request, ino = int(m["id"]), int(m["ino"])
        version, size, xxh3 = int(m["version"]), int(m["size"]), str(m["xxh3"])
        blake3 = None if m.get("blake3") is None else str(m["blake3"])  # None: an owner of an earlier release
        failed = self.failed.pop(ino, None)
        if failed is None:
            try:
                await trio.to_thread.run_sync(self.store.seal, self.owner, ino, version, size, xxh3, blake3)
            except (OSError, sqlite3.Error, ReplicaMismatch, ReplicaUnknown) as e:
                failed = e
        await self._answer(request, failed)

    async def _answer(self, request: int, failed: Exception | None) -> None:
        if failed is None:
            await self._reply(Kind.ACK, {"id": request})
            return
        if isinstance(failed, (ReplicaFull, DiskFull)) or isinstance(failed, OSError) and failed.errno in (errno.ENOSPC, errno.EDQUOT):
            self.listener.full_answers += 1
            what = "full"
        elif isinstance(failed, ReplicaMismatch):
            what = "mismatch"
        else:
            what = "error"
        message = failed.strerror if isinstance(failed, OSError) and failed.strerror else str(failed)
        if what == "full":
            self.listener._log.warning("a replica of %s's file refused: %s; the owner tries another peer", self.owner, message)
        await self._reply(Kind.ERROR, {"id": request, "error": what, "message": message})


class _Sink:
    """Where one WRITE frame's bytes go: the replica file (until a write fails: the failure is kept for the seal,
    the rest only read off the connection) and, while they continue its hashed prefix, its xxh3 state."""

    def __init__(self, conn: _Connection, ino: int, offset: int) -> None:
        self.conn, self.ino, self.offset = conn, ino, offset
        self.fd: int | None = None
        self.hashed: Any = None  # replicas._Hashed fed in order, or None
        self.done = 0

    def put(self, view: memoryview) -> None:
        if self.fd is not None:
            try:
                _pwrite_all(self.fd, view, self.offset + self.done)
            except OSError as e:
                self.conn.failed[self.ino] = ReplicaFull(str(e)) if e.errno in (errno.ENOSPC, errno.EDQUOT) else e
                self.fd = None
        if self.fd is None:
            self.hashed = None  # the file does not hold these bytes: the prefix ends before them
        elif self.hashed is not None:
            self.hashed.state.update(view)
            self.hashed.upto += len(view)
        self.done += len(view)

    def receive(self, sock: int, count: int) -> None:
        """`count` bytes from the (non-blocking) socket, in a worker thread."""
        buf = self.conn.buffer
        view = memoryview(buf)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        listener = self.conn.listener
        # woken only once RECEIVE_LOWAT bytes (or the frame's rest) are in: a receiver that keeps up with its owner
        # would otherwise wake per TCP segment, and at a few KiB per recv + hash + pwrite it spent 4x the CPU per GiB
        # on these shared cores (measured: 3.1 s against 0.7 for 1 GiB), slowing the owner it waits for
        lowat = 0
        try:
            while count > 0:
                if lowat != min(RECEIVE_LOWAT, count):
                    lowat = min(RECEIVE_LOWAT, count)
                    _set_rcvlowat(sock, lowat)
                try:
                    n = _recv_into(sock, view, min(len(view), count))
                except BlockingIOError:
                    silent_since = time.monotonic()
                    while not poller.poll(STOP_POLL_MS):
                        if listener.stopping.is_set():
                            raise _Stopping from None
                        if time.monotonic() - silent_since >= listener.timeout:
                            raise trio.TooSlowError from None
                    continue
                except InterruptedError:
                    continue
                if not n:
                    raise WireError("connection closed mid-frame")
                self.put(view[:n])
                count -= n
        finally:
            if lowat > 1:
                _set_rcvlowat(sock, 1)  # the event loop reads the next frame's header, however small


class _Decrypting:
    """peer_encryption: a WRITE frame's data as it arrives (any split), opened chunk by chunk (wire.Session.open_chunk:
    a chunk that fails its tag drops the connection) into the replica's sink. `done` counts wire bytes."""

    def __init__(self, sink: _Sink, session: Session, wire: int) -> None:
        self.sink, self.session, self.conn = sink, session, sink.conn
        self.number = session.received_number  # the WRITE frame being read: its chunks' nonces name it
        self.pending = bytearray()
        self.left = wire  # wire bytes of the chunks not yet opened
        self.index = 0
        self.done = 0

    def put(self, view: memoryview) -> None:
        self.done += len(view)
        self.pending += view
        while self.pending:
            need = min(ENC_CHUNK + GCM_TAG, self.left)
            if len(self.pending) < need:
                return
            plain = self.session.open_chunk(self.number, self.index, bytes(self.pending[:need]))
            del self.pending[:need]
            self.left -= need
            self.index += 1
            self.sink.put(memoryview(plain))

    receive = _Sink.receive  # the same socket loop, feeding this put


def _set_rcvlowat(sock: int, lowat: int) -> None:
    """Best effort: a connection that failed says so at its next read, not here."""
    s = socket.socket(fileno=sock)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
    except OSError:
        pass
    finally:
        s.detach()  # the fd stays the connection's


def _recv_into(sock: int, view: memoryview, n: int) -> int:
    return os.readv(sock, [view[:n]])


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


async def _refuse(stream: trio.SocketStream, reader: Reader, session: Session, why: str, timeout: float,
                  error: str = "refused", first: Frame | None = None) -> None:
    """Tell an owner whose replicas this node does not take why, at its first request (a sender's first frame is
    HOLDINGS), then close: its link fails with that message and the owner degrades or fails (`on_no_peer`); with
    `error` busy, it tries its next candidate. `first`: a frame already read (its data still to be read off)."""
    with trio.move_on_after(timeout):
        try:
            while True:
                frame = first if first is not None else await session.receive(reader, META_MAX)
                first = None
                left = frame.data_length  # a write already on its way: read off and discarded, up to REFUSED_BYTES
                if left > REFUSED_BYTES:
                    return
                while left:
                    left -= len(await reader.exactly(min(left, WRITE_BUFFER)))
                if "id" in frame.meta:
                    message = f"replicas refused: {why}" if error == "refused" else why
                    await stream.send_all(session.encode(Kind.ERROR, {"id": int(frame.meta["id"]), "error": error,
                                                                       "message": message}))
                    return
        except (WireError, ValueError, TypeError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
