"""A dead node's replicas uploaded by the holder that takes it over (gateway/peers/takeover.py), against the in-memory
store: byte-identical objects with the drain's xxh3 metadata, the owner's order (copies, uploads, deletes, markers
last), nothing overwritten that another node wrote since, nothing uploaded twice, no corrupt or unacknowledged replica
uploaded. The replica store and the node records are stand-ins (tests/support/fakepeers.py) until the transport and
membership land; the node-loss trials with real daemons are the proof that the product works.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import xxhash

from ckptfs.config import MiB, load_config
from ckptfs.namespace.keys import Keys
from ckptfs.objects import OTHER, StoreError
from ckptfs.peers.membership import Membership
from ckptfs.peers.takeover import Takeover
from ckptfs.publishing import Provenance
from ckptfs.upload import XXH3_META
from tests.support.replicas import hold, hold_delete, replica_store
from tests.support.memstore import MemoryStore, StoredObject

PART = 5 * MiB
PREFIX = "p/"
TTL = 3.0


def config(tmp_path: Path, **over: Any):  # type: ignore[no-untyped-def]
    return load_config(environ={}, overrides=dict(
        bucket="ckpt", prefix="p", mountpoint="/m", cache_dir=str(tmp_path), multipart_threshold=PART, part_size=PART,
        max_parts_in_flight=3, peer_lease_ttl=TTL, **over))


class Clock:
    """One node's wall and monotonic clock, where the test puts it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def member(store: MemoryStore, name: str, at: float, incarnation: str | None = None) -> Membership:
    """A node's real Membership over the shared store, its clocks at `at`, announced and having read the others."""
    clock = Clock(at)
    m = Membership(config(Path("/tmp")), store, lambda path: PREFIX + path, name, incarnation or f"{name}-1",
                   "127.0.0.1:7470", clock=clock, monotonic=clock)

    async def start() -> None:
        await m.announce()
        await m.refresh()

    trio.run(start)
    return m


def record(store: MemoryStore, name: str) -> dict:  # type: ignore[type-arg]
    return json.loads(store.objects[f"{PREFIX}.ckptfs/nodes/{name}.json"].body)  # type: ignore[no-any-return]


def setup(tmp_path: Path, store: MemoryStore | None = None) -> tuple[Takeover, MemoryStore, Any, Membership]:
    """Node a announced long ago and is gone; b (now) holds its replicas and sees it dead."""
    store = store if store is not None else MemoryStore()
    member(store, "a", time.time() - 10 * TTL)
    b = member(store, "b", time.time())
    assert b.dead() == ["a"]
    replicas = replica_store(config(tmp_path), str(tmp_path))
    return Takeover(config(tmp_path), store, replicas, b, Keys(PREFIX)), store, replicas, b


def run(t: Takeover) -> list:  # type: ignore[type-arg]
    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(60):
            return await t.round()
    return trio.run(main)


def digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def in_bucket(store: MemoryStore, key: str, data: bytes) -> None:
    obj = store.objects.get(key)
    assert obj is not None, f"{key} is not in the bucket"
    assert obj.body == data, f"{key} in the bucket differs from the replica"
    assert obj.metadata.get(XXH3_META) == digest(data), f"{key} lacks the drain's xxh3 metadata"


def logging_store() -> MemoryStore:
    """A MemoryStore that also logs (op, key) of every request that changes the bucket, in order across ops."""
    store = MemoryStore()
    store.log = []  # type: ignore[attr-defined]
    enter = store._enter

    def logged(op: str, key: str, *args: object) -> None:
        if op in ("put_object", "put_object_body", "create_multipart", "complete", "copy", "delete", "put_marker"):
            store.log.append((op, args[0] if op == "copy" else key))  # type: ignore[attr-defined]
        enter(op, key, *args)

    store._enter = logged  # type: ignore[method-assign]
    return store


