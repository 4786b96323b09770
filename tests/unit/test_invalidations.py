"""The listing merge tells every subscriber of the names it removed and the objects it replaced, and the daemon's
queue sends them to the kernel from a task of its own, never from the merge (which may run while a request on the
same directory waits for it), skipping what the kernel did not have cached."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import trio

from ckptfs.fuse.invalidations import Invalidations
from ckptfs.journal import ROOT_INODE
from ckptfs.objects import Listing, RemoteObject

from tests.unit.test_journal import make_ns


def test_the_merge_tells_every_subscriber_of_removed_names_and_replaced_objects(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    t0 = time.time()
    ns.merge.merge(ROOT_INODE, t0, Listing(["sub"], [RemoteObject("gone", 1, "e1", 1.0), RemoteObject("kept", 1, "e2", 1.0)], False))
    kept = ns.journal.resolve("kept")
    assert kept is not None
    removed: list[tuple[int, str]] = []
    replaced: list[int] = []
    also: list[tuple[int, str]] = []
    ns.merge.on_removed.append(lambda parent, name: removed.append((parent, name)))
    ns.merge.on_removed.append(lambda parent, name: also.append((parent, name)))  # a second one replaces nothing
    ns.merge.on_replaced.append(replaced.append)
    ns.merge.merge(ROOT_INODE, t0 + 1, Listing([], [RemoteObject("kept", 2, "e3", 2.0)], False))
    assert sorted(removed) == sorted(also) == [(ROOT_INODE, "gone"), (ROOT_INODE, "sub")]
    assert replaced == [kept.ino]
    assert ns.journal.resolve("gone") is None and ns.journal.resolve("kept").etag == "e3"  # type: ignore[union-attr]


def test_a_failing_subscriber_neither_undoes_the_merge_nor_silences_the_others(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    t0 = time.time()
    ns.merge.merge(ROOT_INODE, t0, Listing([], [RemoteObject("gone", 1, "e1", 1.0)], False))
    told: list[str] = []

    def broken(parent: int, name: str) -> None:
        raise RuntimeError("boom")

    ns.merge.on_removed += [broken, lambda parent, name: told.append(name)]
    ns.merge.merge(ROOT_INODE, t0 + 1, Listing([], [], False))
    assert told == ["gone"] and ns.journal.resolve("gone") is None


class FakeSession:
    """Records what the kernel is told; refuses `missing` as the kernel does a name it has not cached (ENOENT)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, int, bytes | None]] = []
        self.missing: set[int] = set()
        self.gate = trio.Event()

    async def invalidate_entry(self, parent: int, name: bytes) -> None:
        await self.gate.wait()  # the kernel waits for the directory's lock
        if parent in self.missing:
            raise OSError(errno.ENOENT, "not cached")
        self.told.append(("entry", parent, name))

    async def invalidate_inode(self, ino: int) -> None:
        await self.gate.wait()
        if ino in self.missing:
            raise OSError(errno.EINVAL, "refused")
        self.told.append(("inode", ino, None))


def test_invalidations_are_queued_without_waiting_and_sent_in_order_by_their_task() -> None:
    async def main() -> None:
        inval, session = Invalidations(), FakeSession()
        inval.entry(1, "before-the-mount")  # nothing cached yet: dropped
        async with trio.open_nursery() as nursery:
            await nursery.start(inval.run, session)
            session.missing = {7, 8}
            inval.entry(1, "a")  # returns at once although the session waits
            inval.entry(7, "not-cached")
            inval.inode(5)
            inval.inode(8)
            inval.entry(2, "b\udcff")  # a name that is not UTF-8 goes back as the bytes it was
            assert session.told == []
            session.gate.set()
            with trio.fail_after(10):  # a bound on a hang, not a measure: the outcome is checked below
                while inval.sent_total + inval.failed_total < 4:
                    await trio.sleep(0.01)
            await inval.stop()
            inval.entry(1, "after-the-stop")  # no one to tell: dropped
        assert session.told == [("entry", 1, b"a"), ("inode", 5, None), ("entry", 2, b"b\xff")]
        assert inval.sent_total == 3 and inval.failed_total == 1  # ENOENT (nothing cached) is no failure

    trio.run(main)


def test_stop_waits_for_the_invalidation_in_flight() -> None:
    async def main() -> None:
        inval, session = Invalidations(), FakeSession()
        async with trio.open_nursery() as nursery:
            await nursery.start(inval.run, session)
            inval.entry(1, "a")
            await trio.sleep(0.05)  # the task took it and waits in the session

            async def open_gate_later() -> None:
                await trio.sleep(0.1)
                session.gate.set()

            nursery.start_soon(open_gate_later)
            await inval.stop()
            assert session.gate.is_set()  # stop returned only after the session call could end

    trio.run(main)


def test_delivered_waits_for_what_was_queued_before_it_and_no_longer_than_its_bound() -> None:
    async def main() -> None:
        inval, session = Invalidations(), FakeSession()
        async with trio.open_nursery() as nursery:
            await nursery.start(inval.run, session)
            await inval.delivered()  # nothing queued: at once
            inval.entry(1, "a")
            inval.entry(1, "b")
            waited: list[list[tuple[str, int, bytes | None]]] = []

            async def opendir() -> None:
                await inval.delivered(bound=60)
                waited.append(list(session.told))

            nursery.start_soon(opendir)
            await trio.sleep(0.05)
            assert waited == []  # the session has not taken them yet
            session.gate.set()
            with trio.fail_after(10):  # a bound on a hang
                while not waited:
                    await trio.sleep(0.01)
            assert waited == [[("entry", 1, b"a"), ("entry", 1, b"b")]]  # returned only once both were sent
            session.gate = trio.Event()  # the kernel holds the next one up (a lock held by a long request)
            inval.entry(1, "c")
            with trio.move_on_after(10) as guard:  # a bound on a hang, not a measure
                await inval.delivered(bound=0.1)  # gives up after its bound
            assert not guard.cancelled_caught and session.told[-1] == ("entry", 1, b"b")
            session.gate.set()
            await inval.stop()
            with trio.move_on_after(10) as guard:
                await inval.delivered(bound=60)  # stopped: nothing more will be sent, no wait
            assert not guard.cancelled_caught

    trio.run(main)
