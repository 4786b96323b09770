"""The copy workers' own logic (gateway/fuse/workers.py) without FUSE: which requests a worker serves
itself, `fuse_workers` resolved, and the dispatch over a SOCK_SEQPACKET pair standing in for a /dev/fuse
descriptor (one read, one request; one write, one reply)."""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

import trio

from ckptfs.fuse import abi
from ckptfs.fuse.messages import Request, reply_error
from ckptfs.fuse.ops import FastHandle, Operations
from ckptfs.fuse.workers import CopyWorkers, fast_args, worker_count
from tests.unit.test_fuse_protocol import request


def rw(fh: int, offset: int, size: int) -> bytes:
    return abi.RW_IN.pack(fh, offset, size, 0, 0, 0, 0)


def test_fast_args_only_whole_reads_and_writes() -> None:
    w = bytearray(request(abi.Op.WRITE, rw(3, 4096, 5) + b"hello", unique=9))
    assert fast_args(w, len(w)) == (abi.Op.WRITE, 9, 3, 4096, 5)
    assert fast_args(w, len(w) - 1) is None  # read short of its length
    short = bytearray(request(abi.Op.WRITE, rw(3, 0, 10) + b"hello", unique=9))
    assert fast_args(short, len(short)) is None  # payload shorter than it says: parsed, answered EIO
    r = bytearray(request(abi.Op.READ, rw(3, 0, 1 << 20), unique=11))
    assert fast_args(r, len(r)) == (abi.Op.READ, 11, 3, 0, 1 << 20)
    g = bytearray(request(abi.Op.GETATTR, b"\0" * 16, unique=12))
    assert fast_args(g, len(g)) is None


def test_worker_count() -> None:
    assert worker_count("auto", cores=2) == 2
    assert worker_count("auto", cores=32) == 8
    assert worker_count("auto", cores=1) == 1
    assert worker_count("3") == 3
    assert worker_count("auto") >= 1


class Ops(Operations):
    """Handle 1 writes into one file through the workers; handle 2 is not in the table (dispatched);
    room is lent up to `room` bytes."""

    def __init__(self, fd: int, room: int) -> None:
        self.fast_handles = {1: FastHandle(fd, 5, True, 1 << 30)}
        self.room = room
        self.lent = self.used = 0
        self.wrote_calls: list[tuple[int, int, int, int, int]] = []
        self.reads = 0

    def lend(self, want: int, need: int) -> int:
        n = min(want, self.room - self.lent - self.used)
        if n < need:
            return 0
        self.lent += n
        return n

    def repay(self, n: int) -> None:
        self.lent -= n

    def wrote(self, handle: FastHandle, offset: int, lent: int, written: int, error: int) -> None:
        self.lent -= lent
        self.used += written
        self.wrote_calls.append((handle.ino, offset, lent, written, error))

    def fast_reads(self, count: int, error: int = 0) -> None:
        self.reads += count


def test_dispatch_over_a_seqpacket_pair(tmp_path: Any) -> None:
    path = tmp_path / "cache"
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    kernel_side, daemon_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    daemon_side.setblocking(False)
    ops = Ops(fd, room=6)
    dispatched: list[tuple[int, bool, int]] = []

    async def main() -> None:
        workers: CopyWorkers

        def dispatch(req: Request, buf: bytearray | None, rfd: int) -> None:
            dispatched.append((req.opcode, buf is not None, rfd))
            if buf is not None:
                assert bytes(req.args.data) == b"later"  # the payload stays valid in the handed-over buffer
                req.args = None
                workers.give_back(buf)

        workers = CopyWorkers(ops, [daemon_side.fileno()], 4096 + 64 * 1024, 64 * 1024, dispatch)

        def kernel() -> list[bytes]:
            replies = []
            for req, answered_by_worker in (
                    (request(abi.Op.WRITE, rw(1, 3, 5) + b"hello", unique=21), True),
                    (request(abi.Op.READ, rw(1, 0, 100), unique=22), True),  # 8 bytes there
                    (request(abi.Op.WRITE, rw(2, 0, 5) + b"later", unique=23), False),  # not in the table: dispatched with its buffer
                    (request(abi.Op.WRITE, rw(1, 8, 5) + b"later", unique=24), False),  # 1 byte of room left: dispatched
                    (request(abi.Op.READ, rw(9, 0, 100), unique=25), False),  # not in the table
                    (request(abi.Op.GETATTR, b"\0" * 16, unique=26), False)):  # never a worker's
                kernel_side.send(req)
                if answered_by_worker:
                    replies.append(kernel_side.recv(1 << 17))
            return replies

        async with trio.open_nursery() as nursery:
            nursery.start_soon(workers.run)
            with trio.fail_after(30):
                replies = await trio.to_thread.run_sync(kernel)
                while len(dispatched) < 4 or ops.lent:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()  # wakes the thread: run returns
        out_len, err, unique = abi.OUT_HEADER.unpack_from(replies[0])
        assert (err, unique) == (0, 21) and abi.WRITE_OUT.unpack_from(replies[0], abi.OUT_HEADER.size)[0] == 5
        out_len, err, unique = abi.OUT_HEADER.unpack_from(replies[1])
        assert (err, unique) == (0, 22) and replies[1][abi.OUT_HEADER.size:] == b"\0\0\0hello"

    trio.run(main)
    assert ops.wrote_calls == [(5, 3, 5, 5, 0)]  # accounted on the trio thread, on lent room
    assert ops.lent == 0 and ops.reads == 1  # what was lent and not used came back when idle
    fd_ = daemon_side.fileno()
    assert dispatched == [(abi.Op.WRITE, True, fd_), (abi.Op.WRITE, True, fd_), (abi.Op.READ, False, fd_), (abi.Op.GETATTR, False, fd_)]
    with open(path, "rb") as f:
        assert f.read() == b"\0\0\0hello"
    os.close(fd)
    kernel_side.close()
    daemon_side.close()