def test_takeover_uploads_byte_identical_objects_in_the_owners_order(tmp_path: Path) -> None:
    store = logging_store()
    t, _, replicas, _ = setup(tmp_path, store)
    now = time.time()
    store.objects["p/old/big.bin"] = StoredObject(b"renamed bytes", "e-old", {XXH3_META: digest(b"renamed bytes")})
    store.objects["p/gone.bin"] = StoredObject(b"deleted by a", "e-gone", {})
    shard0 = os.urandom(3 * PART + 123)  # multipart: 4 parts in parallel
    shard1 = os.urandom(200_000)
    small = b"x" * (2 * MiB)  # a PutObject from the file, above BODY_IN_MEMORY
    meta = b'{"shards": 2}'
    hold(replicas, "a", 10, "p/step_100/.metadata", meta, seq=9, mtime=now, marker=True, checkpoint="step_100")
    hold(replicas, "a", 11, "p/step_100/shard0.distcp", shard0, seq=3, mtime=now, checkpoint="step_100")
    hold(replicas, "a", 12, "p/step_100/shard1.distcp", shard1, seq=4, mtime=now, checkpoint="step_100")
    hold(replicas, "a", 13, "p/other/small.bin", small, seq=5, mtime=now)
    hold(replicas, "a", 14, "p/new/big.bin", b"", seq=2, mtime=now, copy_from="p/old/big.bin", xxh3=digest(b"renamed bytes"), size=13)
    hold_delete(replicas, "a", 1, "p/gone.bin", seq=6)
    hold_delete(replicas, "a", 2, "p/old/big.bin", seq=7)
    heard: list[list[str]] = []
    t.on_taken_over.append(heard.append)

    [report] = run(t)

    in_bucket(store, "p/step_100/shard0.distcp", shard0)
    in_bucket(store, "p/step_100/shard1.distcp", shard1)
    in_bucket(store, "p/other/small.bin", small)
    in_bucket(store, "p/step_100/.metadata", meta)
    assert store.objects["p/new/big.bin"].body == b"renamed bytes"
    assert "p/gone.bin" not in store.objects and "p/old/big.bin" not in store.objects
    ops = store.log  # type: ignore[attr-defined]
    kinds = [op for op, _ in ops]
    assert kinds[0] == "copy", ops
    last_upload = max(i for i, (op, k) in enumerate(ops) if op in ("put_object", "put_object_body", "complete") and ".metadata" not in k)
    first_delete = kinds.index("delete")
    assert last_upload < first_delete, f"deletes before the uploads finished: {ops}"
    assert ops[-1] == ("put_object_body", "p/step_100/.metadata"), f"the commit marker is not last: {ops}"
    assert len(store.calls["upload_part"]) == 4
    assert record(store, "a")["takeover_done"] is True and record(store, "a")["taken_over_by"] == "b"
    assert replicas.owners() == [] and not (tmp_path / "peers" / "a").exists()
    assert heard == [sorted({"step_100", "other/small.bin", "new/big.bin", "gone.bin", "old/big.bin"})]
    assert report.checkpoints == heard[0]
    assert t.takeovers_total == 1


def test_a_takeover_run_again_uploads_nothing_that_is_already_there(tmp_path: Path) -> None:
    """A takeover interrupted, here or by another holder of the same replicas, and run again: a HEAD with the xxh3
    finds what is already durable, and nothing is sent twice."""
    store = MemoryStore()
    now = time.time()
    member(store, "a", now - 10 * TTL)
    c = member(store, "c", now - 5 * TTL)  # a first taker, long dead too: its takeover of a is taken over
    assert trio.run(c.claim, "a")
    b = member(store, "b", now)
    assert b.dead() == ["a", "c"]
    replicas = replica_store(config(tmp_path), str(tmp_path / "b"))
    t = Takeover(config(tmp_path), store, replicas, b, Keys(PREFIX))
    big = os.urandom(2 * PART + 7)
    files = {f"p/step_5/rank{i}.pt": os.urandom(1000 + i) for i in range(4)}

    def hold_all(replicas: Any) -> None:
        for i, (key, data) in enumerate(files.items()):
            hold(replicas, "a", 20 + i, key, data, seq=i, mtime=now, checkpoint="step_5")
        hold(replicas, "a", 30, "p/step_5/big.pt", big, seq=10, mtime=now, checkpoint="step_5")
        hold(replicas, "a", 31, "p/step_5/COMMIT", b"", seq=11, mtime=now, marker=True, checkpoint="step_5")

    hold_all(replicas)
    # c got two files and the big one out before it died; nothing else of a is in the bucket
    for key in list(files)[:2]:
        store.objects[key] = StoredObject(files[key], "e", {XXH3_META: digest(files[key])})
    store.objects["p/step_5/big.pt"] = StoredObject(big, "e-big", {XXH3_META: digest(big)})

    async def killed_before_done(node: str) -> bool:
        raise StoreError(OTHER, "b was killed here")

    t.membership.mark_takeover_done = killed_before_done  # type: ignore[method-assign]
    assert run(t) == [] and t.failures_total == 1  # b uploaded, then died before takeover_done
    for key, data in files.items():
        in_bucket(store, key, data)
    in_bucket(store, "p/step_5/big.pt", big)
    assert "upload_part" not in store.calls and "create_multipart" not in store.calls
    assert sorted(c[0] for op in ("put_object", "put_object_body") for c in store.calls.get(op, [])) == sorted(
        [*list(files)[2:], "p/step_5/COMMIT"])
    assert record(store, "a")["taken_over_by"] == "b" and not record(store, "a")["takeover_done"]

    # d, a third holder, later: b is gone, so its takeover is taken over; everything is already there
    d = member(store, "d", now + 5 * TTL)
    assert "a" in d.dead()
    replicas_d = replica_store(config(tmp_path), str(tmp_path / "d"))
    hold_all(replicas_d)
    sent = {op: len(calls) for op, calls in store.calls.items()}
    [again] = run(Takeover(config(tmp_path), store, replicas_d, d, Keys(PREFIX)))
    assert again.uploaded == [] and len(again.already_durable) == 6
    for op in ("put_object", "put_object_body", "create_multipart", "upload_part", "complete", "copy"):
        assert len(store.calls.get(op, [])) == sent.get(op, 0), f"{op} sent again"
    assert record(store, "a")["taken_over_by"] == "d" and record(store, "a")["takeover_done"]


