"""A node back after a takeover (gateway/peers/reconcile.py), over a real journal and cache and the in-memory store:
what the taker uploaded becomes durable without an upload, only what nobody uploaded is uploaded (by the real drain
afterwards), nothing another node wrote meanwhile is overwritten or deleted. And the sweep drops replicas of durable
files (gateway/peers/sweep.py). Membership and the replica store are stand-ins (tests/support/fakepeers.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import trio
import xxhash

from ckptfs.journal import DIRTY, DURABLE, ROOT_INODE, UploadRecord
from ckptfs.peers.reconcile import Reconcile
from ckptfs.peers.sweep import Sweep
from ckptfs.upload import XXH3_META
from tests.support.replicas import hold, hold_delete, replica_store
from tests.support.memstore import MemoryStore, StoredObject
from tests.unit.test_drain_faults import PART, drain_until, drainer, namespace
from tests.unit.test_journal import write_file
from tests.unit.test_peers_takeover import PREFIX, TTL, config, member, record


def digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def test_a_returning_owner_uploads_only_what_nobody_did_and_overwrites_nothing(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    step = ns.tree.mkdir(ROOT_INODE, "step_3", 0o755, 0, 0)
    taken = os.urandom(4000)
    big = os.urandom(2 * PART + 5)
    nobody = os.urandom(3000)
    mine = b"this node's version, never uploaded"
    gone_data = b"deleted here, then the taker deleted it"
    f_taken = write_file(ns, step.ino, "taken.pt", taken)
    f_big = write_file(ns, step.ino, "big.pt", big)
    f_nobody = write_file(ns, step.ino, "nobody.pt", nobody)
    f_mine = write_file(ns, step.ino, "mine.pt", mine)
    prev = os.urandom(1500)
    f_prev = write_file(ns, step.ino, "prev.pt", prev)  # rewritten here after its previous version was uploaded
    # this node had started a multipart upload of big.pt before it was lost
    upload_id = store.create_multipart("p/step_3/big.pt", {XXH3_META: digest(big)})
    ns.journal.start_upload(UploadRecord(f_big, "p/step_3/big.pt", upload_id, PART, len(big), digest(big), time.time(), {}))
    ns.journal.queue_delete("p/step_3/old.pt")
    ns.journal.queue_delete("p/step_3/reused.pt")
    taken_over_at = time.time() + 1  # every change above came before the takeover
    # what the taker did, and what another node wrote after the takeover
    store.objects["p/step_3/taken.pt"] = StoredObject(taken, "e-taken", {XXH3_META: digest(taken)})
    store.objects["p/step_3/big.pt"] = StoredObject(big, "e-big-2", {XXH3_META: digest(big)})
    theirs = StoredObject(b"another node's file", "e-theirs", {XXH3_META: digest(b"another node's file")}, mtime=taken_over_at + 5)
    store.objects["p/step_3/mine.pt"] = theirs
    store.objects["p/step_3/prev.pt"] = StoredObject(b"its previous version", "e-prev", {}, mtime=time.time() - 600)
    reused = StoredObject(b"written at a deleted key", "e-reused", {}, mtime=taken_over_at + 5)
    store.objects["p/step_3/reused.pt"] = reused
    assert "p/step_3/old.pt" not in store.objects and gone_data

    # a (this node) went away; b took it over and is at it; then a comes back with its cache (a new incarnation)
    member(store, "a", time.time() - 10 * TTL)
    b = member(store, "b", taken_over_at)
    assert trio.run(b.claim, "a")
    a = member(store, "a", time.time(), incarnation="a-2")
    assert a.must_reconcile and a.fenced
    rec = Reconcile(ns.cfg, ns, store, a)

    async def main() -> object:
        async with trio.open_nursery() as nursery:
            done: list[object] = []

            async def reconcile() -> None:
                done.append(await rec.run())

            nursery.start_soon(reconcile)
            await trio.sleep(TTL)  # a asks every ttl/3
            assert not done and a.fenced, "reconciled before the taker was done"
            assert await b.mark_takeover_done("a")
            with trio.fail_after(30):
                while not done:
                    await trio.sleep(0.01)
        return done[0]

    report = trio.run(main)
    assert sorted(report.durable) == ["p/step_3/big.pt", "p/step_3/taken.pt"]  # type: ignore[attr-defined]
    assert sorted(report.left_to_drain) == ["p/step_3/nobody.pt", "p/step_3/prev.pt"]  # type: ignore[attr-defined]
    assert report.bucket_won == ["p/step_3/mine.pt"]  # type: ignore[attr-defined]
    assert sorted(report.deletes_dropped) == ["p/step_3/old.pt", "p/step_3/reused.pt"]  # type: ignore[attr-defined]
    assert not a.fenced and not a.must_reconcile and a.lease_valid()
    assert record(store, "a")["state"] == "live" and record(store, "a")["incarnation"] == a.incarnation != "a-2"
    assert store.uploads == {}, "the multipart upload of a file now durable was left in the bucket"
    for ino, key, data in ((f_taken, "p/step_3/taken.pt", taken), (f_big, "p/step_3/big.pt", big)):
        row = ns.journal.get(ino)
        assert row is not None and row.state == DURABLE and row.remote_key == key and row.xxh3 == digest(data)
        assert row.etag == store.objects[key].etag and ns.journal.upload_of(ino) is None
    row = ns.journal.get(f_mine)
    assert row is not None and row.state == DURABLE and row.cached == 0 and row.size == len(theirs.body)
    assert row.etag == "e-theirs" and not ns.cache.path(f_mine).exists(), "the local copy the bucket replaced is still read"
    assert ns.journal.get(f_nobody).state == DIRTY  # type: ignore[union-attr]

    # the drain afterwards: only what nobody uploaded goes out; nothing is overwritten or deleted
    before = {op: len(c) for op, c in store.calls.items()}
    d = drainer(ns, store)
    drain_until(d, lambda: all(ns.journal.get(i).state == DURABLE for i in (f_nobody, f_prev))  # type: ignore[union-attr]
                and not ns.journal.pending_deletes())
    puts = [c[0] for op in ("put_object", "put_object_body") for c in store.calls.get(op, [])[before.get(op, 0):]]
    assert sorted(puts) == ["p/step_3/nobody.pt", "p/step_3/prev.pt"]
    assert store.objects["p/step_3/prev.pt"].body == prev
    assert len(store.calls.get("create_multipart", [])) == before.get("create_multipart", 0)
    assert store.objects["p/step_3/mine.pt"] is theirs and store.objects["p/step_3/reused.pt"] is reused
    assert "delete" not in store.calls
    assert store.objects["p/step_3/nobody.pt"].body == nobody


def test_a_node_not_taken_over_has_nothing_to_reconcile(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    write_file(ns, ROOT_INODE, "f", b"x")
    a = member(store, "a", time.time())
    assert trio.run(Reconcile(ns.cfg, ns, store, a).run) is None
    assert "head_object" not in store.calls and not a.fenced


def test_the_sweep_drops_replicas_of_durable_files_and_of_owners_gone(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    replicas = replica_store(ns.cfg, str(tmp_path / "holder"))
    old = time.time() - 3600
    durable = b"durable already"
    store.objects["p/d.bin"] = StoredObject(durable, "e", {XXH3_META: digest(durable)})
    hold(replicas, "a", 1, "p/d.bin", durable, seq=1, mtime=old)  # the owner's forget was lost
    hold(replicas, "a", 2, "p/w.bin", b"not yet durable", seq=2, mtime=old)
    hold(replicas, "a", 3, "p/new.bin", durable, seq=3, mtime=time.time())  # too young to ask the bucket about
    store.objects["p/new.bin"] = StoredObject(durable, "e", {XXH3_META: digest(durable)})
    hold_delete(replicas, "a", 7, "p/deleted.bin", seq=4)
    hold(replicas, "gone", 1, "p/g.bin", b"g", seq=1, mtime=old)
    hold(replicas, "done", 1, "p/h.bin", b"h", seq=1, mtime=old)
    hold(replicas, "pending", 1, "p/i.bin", b"i", seq=1, mtime=old)
    now = time.time()
    member(store, "a", now)
    member(store, "done", now - 10 * TTL)
    member(store, "pending", now - 10 * TTL)
    c = member(store, "c", now)
    assert trio.run(c.claim, "done") and trio.run(c.mark_takeover_done, "done")
    assert trio.run(c.claim, "pending")  # c is at it, and may die: keep them
    membership = member(store, "me", now)
    sweep = Sweep(ns.cfg, store, replicas, membership)
    hold(replicas, "unread", 1, "p/u.bin", b"u", seq=1, mtime=old)
    member(store, "unread", now)  # its record appeared after the last read: kept until the next
    report = trio.run(sweep.once)
    assert report.entries_dropped == ["p/d.bin"] and report.deletes_dropped == ["p/deleted.bin"]
    assert sorted(report.owners_dropped) == ["done", "gone"]
    assert [e.key for e in replicas.entries("a")] == ["p/w.bin", "p/new.bin"] and replicas.deletes("a") == []
    assert replicas.owners() == ["a", "pending", "unread"]


def test_the_sweep_deletes_records_of_nodes_taken_over_long_ago_never_of_a_node_back(tmp_path: Path) -> None:
    """`.ckptfs/nodes/` would list every node that ever was, `down` for ever: a record whose takeover finished and
    that nobody wrote for peer_record_expiry is deleted, If-Match on the ETag it was judged by, so a node that came
    back (its record written again after the sweep's last read) keeps it; an unfinished takeover's record stays."""
    store, now, expiry = MemoryStore(), time.time(), 1000.0
    for node in ("gone", "back", "pending"):
        member(store, node, now - 10 * TTL)
    c = member(store, "c", now)
    for node in ("gone", "back"):
        assert trio.run(c.claim, node) and trio.run(c.mark_takeover_done, node)
    assert trio.run(c.claim, "pending")  # c is at it: kept however old
    cfg = config(tmp_path, peer_record_expiry=expiry)
    sweep = Sweep(cfg, store, replica_store(cfg, str(tmp_path / "holder")), c)
    trio.run(c.refresh)
    assert trio.run(sweep.once).records_pruned == []  # not old yet
    c.clock.now += expiry + 1  # type: ignore[attr-defined]
    # `back` returns after the sweep's last read: fenced by its taken-over record, reconciled, live again
    back = member(store, "back", now + expiry + 1, incarnation="back-2")
    assert back.must_reconcile and trio.run(back.rejoin)
    report = trio.run(sweep.once)
    assert report.records_pruned == ["gone"]
    assert f"{PREFIX}.ckptfs/nodes/gone.json" not in store.objects
    assert record(store, "back")["state"] == "live" and record(store, "pending")["state"] == "taken_over"
    assert "gone" not in [p.node for p in c.peers()]  # ckptfs status lists it no more
    trio.run(c.refresh)
    assert sorted(p.node for p in c.peers()) == ["back", "pending"]
    assert trio.run(sweep.once).records_pruned == []  # a second sweep (or another node's) finds nothing to delete


def test_an_upload_waiting_at_the_fence_is_not_sent_once_reconcile_made_its_file_durable(tmp_path: Path) -> None:
    """The drain takes a file and then waits at the gate (the fence) before its PutObject; reconcile meanwhile finds the
    taker's object with the file's xxh3: when the gate opens, the upload is abandoned, not sent a second time."""
    ns, store = namespace(tmp_path), MemoryStore()
    data = os.urandom(2000)
    ino = write_file(ns, ROOT_INODE, "f.pt", data)
    gate = trio.Event()

    async def fence() -> None:
        await gate.wait()

    d = drainer(ns, store)
    d.gate = fence

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(d.run)
            with trio.fail_after(30):
                while ino not in d.busy:
                    await trio.sleep(0.005)
            ns.uploads.durable_elsewhere(ino, "p/f.pt", "e-taker", digest(data))  # what reconcile does
            gate.set()
            while ino in d.busy:
                await trio.sleep(0.005)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert "put_object_body" not in store.calls and "put_object" not in store.calls
    row = ns.journal.get(ino)
    assert row is not None and row.state == DURABLE and row.etag == "e-taker"
