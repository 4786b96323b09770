"""The owner's side of one connection to a peer (docs/peers.md): what the sender streams, and the waits for the
peer's acknowledgements.

Frames are pipelined: `entry`, `write`, `truncate`, `forget`, `delete` go out without waiting; the peer
applies them in order, so a `seal` or `barrier` answered means everything sent before it was applied. A
failure of a pipelined frame on the peer (its capacity, its disk) is answered at the file's seal (or at the
next barrier). Data bytes go with `os.sendfile` from the cache file straight to the socket: they never
pass through Python.

A link that lost its connection, timed out (`peer_timeout` without progress on a send, or without an
answer to a seal, barrier or holdings), or was cancelled mid-frame is broken: every later call raises
PeerError and the sender opens a new link (or takes the next candidate).

A peer that dies silently (power lost: no FIN, no RST; or its daemon stopped) must be noticed even when
nothing is being sent to it, or the owner goes on counting files `replicated` on a disk nobody will ever
read again. Two things notice it, both within `peer_timeout`: the connection's sockets (`tune_socket`, both
ends) have TCP keepalive and TCP_USER_TIMEOUT, so the kernel gives up on a host that stopped answering at all;
and `watch` sends a ping (a barrier the peer answers without an fsync) on a link idle for a quarter of
`peer_timeout`, to be answered within the rest of it, which also catches a daemon that stopped while its
kernel still acknowledges the TCP segments (SIGSTOP, a hung event loop).
"""

from __future__ import annotations

import errno
import os
import select
import socket
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import trio

from ..peering import PeerOptionError, parse_addr
from .sealhash import SealDigest
from .wire import (ENC_CHUNK, REPLY_META_MAX, Frame, Kind, PeerBusy, PeerError, PeerFull, PeerRefused, PeerUnreachable, Reader,
                   SealMismatch, Session, WireError, client_handshake, tune_socket, wire_length)

__all__ = ["Held", "PeerBusy", "PeerError", "PeerFull", "PeerLink", "PeerRefused", "PeerUnreachable", "SealMismatch", "tune_socket"]

SENDFILE_CHUNK = 8 << 20  # per worker thread call: what a cancel may have to wait for
ZEROS = bytes(1 << 16)
IDLE_FRACTION = 0.25  # of peer_timeout: a link with nothing sent or heard for this long is pinged (`watch`)


@dataclass
class Held:
    """What a peer holds of one of our files."""

    ino: int
    version: int
    size: int
    sealed: bool
    xxh3: str | None


class _Waiter:
    def __init__(self) -> None:
        self.reply: Frame | None = None