def test_an_object_another_node_wrote_since_is_never_overwritten(tmp_path: Path) -> None:
    t, store, replicas, _ = setup(tmp_path)
    hold(replicas, "a", 40, "p/step_7/model.pt", b"a's version", seq=1, mtime=time.time() - 30)
    newer = StoredObject(b"written by c after a's last change", "e-c", {XXH3_META: digest(b"written by c after a's last change")})
    store.objects["p/step_7/model.pt"] = newer
    older = StoredObject(b"an old object a replaced", "e-old", {}, mtime=time.time() - 60)
    store.objects["p/step_7/optim.pt"] = older
    hold(replicas, "a", 41, "p/step_7/optim.pt", b"a's optimizer state", seq=2, mtime=time.time() - 30)

    [report] = run(t)

    assert store.objects["p/step_7/model.pt"] is newer, "a newer object of another node was overwritten"
    assert report.conflicts == ["p/step_7/model.pt"] and t.conflicts_total == 1
    in_bucket(store, "p/step_7/optim.pt", b"a's optimizer state")  # older than a's change: a's bytes win, as its drain would


def test_a_corrupt_or_unacknowledged_replica_is_not_uploaded_and_holds_its_marker(tmp_path: Path) -> None:
    t, store, replicas, _ = setup(tmp_path)
    now = time.time()
    good = os.urandom(5000)
    bad = hold(replicas, "a", 50, "p/step_9/shard0.pt", os.urandom(5000), seq=1, mtime=now)
    with open(bad.path, "r+b") as f:  # a flipped byte on the holder's disk
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    hold(replicas, "a", 51, "p/step_9/shard1.pt", good, seq=2, mtime=now)
    hold(replicas, "a", 52, "p/step_9/.metadata", b"{}", seq=3, mtime=now, marker=True)
    hold(replicas, "a", 53, "p/step_10/shard0.pt", b"half written", seq=4, mtime=now, sealed=False)
    big_bad = hold(replicas, "a", 54, "p/step_11/big.pt", os.urandom(PART + 1), seq=5, mtime=now)
    with open(big_bad.path, "r+b") as f:
        f.truncate(PART)  # shorter than its size

    [report] = run(t)

    assert "p/step_9/shard0.pt" not in store.objects and "p/step_11/big.pt" not in store.objects
    assert "p/step_10/shard0.pt" not in store.objects
    in_bucket(store, "p/step_9/shard1.pt", good)
    assert "p/step_9/.metadata" not in store.objects, "a checkpoint was marked complete over a corrupt shard"
    assert sorted(report.corrupt) == ["p/step_11/big.pt", "p/step_9/shard0.pt"] and t.corrupt_total == 2
    assert report.unsealed == ["p/step_10/shard0.pt"]
    assert report.markers_held == ["p/step_9/.metadata"]
    assert report.checkpoints == [], "an incomplete checkpoint was handed to the tracker to commit"
    assert "create_multipart" not in store.calls
    assert record(store, "a")["takeover_done"]


def test_one_winner_and_a_failed_request_leaves_the_takeover_to_run_again(tmp_path: Path) -> None:
    store = MemoryStore()
    now = time.time()
    member(store, "a", now - 10 * TTL)
    b, c = member(store, "b", now), member(store, "c", now)
    assert trio.run(c.claim, "a")  # c won: b holds replicas of a too, and leaves them to c
    trio.run(b.refresh)
    replicas = replica_store(config(tmp_path), str(tmp_path))
    data = os.urandom(3000)
    hold(replicas, "a", 60, "p/x/y.bin", data, seq=1, mtime=now)
    t = Takeover(config(tmp_path), store, replicas, b, Keys(PREFIX))
    assert run(t) == [] and "p/x/y.bin" not in store.objects and replicas.owners() == ["a"]
    assert not trio.run(b.claim, "a")

    t, store, replicas, b = setup(tmp_path / "second")
    hold(replicas, "a", 60, "p/x/y.bin", data, seq=1, mtime=now)
    store.fail("put_object_body", "server", times=1)
    assert run(t) == []  # the claim is won, the upload fails: not done
    assert not record(store, "a")["takeover_done"] and t.failures_total == 1 and replicas.owners() == ["a"]
    [report] = run(t)  # the next round finishes it without claiming again
    assert report.uploaded == ["p/x/y.bin"] and b.claims_total == 1
    in_bucket(store, "p/x/y.bin", data)
    assert record(store, "a")["takeover_done"] and record(store, "a")["taken_over_by"] == "b"