def serve_with_workers(ops: Operations, fd_count: int, requests: list[bytes], replies_wanted: int,
                       dispatch: Any = None, max_in_flight: int = 32, until: Any = None) -> list[bytes]:
    """Run CopyWorkers on one end of a SOCK_SEQPACKET pair, send `requests` from the other end and
    collect `replies_wanted` replies (then wait for `until()`, if given)."""
    kernel_side, daemon_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    daemon_side.setblocking(False)
    out: list[bytes] = []

    async def main() -> None:
        workers = CopyWorkers(ops, [daemon_side.fileno()], 4096 + 64 * 1024, 64 * 1024,
                              dispatch or (lambda req, buf, rfd: None), max_in_flight=max_in_flight)

        def kernel() -> None:
            for req in requests:
                kernel_side.send(req)
            for _ in range(replies_wanted):
                out.append(kernel_side.recv(1 << 17))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(workers.run)
            with trio.fail_after(30):
                await trio.to_thread.run_sync(kernel)
                while until is not None and not until(workers):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        kernel_side.close()
        daemon_side.close()
    return out


def test_an_accounting_error_answers_the_write_with_its_errno(tmp_path: Any) -> None:
    """The bytes were written but the trio thread could not account them: the WRITE must fail, not succeed
    with an error only in the log (a write answered 5 bytes written would be one the journal never saw)."""
    fd = os.open(tmp_path / "cache", os.O_CREAT | os.O_RDWR)

    class Failing(Ops):
        def wrote(self, handle: FastHandle, offset: int, lent: int, written: int, error: int) -> None:
            super().wrote(handle, offset, lent, written, error)
            if offset == 0:
                raise OSError(errno.ENOSPC, "journal full")
            raise RuntimeError("a bug")

    ops = Failing(fd, room=1 << 20)
    replies = serve_with_workers(ops, 1, [request(abi.Op.WRITE, rw(1, 0, 5) + b"hello", unique=31),
                                          request(abi.Op.WRITE, rw(1, 5, 5) + b"world", unique=32)], 2)
    answers = sorted(abi.OUT_HEADER.unpack_from(r)[1:] for r in replies)
    assert answers == sorted([(-errno.EIO, 32), (-errno.ENOSPC, 31)])
    assert ops.fast_handles[1].writes_in_flight == 0  # both accounted (and failed)
    os.close(fd)


def test_a_withdrawn_handle_goes_the_ordinary_way(tmp_path: Any) -> None:
    """A handle taken off the fast path (its file about to be durable, setuid/setgid to drop) is never
    written by a worker, even one that found it in the table."""
    fd = os.open(tmp_path / "cache", os.O_CREAT | os.O_RDWR)
    ops = Ops(fd, room=1 << 20)
    ops.fast_handles[1].withdraw()
    dispatched: list[int] = []

    def dispatch(req: Request, buf: bytearray | None, rfd: int) -> None:
        dispatched.append(req.unique)
        os.write(rfd, b"".join(bytes(p) for p in reply_error(req.unique, errno.EROFS)))

    replies = serve_with_workers(ops, 1, [request(abi.Op.WRITE, rw(1, 0, 5) + b"hello", unique=41)], 1, dispatch=dispatch)
    assert dispatched == [41] and ops.wrote_calls == []
    assert abi.OUT_HEADER.unpack_from(replies[0])[1:] == (-errno.EROFS, 41)
    assert os.pread(fd, 5, 0) == b""
    os.close(fd)


def test_writes_handed_over_hold_at_most_max_in_flight_buffers(tmp_path: Any) -> None:
    """WRITEs the trio thread answers keep their buffer until handled; while writers wait for room
    they pile up: a worker must wait for a buffer to come back, not allocate one per request."""
    ops = Ops(-1, room=0)  # handle 2 is not in the table: every WRITE is handed over
    held: list[tuple[Request, bytearray]] = []

    def dispatch(req: Request, buf: bytearray | None, rfd: int) -> None:
        assert buf is not None
        held.append((req, buf))

    sent = [request(abi.Op.WRITE, rw(2, i, 5) + b"12345", unique=50 + i) for i in range(6)]
    seen: list[int] = []

    def two_held_then_release(workers: CopyWorkers) -> bool:
        seen.append(len(held))
        if len(seen) < 30:
            return False  # let the worker read on if it could
        while held:
            req, buf = held.pop()
            req.args = None
            workers.give_back(buf)
            seen.append(-1)
        return len([s for s in seen if s == -1]) >= 6

    serve_with_workers(ops, 1, sent, 0, dispatch=dispatch, max_in_flight=2, until=two_held_then_release)
    assert max(seen) == 2  # never more than max_in_flight held by handed-over WRITEs
    assert seen.count(-1) == 6  # and every one was handed over once buffers came back
