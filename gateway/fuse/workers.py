"""The kernel transport's copy workers: the bytes of READ and WRITE moved on several cores.

Why: without passthrough every byte a trainer writes passes through the daemon. Read from
/dev/fuse, written into the cache file and answered on the trio thread, a 1 MiB WRITE costs two
copies on one core, and the trio thread's Python work sits between them. The copying system calls
release the GIL, so made in threads they run on as many cores as there are threads.

How: `workers` threads, each on its own /dev/fuse descriptor (the first is the mount's own, the
others clones of it, FUSE_DEV_IOC_CLONE: the kernel hands each request to one reader, and a reply
must go to the descriptor its request came from). Each thread reads requests into its own buffer
and answers two kinds itself, without waiting for the trio thread:
- WRITE of a handle in `ops.fast_handles` (the table of copy-mode handles the trio thread alone
  changes; a write handle is there only while its file is dirty in the journal, so no journal write
  has to come before the bytes change): the pwrite into the cache file, then the accounting and the
  reply posted to the trio thread (`ops.wrote`: size, version, cache bytes, all namespace state
  changes there; an error in it answers the WRITE with its errno, EIO if it has none). The worker
  goes on to its next request at once: no round trip. The room it writes into was lent beforehand
  (`ops.lend`, LEND bytes at a time: the one wait for the trio thread, every few MiB); without room,
  or a handle withdrawn meanwhile (`FastHandle.admit_write`), the WRITE goes the ordinary way
  (backpressure, ENOSPC). What a thread has not used goes back (`ops.repay`) whenever it finds no
  request waiting.
- READ of a handle in the table: the pread into the thread's reply buffer and the reply.
Anything else (and a WRITE or READ of a handle not in the table) is parsed here and handed to the
trio thread (`dispatch`), which runs it in a task of its own as the single reader did (INTERRUPT,
EINTR, undo) and answers it on the same descriptor. A WRITE handed over keeps its buffer (its payload
is a view of it) until its task ends: at most `max_in_flight` such buffers at once; a worker that needs
another waits for one to come back. `ops.wrote` and `dispatch` go through one FIFO queue
(`TrioToken.run_sync_soon`), and the reply goes out after `wrote`: whatever the kernel asks after a
reply (GETATTR, FSYNC, RELEASE) is handled after the write was accounted.

Structure: `CopyWorkers.run` is a task of the session's nursery; each thread runs inside
`trio.to_thread.run_sync` on a limiter of its own (not abandoned). Descriptors are non-blocking and
each thread polls its own (epoll, EPOLLEXCLUSIVE: one worker woken per request) and a wake pipe: on cancellation (`stop`) the pipe wakes every thread,
and an unmount ends them with ENODEV; `run` returns once every thread has.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import select
import struct
import threading
from typing import Any, Callable

import trio

from . import abi
from .messages import ProtocolError, Request, encode_write, parse_header, parse_request, reply, reply_error
from .ops import FastHandle, Operations

log = logging.getLogger(__name__)

Parts = list[Any]
MAX_WORKERS = 64
AUTO_CAP = 8  # "auto": one per core, at most this many
LEND = 8 << 20  # room a worker asks the trio thread for at a time: one wait per 8 MiB written

_HDR = abi.IN_HEADER.size
_RW = abi.RW_IN.size  # fuse_read_in and fuse_write_in: the same 40 bytes since 7.9
_FIRST = struct.Struct("<IIQ")  # len opcode unique
_RW3 = struct.Struct("<QQI")  # fh offset size


def worker_count(setting: str | int, cores: int | None = None) -> int:
    """`fuse_workers` resolved: "auto" is one per core this process may run on, at most AUTO_CAP."""
    if setting == "auto":
        n = cores if cores is not None else len(os.sched_getaffinity(0))
        return max(1, min(AUTO_CAP, n))
    return max(1, min(MAX_WORKERS, int(setting)))


def clone(fd: int) -> int:
    """A new /dev/fuse descriptor on the connection of `fd` (non-blocking)."""
    new = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(new, abi.DEV_IOC_CLONE, struct.pack("<I", fd))
        os.set_blocking(new, False)
    except BaseException:
        os.close(new)
        raise
    return new


def send(fd: int, parts: Parts) -> bool:
    """Write one reply to `fd`; False if the kernel no longer wants it (interrupted, unmounted)."""
    try:
        os.writev(fd, parts)
        return True
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENODEV, errno.EBADF):
            log.error("reply to /dev/fuse failed: %s", e)
        return False


def parse_or_eio(view: memoryview, fd: int) -> Request | None:
    """The request in `view`; a malformed one is answered EIO on `fd` (if its header is whole) and None returned."""
    try:
        return parse_request(view)
    except ProtocolError as e:
        log.error("bad request from the kernel: %s", e)
        try:
            send(fd, reply_error(parse_header(view).unique, errno.EIO))
        except ProtocolError:
            pass
        return None


def fast_args(buf: bytearray, n: int) -> tuple[int, int, int, int, int] | None:
    """(opcode, unique, fh, offset, size) of a whole READ or WRITE in `buf[:n]` a worker may serve
    itself, None for anything else (pure: no state)."""
    if n < _HDR + _RW:
        return None
    length, opcode, unique = _FIRST.unpack_from(buf)
    if opcode != abi.Op.WRITE and opcode != abi.Op.READ or length > n:
        return None
    fh, offset, size = _RW3.unpack_from(buf, _HDR)
    if opcode == abi.Op.WRITE and _HDR + _RW + size > length:
        return None
    return opcode, unique, fh, offset, size


def _logged(fn: Callable[..., object], *args: Any) -> None:
    """Run a worker's call on the trio thread (`run_sync_soon`): an exception there would end the run."""
    try:
        fn(*args)
    except Exception:
        log.exception("copy worker: %s", getattr(fn, "__name__", fn))