def test_a_checkpoint_completed_by_a_takeover_commits_with_a_new_manifest_generation(tmp_path: Path) -> None:
    """The taker's tracker hears of the checkpoint through `on_taken_over` (Tracker.taken_over) and commits it once
    quiet, though this node's journal never knew its files; the manifest rank 0's node wrote without rank 1's shard
    gets a new generation that lists it. Without the hook nothing commits it."""
    from types import SimpleNamespace

    from ckptfs.lifecycle.manifest import MANIFEST, files_of, next_manifest, read_manifest, write_manifest
    from ckptfs.lifecycle.tracker import Tracker
    from ckptfs.patterns import Patterns
    from tests.unit.test_journal import make_ns

    (tmp_path / "taker").mkdir()
    ns = make_ns(tmp_path / "taker", checkpoint_quiet_seconds=0, checkpoint_tags=False)  # its journal knows nothing of step_100
    t, store, replicas, _ = setup(tmp_path)
    shard0 = os.urandom(1000)
    store.objects["p/step_100/shard0.distcp"] = StoredObject(shard0, "e0", {XXH3_META: digest(shard0)}, mtime=time.time() - 100)
    listing = store.list("p/step_100/", recursive=True)
    write_manifest(store, f"p/step_100/{MANIFEST}", lambda old: next_manifest(old, "step_100", 100, files_of(listing, "p/step_100/"),
                                                                               "quiet", None, node="a"))
    shard1 = os.urandom(3000)
    hold(replicas, "a", 1, "p/step_100/shard1.distcp", shard1, seq=1, mtime=time.time(), checkpoint="step_100")
    heard: list[list[str]] = []
    t.on_taken_over.append(heard.append)

    async def io(fn, *args):  # type: ignore[no-untyped-def]
        return await trio.to_thread.run_sync(fn, *args)

    lc = SimpleNamespace(ns=ns, patterns=Patterns(["step_{step}"]), keys=ns.keys, cfg=ns.cfg, store=store, io=io, on_commit=[])
    tracker = Tracker(lc, str(tmp_path / "taker"))  # type: ignore[arg-type]
    run(t)
    store.objects["p/step_100/shard1.distcp"].mtime = time.time() - 100  # quiet in the bucket too
    trio.run(tracker.tick)
    assert read_manifest(store, f"p/step_100/{MANIFEST}").generation == 1  # type: ignore[union-attr]
    tracker.settled("p/step_100/shard1.distcp")  # what the drain tells it: not enough, this journal has no step_100
    trio.run(tracker.tick)
    assert read_manifest(store, f"p/step_100/{MANIFEST}").generation == 1  # type: ignore[union-attr]

    assert heard == [["step_100"]]
    tracker.taken_over(heard[0])  # what the daemon wires to `on_taken_over`
    trio.run(tracker.tick)
    manifest = read_manifest(store, f"p/step_100/{MANIFEST}")
    assert manifest is not None and manifest.generation == 2
    assert sorted(f["path"] for f in manifest.files) == ["shard0.distcp", "shard1.distcp"]
    assert {f["path"]: f["xxh3"] for f in manifest.files}["shard1.distcp"] == digest(shard1)


def test_a_takeover_is_done_only_once_its_checkpoints_are_committed(tmp_path: Path) -> None:
    """Campaign seed 9 (episodes 8, 11): the taker marked the takeover done, then was lost before its tracker
    committed the owner's checkpoint; nothing was left to commit it. Now `takeover_done` waits for the commit: a taker
    lost before it leaves the record unfinished and the replicas held, and the next takeover commits."""
    from types import SimpleNamespace

    from ckptfs.lifecycle.manifest import MANIFEST, read_manifest
    from ckptfs.lifecycle.tracker import Tracker
    from ckptfs.patterns import Patterns
    from tests.unit.test_journal import make_ns

    (tmp_path / "taker").mkdir()
    ns = make_ns(tmp_path / "taker", checkpoint_quiet_seconds=0, checkpoint_tags=False)
    t, store, replicas, _ = setup(tmp_path)
    shard = os.urandom(3000)
    hold(replicas, "a", 1, "p/step_7/shard0.distcp", shard, seq=1, mtime=time.time(), checkpoint="step_7")

    async def io(fn, *args):  # type: ignore[no-untyped-def]
        return await trio.to_thread.run_sync(fn, *args)

    lc = SimpleNamespace(ns=ns, patterns=Patterns(["step_{step}"]), keys=ns.keys, cfg=ns.cfg, store=store, io=io, on_commit=[])
    tracker = Tracker(lc, str(tmp_path / "taker"))  # type: ignore[arg-type]
    t.commit = tracker.commit_taken_over

    async def lost_before_the_commit() -> None:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(t.round)  # no tracker ticks: the commit never comes
                while "step_7" not in tracker.commits_awaited:
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()  # the taker lost here

    trio.run(lost_before_the_commit)
    in_bucket(store, "p/step_7/shard0.distcp", shard)
    assert f"p/step_7/{MANIFEST}" not in store.objects
    assert not record(store, "a")["takeover_done"] and replicas.owners() == ["a"]  # the next holder's to finish

    async def finished() -> list:  # type: ignore[type-arg]
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tracker.run)
                reports = await t.round()
                nursery.cancel_scope.cancel()
                return reports

    [report] = trio.run(finished)
    assert report.checkpoints == ["step_7"] and report.already_durable == ["p/step_7/shard0.distcp"]
    manifest = read_manifest(store, f"p/step_7/{MANIFEST}")
    assert manifest is not None and [f["path"] for f in manifest.files] == ["shard0.distcp"]
    assert record(store, "a")["takeover_done"] and replicas.owners() == []