class PeerLink:
    node: str  # the peer's name

    def __init__(self, cfg: Any, node: str, addr: str, stream: trio.SocketStream, reader: Reader, session: Session) -> None:
        self.node, self.addr = node, addr
        self.timeout: float = cfg.peer_timeout
        self.stream, self.reader, self.session = stream, reader, session
        self.broken: str | None = None  # why the link can no longer be used
        self.connection_lost = False  # broken because the peer closed or reset the connection (not a timeout, not an answer)
        self.bytes_sent = 0  # data bytes (the files' bytes) sent
        self._send_lock = trio.StrictFIFOLock()
        self._read_lock = trio.Lock()
        self._waiters: dict[int, _Waiter] = {}
        self._next_id = 1
        self._active_at = trio.current_time()  # the last frame sent or heard (trio's clock: `watch`)
        self.pings = 0  # idle pings answered
        # set by the sender: awaited with the byte count of each chunk sent (peer_max_bandwidth, all links together)
        self.throttle: Callable[[int], Awaitable[None]] | None = None

    @classmethod
    async def open(cls, cfg: Any, me: str, incarnation: str, node: str, addr: str, secret: bytes, journal: str = "") -> "PeerLink":
        """Connect to `node` at `addr` and prove the secret both ways; PeerError (one line) otherwise."""
        where = f"peer {node} at {addr}"
        try:
            host, port = parse_addr(addr, "peer address")
        except PeerOptionError as e:
            raise PeerError(f"{where}: {e}") from None
        stream: trio.SocketStream | None = None
        try:
            with trio.fail_after(cfg.peer_timeout):
                stream = await trio.open_tcp_stream(host, port)
                stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
                tune_socket(stream.socket, cfg.peer_timeout)
                reader = Reader(stream)
                session = await client_handshake(stream, reader, secret, me, incarnation, node, journal,
                                                 getattr(cfg, "peer_encryption", "none"))
        except trio.TooSlowError:
            await _close(stream)
            raise PeerError(f"{where} did not answer within peer_timeout ({cfg.peer_timeout:g} s)") from None
        except WireError as e:
            await _close(stream)
            if str(e).startswith("connection closed"):
                raise PeerRefused(f"{where} refused the connection during the handshake (is peer_secret_file the same on both nodes?)") from None
            raise PeerRefused(f"{where} refused: {e}") from None
        except (OSError, trio.BrokenResourceError) as e:
            await _close(stream)
            why = f"{where} cannot be reached: {getattr(e, 'strerror', None) or e}"
            raise (PeerUnreachable(why) if stream is None else PeerError(why)) from None
        except BaseException:
            await _close(stream)
            raise
        return cls(cfg, node, addr, stream, reader, session)

    # -- pipelined frames ------------------------------------------------------------------------------

    async def entry(self, ino: int, meta: dict[str, Any]) -> None:
        """Upsert a file's metadata on the peer (see the design: key, version, size, copy_from, marker, seq, ...)."""
        await self._send(Kind.ENTRY, {"ino": ino, "meta": meta})

    async def write(self, ino: int, fd: int, offset: int, length: int) -> None:
        """`length` bytes of our cache file `fd` at `offset`, sent by sendfile. A file shorter than that (truncated
        meanwhile) is sent padded with zeros: the seal's size and xxh3 tell the truth."""
        if length > 0:
            await self._send(Kind.WRITE, {"ino": ino, "offset": offset}, fd, offset, length)

    async def truncate(self, ino: int, size: int) -> None:
        await self._send(Kind.TRUNCATE, {"ino": ino, "size": size})

    async def forget(self, ino: int, version: int | None) -> None:
        """The file is durable at `version` (or removed: None): the peer drops its replica unless it holds a newer one."""
        await self._send(Kind.FORGET, {"ino": ino, "version": version})

    async def delete(self, op_id: int, key: str, seq: int, after_ino: int | None = None, etag: str | None = None) -> None:
        """An object delete the owner queued; `after_ino`: the file it waits for (a rename: the old key goes once the
        file is durable under its new one), so a takeover applies it only then; `etag`: the object it removes (a
        takeover's delete is conditional on it: another node's object written at the key since stays)."""
        meta: dict[str, Any] = {"op_id": op_id, "key": key, "seq": seq}
        if after_ino is not None:
            meta["after_ino"] = after_ino
        if etag:
            meta["etag"] = etag
        await self._send(Kind.DELETE, meta)

    async def delete_done(self, op_id: int) -> None:
        await self._send(Kind.DELETE_DONE, {"op_id": op_id})

    # -- answered -----------------------------------------------------------------------------------------

    async def seal(self, ino: int, version: int, size: int, digest: SealDigest | str) -> None:
        """Wait until the peer applied every earlier frame of the file, fsynced its data and index and found the
        same xxh3-128 and BLAKE3 in its copy. SealMismatch (send the whole file again), PeerFull, PeerError. A bare
        xxh3 (no BLAKE3) is what an owner of an earlier release sends."""
        meta: dict[str, Any] = {"ino": ino, "version": version, "size": size}
        if isinstance(digest, SealDigest):
            meta.update(xxh3=digest.xxh3, blake3=digest.blake3)
        else:
            meta["xxh3"] = digest
        await self._request(Kind.SEAL, meta)

    async def barrier(self) -> None:
        """Wait until everything sent before is applied (a failed delete is raised here)."""
        await self._request(Kind.BARRIER, {})

    async def ping(self, within: float) -> None:
        """The peer is there: a barrier it answers at once (no fsync, a failed delete kept for the next real barrier),
        within `within` seconds of being sent; PeerError otherwise (the link is broken)."""
        await self._request(Kind.BARRIER, {"ping": True}, within=within)
        self.pings += 1

    def idle_for(self) -> float:
        """Seconds since the last frame sent or heard; 0 while a frame is being sent or an answer awaited (each of
        those has its own peer_timeout)."""
        if self._send_lock.locked() or self._waiters:
            return 0.0
        return max(0.0, trio.current_time() - self._active_at)

    async def watch(self) -> None:
        """Until the link breaks: a link idle for a quarter of peer_timeout is pinged, the answer awaited for the rest
        of it, so a peer that died silently while nothing was sent to it is noticed within peer_timeout (raises
        PeerError). A busy link is not pinged: its sends and answers time out by themselves."""
        every = self.timeout * IDLE_FRACTION
        while True:
            self._check()
            idle = self.idle_for()
            if idle < every:
                await trio.sleep(every - idle if idle > 0 else every)
                continue
            await self.ping(self.timeout - every)

    async def holdings(self, insist: bool = False) -> dict[int, Held]:
        """What the peer holds of our files (at connect: sealed ones need not be sent again). PeerBusy: it takes as
        many owners as its share allows (peers/spread.py); `insist`: every other candidate said so, take us anyway."""
        reply = await self._request(Kind.HOLDINGS, {"may_redirect": True, "insist": insist})
        out: dict[int, Held] = {}
        for h in reply.meta.get("held", []):
            out[int(h["ino"])] = Held(int(h["ino"]), int(h["version"]), int(h["size"]), bool(h["sealed"]), h.get("xxh3"))
        return out

    async def aclose(self) -> None:
        if self.broken is None:
            self.broken = f"the link to peer {self.node} is closed"
        await _close(self.stream)

    # -- the connection -----------------------------------------------------------------------------------

    def _check(self) -> None:
        if self.broken is not None:
            raise PeerError(self.broken)

    def _break(self, why: str, lost: bool = False) -> PeerError:
        if self.broken is None:
            self.broken = f"peer {self.node} at {self.addr}: {why}"
            self.connection_lost = lost
        return PeerError(self.broken)

    async def _send(self, kind: Kind, meta: dict[str, Any], fd: int = -1, offset: int = 0, length: int = 0) -> None:
        self._check()
        async with self._send_lock:
            self._check()
            encrypted = bool(length) and self.session.aead is not None
            head = self.session.encode(kind, meta, wire_length(length) if encrypted else length)
            try:
                with trio.fail_after(self.timeout):
                    await self.stream.send_all(head)
                if encrypted:
                    await self._send_encrypted(fd, offset, length)
                elif length:
                    await self._sendfile(fd, offset, length)
                self._active_at = trio.current_time()
            except trio.TooSlowError:
                raise self._break(f"no progress sending for peer_timeout ({self.timeout:g} s)") from None
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
                raise self._break(f"connection lost ({getattr(e, 'strerror', None) or e or type(e).__name__})", lost=_reset(e)) from None
            except BaseException:
                self._break("cancelled in the middle of a frame")  # the stream is out of step: never used again
                raise

    async def _sendfile(self, fd: int, offset: int, length: int) -> None:
        """Our file's bytes straight from the page cache to the socket, by a worker thread SENDFILE_CHUNK at a
        time: its own poll loop waits for room in the socket, so the event loop is not woken a thousand times per
        GiB (measured: about 0.25 s CPU per GiB against 0.4 from the event loop), and a cache file read from the
        disk does not stall it. A cancel waits for at most one chunk; each wait for room is bounded by
        peer_timeout."""
        out = self.stream.socket.fileno()
        timeout_ms = max(1, int(self.timeout * 1000))

        def send_chunk(offset: int, count: int) -> int:
            poller = select.poll()
            poller.register(out, select.POLLOUT)
            sent = 0
            while sent < count:
                try:
                    n = os.sendfile(out, fd, offset + sent, count - sent)
                except BlockingIOError:
                    if not poller.poll(timeout_ms):
                        raise trio.TooSlowError from None
                    continue
                except InterruptedError:
                    continue
                if n == 0:  # the file ended early
                    break
                sent += n
            return sent

        end = offset + length
        while offset < end:
            n = await trio.to_thread.run_sync(send_chunk, offset, min(SENDFILE_CHUNK, end - offset))
            if n == 0:  # the file ended before `end` (truncated meanwhile): the frame promised the bytes
                await self._send_zeros(end - offset)
                self.bytes_sent += end - offset
                return
            offset += n
            self.bytes_sent += n
            if self.throttle is not None:
                await self.throttle(n)  # after the bytes went: a debt the throttle makes us wait off

    async def _send_encrypted(self, fd: int, offset: int, length: int) -> None:
        """peer_encryption: our file's bytes read by a worker thread ENC_CHUNK at a time, each chunk sealed with
        AES-GCM (wire.Session.seal_chunk) and sent; a file shorter than promised (truncated meanwhile) is sent as
        zeros past its end, as `_sendfile` does. No sendfile: every byte goes through this process."""
        number = self.session.sent_number  # the WRITE frame just encoded: its chunks' nonces name it
        buffer = bytearray(ENC_CHUNK)

        def seal(at: int, count: int, index: int) -> bytes:
            view = memoryview(buffer)[:count]
            got = 0
            while got < count:
                n = os.preadv(fd, [view[got:]], at + got)
                if n == 0:
                    view[got:] = bytes(count - got)  # the file ended early
                    break
                got += n
            return self.session.seal_chunk(number, index, view)

        done = index = 0
        while done < length:
            count = min(ENC_CHUNK, length - done)
            sealed = await trio.to_thread.run_sync(seal, offset + done, count, index)
            with trio.fail_after(self.timeout):
                await self.stream.send_all(sealed)
            done += count
            index += 1
            self.bytes_sent += count
            if self.throttle is not None:
                await self.throttle(count)

    async def _send_zeros(self, count: int) -> None:
        while count:
            chunk = ZEROS[:min(count, len(ZEROS))]
            with trio.fail_after(self.timeout):
                await self.stream.send_all(chunk)
            count -= len(chunk)

    async def _request(self, kind: Kind, meta: dict[str, Any], within: float | None = None) -> Frame:
        """Send a request and wait for its answer (`within`, by default peer_timeout, after it was sent). Whoever
        waits reads the connection for everybody: answers come in the order of the requests."""
        request = self._next_id
        self._next_id += 1
        waiter = self._waiters[request] = _Waiter()
        try:
            await self._send(kind, {**meta, "id": request})
            wait = self.timeout if within is None else within
            with trio.move_on_after(wait) as scope:
                while waiter.reply is None:
                    self._check()
                    async with self._read_lock:
                        if waiter.reply is not None:
                            break
                        self._check()
                        await self._read_one()
            if scope.cancelled_caught:
                raise self._break(f"no answer within peer_timeout ({self.timeout:g} s)" if within is None else
                                  f"no answer to a ping within {wait:g} s (the link idle; peer_timeout {self.timeout:g} s)")
        finally:
            self._waiters.pop(request, None)
        reply = waiter.reply
        assert reply is not None
        if reply.kind is Kind.ERROR:
            message = f"peer {self.node}: {reply.meta.get('message', 'refused')}"
            error = reply.meta.get("error")
            if error == "full":
                raise PeerFull(message)
            if error == "busy":
                raise PeerBusy(message)
            if error == "mismatch":
                raise SealMismatch(message)
            raise PeerError(message)
        return reply

    async def _read_one(self) -> None:
        try:
            frame = await self.session.receive(self.reader, REPLY_META_MAX)
        except WireError as e:
            raise self._break(str(e), lost=str(e).startswith("connection closed")) from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            raise self._break(f"connection lost ({getattr(e, 'strerror', None) or e or type(e).__name__})", lost=_reset(e)) from None
        if frame.kind not in (Kind.ACK, Kind.ERROR, Kind.HELD):
            raise self._break(f"unexpected frame {frame.kind.name} from the peer")
        self._active_at = trio.current_time()
        waiter = self._waiters.get(int(frame.meta.get("id", -1)))
        if waiter is not None:
            waiter.reply = frame


