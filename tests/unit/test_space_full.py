"""When a writer waits for room and when it gets ENOSPC at once (issue 34 item 2): backpressure only while the
drain can still free something."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
import trio.testing

from ckptfs.cache import CacheFull
from ckptfs.journal import DURABLE, ROOT_INODE
from ckptfs.namespace import Namespace
from tests.unit.test_journal import make_ns, write_file

MiB = 1 << 20


def small_cache(tmp_path: Path) -> Namespace:
    ns = make_ns(tmp_path, write_stall_timeout=600)
    ns.cache.capacity_bytes = 2 * MiB
    ns.cache.min_free = 0
    return ns


def test_a_write_with_nothing_to_drain_gets_enospc_without_waiting(tmp_path: Path) -> None:
    ns = small_cache(tmp_path)
    row = ns.tree.create(ROOT_INODE, "big.bin", 0o644, 0, 0)
    fd = ns.files.open(row.ino, write=True)

    async def main() -> None:
        await ns.space.when_room(lambda: ns.files.write(row.ino, fd, 0, b"a" * MiB), row.ino)
        # the writer's own dirty bytes cannot be drained while it writes: nothing else is on its way out
        with pytest.raises(CacheFull):
            await ns.space.when_room(lambda: ns.files.write(row.ino, fd, MiB, b"b" * (2 * MiB)), row.ino)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # a wait would be jumped over, and counted
    os.close(fd)
    s = ns.space.stats()
    assert s["enospc_total"] == 1
    assert s["write_stalls_total"] == 0  # refused at once: write_stall_timeout (600 s) was not waited out


def test_a_write_waits_while_a_closed_file_drains_and_goes_on_once_it_is_durable(tmp_path: Path) -> None:
    ns = small_cache(tmp_path)
    closed = write_file(ns, ROOT_INODE, "closed.bin", b"c" * (3 * MiB // 2))  # dirty, closed: the drain takes it
    row = ns.tree.create(ROOT_INODE, "next.bin", 0o644, 0, 0)
    fd = ns.files.open(row.ino, write=True)
    done: list[int] = []

    async def writer() -> None:
        done.append(await ns.space.when_room(lambda: ns.files.write(row.ino, fd, 0, b"n" * MiB), row.ino))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            assert ns.space.stalled_writers == 1 and not done  # waits: the drain can still free 1.5 MiB
            # the drain makes the closed file durable: its clean copy is evicted for the writer
            ns.journal.update(closed, state=DURABLE)
            ns.backlog.changed(closed)
            ns.space.freed()

    trio.run(main)
    os.close(fd)
    assert done == [MiB]
    s = ns.space.stats()
    assert s["enospc_total"] == 0 and s["write_stalls_total"] == 1 and s["evicted_files_total"] == 1