def test_what_an_owner_streamed_through_the_transport_is_what_the_takeover_uploads(tmp_path: Path) -> None:
    """The whole chain but the S3 server: owner a streams its files to b's listener (real PeerLink, real listener and
    ReplicaStore on b's disk), seals them, queues a delete, and dies; b takes a over and the bucket ends up holding a's
    bytes, marker last, the delete done."""
    from ckptfs.peers.link import PeerLink
    from ckptfs.peers.listener import Listener

    store = MemoryStore()
    store.objects["p/step_2/old.pt"] = StoredObject(b"deleted by a", "e", {})
    files = {1: ("p/step_2/shard0.pt", os.urandom(PART + 777)), 2: ("p/step_2/shard1.pt", os.urandom(40_000)),
             3: ("p/step_2/.metadata", b'{"done": true}')}
    secret = b"k" * 40
    cfg = config(tmp_path / "b", peer_addr="127.0.0.1:0")
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()

    async def main() -> Any:
        replicas = replica_store(cfg, str(tmp_path / "b"))
        listener = Listener(cfg, replicas, secret, "b")
        async with trio.open_nursery() as nursery:
            port = await nursery.start(listener.run)
            link = await PeerLink.open(cfg, "a", "a-1", "b", f"127.0.0.1:{port}", secret)
            for ino, (key, data) in files.items():
                path = tmp_path / "a" / str(ino)
                path.write_bytes(data)
                fd = os.open(path, os.O_RDONLY)
                try:
                    await link.entry(ino, {"key": key, "version": 1, "size": len(data), "copy_from": None,
                                           "marker": key.endswith(".metadata"), "seq": ino, "mtime": time.time() - 5,
                                           "checkpoint": "step_2"})
                    await link.write(ino, fd, 0, len(data))
                    await link.seal(ino, 1, len(data), digest(data))
                finally:
                    os.close(fd)
            await link.delete(9, "p/step_2/old.pt", 2)
            await link.barrier()
            await link.aclose()  # a is lost
            nursery.cancel_scope.cancel()
        return replicas

    replicas = trio.run(main)
    member(store, "a", time.time() - 10 * TTL)
    b = member(store, "b", time.time())
    [report] = run(Takeover(cfg, store, replicas, b, Keys(PREFIX)))
    for key, data in files.values():
        in_bucket(store, key, data)
    assert "p/step_2/old.pt" not in store.objects
    assert report.markers == ["p/step_2/.metadata"] and report.deleted == ["p/step_2/old.pt"]
    assert replicas.owners() == [] and replicas.held_bytes() == 0


def test_a_file_sealed_then_given_a_new_version_without_new_bytes_is_still_taken_over(tmp_path: Path) -> None:
    """The sender seals a file at fsync (version 1), then its close (or a rename) sends the entry again with the version
    it counts now; no byte changed, so the replica is still what the owner acknowledged and must be uploaded."""
    store = MemoryStore()
    replicas = replica_store(config(tmp_path), str(tmp_path))
    data = os.urandom(5000)
    hold(replicas, "a", 7, "p/step_4/tmp.pt", data, seq=1, mtime=time.time())
    replicas.put_entry("a", 7, {"key": "p/step_4/model.pt", "version": 2, "size": len(data), "copy_from": None,
                                "marker": False, "seq": 2, "mtime": time.time(), "checkpoint": "step_4"})
    member(store, "a", time.time() - 10 * TTL)
    b = member(store, "b", time.time())
    [report] = run(Takeover(config(tmp_path), store, replicas, b, Keys(PREFIX)))
    assert report.unsealed == []
    in_bucket(store, "p/step_4/model.pt", data)