class CopyWorkers:
    """The threads serving `fds` (the mount's own first). `dispatch(req, buf, fd)` runs on the trio
    thread: it answers `req` on `fd` in a task; `buf`, when given (a WRITE's payload is a view of it),
    comes back through `give_back` once handled: at most `max_in_flight` at once."""

    def __init__(self, ops: Operations, fds: list[int], buf_size: int, max_read: int,
                 dispatch: Callable[[Request, bytearray | None, int], None], max_in_flight: int = 32) -> None:
        self.ops = ops
        self.fds = fds
        self.buf_size = buf_size
        self.max_read = max_read
        self.dispatch = dispatch
        self._spare: list[bytearray] = []  # buffers handed back by requests served in tasks
        # WRITEs handed over with their buffer and not yet given back: each worker's own buffer plus
        # at most this many exist
        self._in_flight = threading.Semaphore(max(1, max_in_flight))
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._limiter = trio.CapacityLimiter(len(fds))
        fast = getattr(ops, "fast_handles", None)  # read here, changed on the trio thread (the same dict)
        self.fast: dict[int, FastHandle] = fast if fast is not None else {}
        self._token: trio.lowlevel.TrioToken | None = None

    def give_back(self, buf: bytearray) -> None:
        self._spare.append(buf)  # never more than max_in_flight + workers buffers exist
        self._in_flight.release()

    def _buffer(self) -> bytearray:
        try:
            return self._spare.pop()
        except IndexError:
            return bytearray(self.buf_size)

    async def run(self) -> None:
        """Serve until every thread has ended (unmounted) or until cancelled (then wake them all)."""
        self._token = trio.lowlevel.current_trio_token()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._wake_on_cancel)
                async with trio.open_nursery() as threads:
                    for fd in self.fds:
                        threads.start_soon(self._thread, fd)
                nursery.cancel_scope.cancel()
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)

    async def _wake_on_cancel(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.wake()

    def wake(self) -> None:
        """Make every thread return (at its next request or poll)."""
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    async def _thread(self, fd: int) -> None:
        try:
            await trio.to_thread.run_sync(self._serve, fd, limiter=self._limiter)
        finally:
            self.wake()  # one thread ending (unmounted, or an error) ends them all

    def _serve(self, fd: int) -> None:
        """One worker thread: read requests from `fd` until unmounted or woken."""
        buf = self._buffer()
        view = memoryview(buf)
        out = memoryview(bytearray(self.max_read))
        # every descriptor's poll waits on the connection's one queue: EPOLLEXCLUSIVE wakes one idle
        # worker per request, not all of them (the wake pipe wakes every one)
        poller = select.epoll()
        poller.register(fd, select.EPOLLIN | select.EPOLLEXCLUSIVE)
        poller.register(self._wake_r, select.EPOLLIN)
        assert self._token is not None
        post = self._token.run_sync_soon
        ops, fast = self.ops, self.fast
        lent = reads = 0  # room lent to this thread and not yet used; READs served, not yet counted
        try:
            while not self._stopping:
                try:
                    n = os.readv(fd, [buf])
                except BlockingIOError:  # idle: give back what it holds
                    if lent:
                        post(_logged, ops.repay, lent)
                        lent = 0
                    if reads:
                        post(_logged, ops.fast_reads, reads)
                        reads = 0
                    poller.poll()
                    continue
                except InterruptedError:
                    continue
                except OSError as e:
                    if e.errno == errno.ENOENT:  # interrupted before we read it
                        continue
                    if e.errno in (errno.ENODEV, errno.EBADF):
                        return  # unmounted
                    raise
                args = fast_args(buf, n)
                h = fast.get(args[2]) if args is not None else None
                if h is not None:
                    opcode, unique, _, offset, size = args  # type: ignore[misc]
                    if opcode == abi.Op.READ and size <= len(out):
                        reads += 1
                        self._read(fd, post, out, unique, h, offset, size)
                        continue
                    if opcode == abi.Op.WRITE and h.write and offset + size <= h.size_limit:
                        if lent < size:
                            lent += trio.from_thread.run_sync(ops.lend, LEND - lent, size - lent, trio_token=self._token)
                        if lent >= size and h.admit_write():
                            lent -= size
                            self._write(fd, post, view, unique, h, offset, size)
                            continue
                req = parse_or_eio(view[:n], fd)
                if req is None:
                    continue
                if req.opcode == abi.Op.WRITE:  # its payload is a view of `buf`: the task keeps it
                    if not self._in_flight.acquire(blocking=False):
                        if lent:  # waiting for a buffer may take long (writers waiting for room): give room back
                            post(_logged, ops.repay, lent)
                            lent = 0
                        if not self._wait_for_buffer():
                            return
                    post(_logged, self.dispatch, req, buf, fd)
                    buf = self._buffer()
                    view = memoryview(buf)
                else:
                    post(_logged, self.dispatch, req, None, fd)
        except trio.RunFinishedError:
            return
        finally:
            poller.close()
            if lent or reads:
                try:
                    post(_logged, ops.repay, lent)
                    post(_logged, ops.fast_reads, reads)
                except trio.RunFinishedError:
                    pass

    def _wait_for_buffer(self) -> bool:
        """Wait until a WRITE handed over gives its buffer back (max_in_flight reached); False if stopping."""
        while not self._stopping:
            if self._in_flight.acquire(timeout=0.2):
                return True
        return False

    def _write(self, fd: int, post: Any, view: memoryview, unique: int, h: FastHandle, offset: int, size: int) -> None:
        """An admitted WRITE: the pwrite here, the accounting and the reply on the trio thread."""
        start = _HDR + _RW
        written, error = 0, 0
        try:
            written = os.pwrite(h.fd, view[start:start + size], offset)
        except OSError as e:
            error = e.errno or errno.EIO
        post(self._account, fd, unique, h, offset, size, written, error)

    def _account(self, fd: int, unique: int, h: FastHandle, offset: int, lent: int, written: int, error: int) -> None:
        """On the trio thread: account a worker's pwrite, then answer the WRITE (its errno if either failed).
        Never raises: an exception here would end the trio run."""
        try:
            self.ops.wrote(h, offset, lent, written, error)
        except OSError as e:
            error = e.errno or errno.EIO
        except Exception:
            log.exception("copy worker: accounting a write")
            error = errno.EIO
        finally:
            h.write_accounted()
        send(fd, reply_error(unique, error) if error else reply(unique, encode_write(written)))

    def _read(self, fd: int, post: Any, out: memoryview, unique: int, h: FastHandle, offset: int, size: int) -> None:
        try:
            n = os.preadv(h.fd, [out[:size]], offset)
        except OSError as e:
            post(_logged, self.ops.fast_reads, 0, e.errno or errno.EIO)
            send(fd, reply_error(unique, e.errno or errno.EIO))
            return
        send(fd, reply(unique, out[:n]))
