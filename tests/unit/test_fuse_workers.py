"""The copy workers' own logic (gateway/fuse/workers.py) without FUSE: which requests a worker serves
itself, `fuse_workers` resolved, and the dispatch over a SOCK_SEQPACKET pair standing in for a /dev/fuse
descriptor (one read, one request; one write, one reply)."""

from __future__ import annotations

import os
import socket
from typing import Any

import trio

from ckptfs.fuse import abi
from ckptfs.fuse.messages import Request
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

    def wrote(self, ino: int, offset: int, lent: int, written: int, error: int) -> None:
        self.lent -= lent
        self.used += written
        self.wrote_calls.append((ino, offset, lent, written, error))

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