def test_next_round_comes_when_a_held_owners_lease_runs_out(tmp_path: Path) -> None:
    """The node-lost time is the lease TTL plus the wait for the next round plus the uploads: a holder looks again
    when a held owner's lease runs out (not up to a third of the TTL later); one already out and not taken (its own
    lease invalid, another node won) waits the usual third, never spins."""
    store = MemoryStore()
    now = time.time()
    member(store, "a", now - TTL + 0.5)  # a's lease runs out 0.5 s from now
    b = member(store, "b", now)
    replicas = replica_store(config(tmp_path), str(tmp_path))
    t = Takeover(config(tmp_path), store, replicas, b, Keys(PREFIX))
    assert t.next_look() == pytest.approx(TTL / 3)  # nothing of a's held here: a's lease is not b's business
    hold(replicas, "a", 1, "ckpt/x.bin", b"x", seq=1, mtime=now)
    assert t.next_look() == pytest.approx(0.5 + 0.05, abs=0.01)
    b.clock.now = now + 1  # type: ignore[attr-defined]  # a's lease ran out a moment ago, and a was not taken
    assert t.next_look() == pytest.approx(TTL / 3)


# -- a rename's delete of the old key waits for the file under its new one (issue 42, case 1) -----------------------

def test_a_renamed_durable_file_is_copied_to_its_new_key_before_its_old_key_is_deleted(tmp_path: Path) -> None:
    """Case 1's replicas: the rename of a durable directory reached the peer (each file's entry sealed, its bytes the
    bucket's under the old key) with the deletes of the old keys, each naming its file: the new names are made."""
    store = logging_store()
    t, _, replicas, _ = setup(tmp_path, store)
    now = time.time() - 30
    shards = {f"shard_{i}.bin": os.urandom(1000 + i) for i in range(2)}
    for i, (name, data) in enumerate(shards.items()):
        store.objects[f"p/run/step_1.tmp/{name}"] = StoredObject(data, f"e{i}", {XXH3_META: digest(data)}, mtime=now)
        hold(replicas, "a", 60 + i, f"p/run/step_1/{name}", b"", seq=10 + i, mtime=now, copy_from=f"p/run/step_1.tmp/{name}",
             xxh3=digest(data), size=len(data))
        hold_delete(replicas, "a", 1 + i, f"p/run/step_1.tmp/{name}", seq=20 + i, after_ino=60 + i)
    hold_delete(replicas, "a", 3, "p/run/step_1.tmp/", seq=22)

    [report] = run(t)

    for name, data in shards.items():
        assert store.objects[f"p/run/step_1/{name}"].body == data
    assert [k for k in store.objects if "step_1.tmp" in k] == []
    ops = store.log  # type: ignore[attr-defined]
    assert [op for op, _ in ops] == ["copy", "copy", "delete", "delete", "delete"], ops
    assert report.deletes_held == []


def test_a_delete_waiting_for_a_file_that_could_not_be_made_durable_is_not_applied(tmp_path: Path) -> None:
    """The rename's entry reached the peer but not sealed (the node was lost before the rename returned), or the
    replica is corrupt: the old key stays, so the bucket keeps the file under one name, never neither."""
    t, store, replicas, _ = setup(tmp_path)
    now = time.time() - 30
    durable = b"durable bytes under the old key"
    store.objects["p/run/step_1.tmp/shard_0.bin"] = StoredObject(durable, "e0", {XXH3_META: digest(durable)}, mtime=now)
    hold(replicas, "a", 70, "p/run/step_1/shard_0.bin", b"", seq=10, mtime=now, copy_from="p/run/step_1.tmp/shard_0.bin",
         size=len(durable), sealed=False)
    hold_delete(replicas, "a", 1, "p/run/step_1.tmp/shard_0.bin", seq=11, after_ino=70)
    # an older version's object at a file's old key, the file renamed and rewritten since: its replica is corrupt here
    store.objects["p/old.pt"] = StoredObject(b"v1", "e1", {XXH3_META: digest(b"v1")}, mtime=now)
    bad = hold(replicas, "a", 71, "p/new.pt", b"v2 bytes", seq=12, mtime=now)
    with open(bad.path, "r+b") as f:
        f.write(b"XX")
    hold_delete(replicas, "a", 2, "p/old.pt", seq=13, after_ino=71)
    # a delete whose file is no longer held (forgotten as durable, or removed) is applied, as the owner's drain would
    store.objects["p/forgotten.tmp"] = StoredObject(b"x", "e2", {}, mtime=now)
    hold_delete(replicas, "a", 3, "p/forgotten.tmp", seq=14, after_ino=72)

    [report] = run(t)

    assert store.objects["p/run/step_1.tmp/shard_0.bin"].body == durable, "the only copy of a durable file was deleted"
    assert "p/run/step_1/shard_0.bin" not in store.objects
    assert store.objects["p/old.pt"].body == b"v1"
    assert "p/new.pt" not in store.objects
    assert "p/forgotten.tmp" not in store.objects
    assert sorted(report.deletes_held) == ["p/old.pt", "p/run/step_1.tmp/shard_0.bin"]
    assert report.deleted == ["p/forgotten.tmp"]


