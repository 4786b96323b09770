"""The drain's fence (Drainer(gate=...); with durability = peer the gate is peers.Membership.admit): while the gate
is closed the drain sends nothing that writes to the bucket, except the requests already past it; opened, it
finishes every file as if nothing happened. Against the in-memory store (tests/support/memstore.py); the fence's
reason to close (a lease lost, a takeover) is tested in test_peers_membership.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio

from ckptfs.journal import ROOT_INODE
from tests.support.memstore import MemoryStore
from tests.unit.test_drain_faults import BOUND, PART, drainer, durable, namespace, sha
from tests.unit.test_journal import write_file

WRITES = ("put_object", "put_object_body", "create_multipart", "upload_part", "complete", "copy", "delete", "put_marker")


class Gate:
    """A gate a test opens and closes; counts the requests waiting at it."""

    def __init__(self) -> None:
        self.is_open = True
        self._opened = trio.Event()
        self.waiting = 0

    async def __call__(self) -> None:
        while not self.is_open:
            self.waiting += 1
            try:
                await self._opened.wait()
            finally:
                self.waiting -= 1

    def close(self) -> None:
        self.is_open = False
        self._opened = trio.Event()

    def open(self) -> None:
        self.is_open = True
        self._opened.set()


def writes(store: MemoryStore) -> int:
    return sum(len(store.calls.get(op, [])) for op in WRITES)


async def until(check, what: str) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(BOUND):
        while not check():
            await trio.sleep(0.005)


def test_a_closed_gate_stops_a_multipart_upload_after_the_part_in_flight(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    data = os.urandom(4 * PART - 3)
    ino = write_file(ns, ROOT_INODE, "big.bin", data)
    store.hang("upload_part", skip=1)  # one part goes through; the second is in flight when the gate closes
    gate = Gate()
    d = drainer(ns, store)
    d.gate = gate

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(d.run)
            await until(store.hung("upload_part").is_set, "part 2 in flight")
            gate.close()
            store.release()
            await until(lambda: gate.waiting > 0, "the next part waiting at the gate")
            await until(lambda: ns.journal.upload_of(ino) is not None and len(ns.journal.upload_of(ino).parts) == 2,  # type: ignore[union-attr]
                        "part 2 recorded")
            sent = [c[2] for c in store.calls["upload_part"]]
            assert len(sent) == 2, "only the part already in flight may reach the store once the gate is closed"
            assert "complete" not in store.calls and "p/big.bin" not in store.objects
            assert not durable(ns, ino)
            gate.open()
            await until(lambda: durable(ns, ino), "durable once the gate opens")
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert sha(store.objects["p/big.bin"].body) == sha(data)
    assert sorted(c[2] for c in store.calls["upload_part"]) == [1, 2, 3, 4]  # each part once
    assert len(store.calls["create_multipart"]) == 1


def test_a_closed_gate_holds_small_puts_deletes_copies_and_markers(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    old = write_file(ns, ROOT_INODE, "old.bin", b"old bytes")
    moved = write_file(ns, ROOT_INODE, "moved.bin", b"bytes moved by a rename")
    gate = Gate()
    d = drainer(ns, store)
    d.gate = gate

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(d.run)
            await until(lambda: durable(ns, old) and durable(ns, moved), "both durable")
            before = writes(store)
            gate.close()
            ns.tree.unlink(ROOT_INODE, "old.bin")  # a delete
            ns.tree.rename(ROOT_INODE, "moved.bin", ROOT_INODE, "renamed.bin", False)  # a copy (then a delete)
            new = write_file(ns, ROOT_INODE, "new.bin", b"new small file")  # a PutObject
            ns.tree.mkdir(ROOT_INODE, "empty", 0o755, 0, 0)  # a `dir/` marker
            d.wake()
            await until(lambda: gate.waiting >= 4, "four requests waiting at the gate")
            assert writes(store) == before, "nothing may be sent while the gate is closed"
            assert "p/old.bin" in store.objects and "p/new.bin" not in store.objects and "p/renamed.bin" not in store.objects
            gate.open()
            await until(lambda: durable(ns, new) and durable(ns, moved) and "p/empty/" in store.objects
                        and "p/old.bin" not in store.objects and "p/moved.bin" not in store.objects, "all done")
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert store.objects["p/new.bin"].body == b"new small file"
    assert store.objects["p/renamed.bin"].body == b"bytes moved by a rename"