GONE = (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)


async def answers_as(addr: str, node: str, secret: bytes, me: str, incarnation: str, journal: str, timeout: float,
                     encryption: str = "none") -> bool:
    """A daemon at `addr` completes the handshake as node `node` within `timeout`: it holds the secret and is alive.
    Membership asks it of the address a live record with this node's own name announces (another mount with the
    same node_name, refused at mount); the probe sends nothing after the handshake."""
    try:
        host, port = parse_addr(addr, "peer address")
    except PeerOptionError:
        return False
    stream: trio.SocketStream | None = None
    try:
        with trio.move_on_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            await client_handshake(stream, Reader(stream), secret, me, incarnation, node, journal, encryption)
            return True
        return False
    except (WireError, OSError, trio.BrokenResourceError):
        return False
    finally:
        await _close(stream)


def _reset(e: BaseException) -> bool:
    """The peer closed or reset the connection (its listener restarted: worth connecting again at once), rather than
    the kernel giving up on a host that stopped answering (keepalive, TCP_USER_TIMEOUT: ETIMEDOUT), which a new
    connection would only wait on for another peer_timeout."""
    cause = e.__cause__ or e.__context__ if not isinstance(e, OSError) else e
    return not (isinstance(cause, OSError) and cause.errno in GONE)


async def _close(stream: trio.SocketStream | None) -> None:
    if stream is not None:
        with trio.CancelScope(shield=True):
            await stream.aclose()