def test_the_copy_of_a_renamed_file_is_conditional_on_what_was_judged_at_its_new_key(tmp_path: Path) -> None:
    """Issue 42, "the store is the fence": another node writes the renamed file's new key between the takeover's HEAD
    and its copy. The copy, conditional on the nothing it judged (If-None-Match), is refused: that node's object
    stays, counted as a conflict. The rename happened before that write: its old key goes, as the owner's own drain
    would have done (a newer write under the new name, none under the old)."""
    t, store, replicas, _ = setup(tmp_path)
    now = time.time() - 30
    data = b"durable bytes under the old key"
    store.objects["p/run/step_1.tmp/shard_0.bin"] = StoredObject(data, "e0", {XXH3_META: digest(data)}, mtime=now)
    hold(replicas, "a", 90, "p/run/step_1/shard_0.bin", b"", seq=10, mtime=now, copy_from="p/run/step_1.tmp/shard_0.bin",
         xxh3=digest(data), size=len(data))
    hold_delete(replicas, "a", 1, "p/run/step_1.tmp/shard_0.bin", seq=11, after_ino=90)
    copy = store.copy

    def raced(src: str, dst: str, *args: Any, **kw: Any) -> str:
        store.objects[dst] = StoredObject(b"another node's", "other", {}, mtime=time.time())
        return copy(src, dst, *args, **kw)

    store.copy = raced  # type: ignore[method-assign]

    [report] = run(t)

    assert store.objects["p/run/step_1/shard_0.bin"].body == b"another node's"
    assert report.conflicts == ["p/run/step_1/shard_0.bin"] and report.copied == []
    assert "p/run/step_1.tmp/shard_0.bin" not in store.objects and report.deleted == ["p/run/step_1.tmp/shard_0.bin"]


def test_a_rename_whose_source_object_is_gone_deletes_nothing_more(tmp_path: Path) -> None:
    t, store, replicas, _ = setup(tmp_path)
    now = time.time() - 30
    hold(replicas, "a", 80, "p/b.pt", b"", seq=1, mtime=now, copy_from="p/a.pt", xxh3=digest(b"gone"), size=4)
    hold_delete(replicas, "a", 1, "p/a.pt", seq=2, after_ino=80)

    [report] = run(t)

    assert report.lost == ["p/b.pt"] and report.deletes_held == ["p/a.pt"]
    assert "delete" not in store.calls


def test_a_delete_of_a_key_one_of_the_owners_files_has_now_is_not_applied(tmp_path: Path) -> None:
    """A rename over a durable file queues the delete of the replaced object, and the renamed file now has that key:
    its upload replaces the object, whichever reached the peer first (the drain never deletes a key a live file has)."""
    t, store, replicas, _ = setup(tmp_path)
    now = time.time() - 30
    store.objects["p/model.pt"] = StoredObject(b"replaced", "e0", {XXH3_META: digest(b"replaced")}, mtime=now - 60)
    hold(replicas, "a", 90, "p/model.pt", b"the new model", seq=5, mtime=now)  # the entry went before the delete
    hold_delete(replicas, "a", 1, "p/model.pt", seq=6)

    [report] = run(t)

    in_bucket(store, "p/model.pt", b"the new model")
    assert report.deleted == []


def test_a_delete_removes_only_the_object_the_owner_deleted(tmp_path: Path) -> None:
    """The owner removed two files (its deletes carry the ETags it saw); another node wrote one key since. With a
    store that refuses a stale conditional delete, the takeover removes the owner's object and leaves the other
    node's. Without the owner's ETag (an older release, a name it never saw listed) it is judged by what is there:
    an object another node's provenance names stays, one without provenance or of the owner's goes (If-Match)."""
    t, store, replicas, _ = setup(tmp_path)
    t.conditional_deletes = lambda: True
    now = time.time() - 30
    theirs = Provenance("c", "jc", 5, 1).meta(by="c")
    for name, etag, meta in (("mine.pt", "e-mine", {}), ("rewritten.pt", "e-theirs", {}), ("legacy.pt", "e-legacy", {}),
                             ("legacy-theirs.pt", "e-lt", theirs), ("legacy-mine.pt", "e-lm", Provenance("a", "ja", 9, 2).meta())):
        store.objects[f"p/{name}"] = StoredObject(name.encode(), etag, meta, mtime=now)
    replicas.add_delete("a", 1, "p/mine.pt", 1, None, "", "", "e-mine")
    replicas.add_delete("a", 2, "p/rewritten.pt", 2, None, "", "", "e-owners-old")
    replicas.add_delete("a", 3, "p/legacy.pt", 3)
    replicas.add_delete("a", 4, "p/legacy-theirs.pt", 4)
    replicas.add_delete("a", 5, "p/legacy-mine.pt", 5)
    replicas.add_delete("a", 6, "p/never-there.pt", 6)
    [report] = run(t)
    assert [k for k in sorted(store.objects) if ".ckptfs" not in k] == ["p/legacy-theirs.pt", "p/rewritten.pt"]
    assert store.objects["p/rewritten.pt"].etag == "e-theirs"
    assert sorted(report.deletes_kept) == ["p/legacy-theirs.pt", "p/rewritten.pt"]
    assert sorted(report.deleted) == ["p/legacy-mine.pt", "p/legacy.pt", "p/mine.pt", "p/never-there.pt"]


def test_a_delete_also_removes_a_version_of_the_owners_file_another_takeover_uploaded(tmp_path: Path) -> None:
    """Found by the peers campaign (seed 396681806, episode 73): the owner removed a file whose object an earlier
    takeover had uploaded for it (its provenance, an ETag the owner never saw); the delete, conditional on the ETag
    the owner knew, was refused and the object stayed. A version of the owner's own file at a key none of its files
    has goes, If-Match its ETag; another node's stays (the test above)."""
    from ckptfs.publishing import Provenance

    t, store, replicas, _ = setup(tmp_path)
    t.conditional_deletes = lambda: True
    store.objects["p/gone.pt"] = StoredObject(b"taken over", "e-taker", Provenance("a", "", 4, 1).meta("c"), mtime=time.time())
    replicas.add_delete("a", 1, "p/gone.pt", 1, None, "", "", "e-owners")
    [report] = run(t)
    assert "p/gone.pt" not in store.objects
    assert report.deleted == ["p/gone.pt"] and report.deletes_kept == []


def test_an_own_object_only_delete_removes_the_owners_version_and_nothing_else(tmp_path: Path) -> None:
    """The owner removed (or renamed away from), while a takeover may have run, a file it never uploaded itself: its
    delete (OWN_OBJECT_ONLY) removes what a takeover made of it, by provenance, and never another node's object."""
    from ckptfs.journal import OWN_OBJECT_ONLY
    from ckptfs.publishing import Provenance

    t, store, replicas, _ = setup(tmp_path)
    store.objects["p/mine.pt"] = StoredObject(b"taken over", "e-1", Provenance("a", "", 4, 1).meta("c"), mtime=time.time())
    store.objects["p/theirs.pt"] = StoredObject(b"theirs", "e-2", Provenance("b", "", 4, 1).meta(), mtime=time.time())
    replicas.add_delete("a", 1, "p/mine.pt", 1, None, "", "", OWN_OBJECT_ONLY)
    replicas.add_delete("a", 2, "p/theirs.pt", 2, None, "", "", OWN_OBJECT_ONLY)
    replicas.add_delete("a", 3, "p/nothing.pt", 3, None, "", "", OWN_OBJECT_ONLY)
    [report] = run(t)
    assert "p/mine.pt" not in store.objects and store.objects["p/theirs.pt"].body == b"theirs"
    assert sorted(report.deleted) == ["p/mine.pt", "p/nothing.pt"] and report.deletes_kept == ["p/theirs.pt"]
    assert "delete" not in store.calls  # never unconditional


def test_an_upload_left_open_by_a_failed_attempt_at_a_key_the_takeover_then_wrote_does_not_hold_its_commit(tmp_path: Path) -> None:
    """Campaign seed 307462893, episode 5: the store answered 503s mid-takeover; a multipart copy failed and so did its
    abort, the next attempt copied the file whole, and the tracker took the upload still open there for another node
    at work: the checkpoint was never committed while the taker stayed mounted."""
    from types import SimpleNamespace

    from ckptfs.lifecycle.manifest import MANIFEST, read_manifest
    from ckptfs.lifecycle.tracker import Tracker
    from ckptfs.patterns import Patterns
    from tests.unit.test_journal import make_ns

    (tmp_path / "taker").mkdir()
    ns = make_ns(tmp_path / "taker", checkpoint_quiet_seconds=0, checkpoint_tags=False)
    t, store, replicas, _ = setup(tmp_path)
    shard = os.urandom(3000)
    hold(replicas, "a", 1, "p/step_7/shard0.distcp", shard, seq=1, mtime=time.time(), checkpoint="step_7")
    store.create_multipart("p/step_7/shard0.distcp", {})  # the failed attempt's, never aborted
    other = store.create_multipart("p/step_8/shard0.distcp", {})  # another node's, at work elsewhere: not this one's business

    async def io(fn, *args):  # type: ignore[no-untyped-def]
        return await trio.to_thread.run_sync(fn, *args)

    lc = SimpleNamespace(ns=ns, patterns=Patterns(["step_{step}"]), keys=ns.keys, cfg=ns.cfg, store=store, io=io, on_commit=[])
    tracker = Tracker(lc, str(tmp_path / "taker"))  # type: ignore[arg-type]
    t.commit = tracker.commit_taken_over

    async def takeover() -> list:  # type: ignore[type-arg]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tracker.run)
            reports = await t.round()
            nursery.cancel_scope.cancel()
            return reports

    [report] = trio.run(takeover)
    assert report.checkpoints == ["step_7"]
    manifest = read_manifest(store, f"p/step_7/{MANIFEST}")
    assert manifest is not None and [f["path"] for f in manifest.files] == ["shard0.distcp"]
    assert record(store, "a")["takeover_done"]
    assert [u[1] for u in store.list_uploads("p/step_8/")] == [other]
