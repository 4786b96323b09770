"""The one publishing rule (gateway/publishing.py) as the takeover uses it, with the real Takeover and replica store over
the in-memory store: "newer" is decided by provenance and the ETag the owner last saw, never by clocks (issue 42, case
6); every write a takeover makes is conditional on the ETag it judged, so an object changed in between answers 412 and
the write is dropped as a conflict, not retried (case 7); and checkpoints whose files were all durable before their
owner was lost are handed to the tracker to commit (case 5). The real-daemon and SeaweedFS proofs are in
tests/integration/test_peers_publishing.py.
"""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio
import xxhash

from ckptfs.objects import PRECONDITION, ObjectInfo, StoreError, crc32_b64
from ckptfs.publishing import CONFLICT, DURABLE, WRITE, Provenance, judge, provenance_of
from ckptfs.upload import XXH3_META
from tests.support.memstore import MemoryStore, StoredObject
from tests.unit.test_peers_takeover import PART, in_bucket, record, run, setup

JOURNAL = "1700000000.123"


def digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def hold_v(replicas: Any, owner: str, ino: int, key: str, data: bytes, *, version: int, mtime: float, seen: str | None,
           checkpoint: str | None = None, seq: int = 1) -> None:
    """A sealed replica of `owner`'s file at `version`, with the entry meta an owner of this release sends (`seen`) and
    the journal its connection's handshake names; an owner of the previous release sent no `seen`."""
    replicas.put_entry(owner, ino, {"key": key, "version": version, "size": len(data), "copy_from": None, "marker": False,
                                    "seq": seq, "mtime": mtime, "checkpoint": checkpoint, "seen": seen}, journal=JOURNAL)
    fd = replicas.reserve(owner, ino, len(data))
    os.pwrite(fd, data, 0)
    replicas.wrote(owner, ino, 0)
    replicas.seal(owner, ino, version, len(data), digest(data))


def drained(store: MemoryStore, key: str, data: bytes, *, ino: int, version: int, node: str = "a", at: float | None = None) -> str:
    """An object as the owner's drain left it: its xxh3 and its provenance, LastModified `at` (now)."""
    meta = {**Provenance(node, JOURNAL, ino, version).meta(), XXH3_META: digest(data)}
    etag = f"e-{node}-{ino}-{version}"
    store.objects[key] = StoredObject(data, etag, meta, mtime=time.time() if at is None else at)
    return etag


def test_a_file_overwritten_with_an_older_mtime_replaces_its_stale_object(tmp_path: Path) -> None:
    """`cp -p` / `rsync -a` / `os.utime`: the new bytes carry an mtime an hour older than the last upload. The object
    is the owner's own version 1 (the ETag it last saw, and its provenance): version 2 replaces it."""
    t, store, replicas, _ = setup(tmp_path)
    v1, v2 = os.urandom(4000), os.urandom(4000)
    seen = drained(store, "p/step_1/model.pt", v1, ino=40, version=1)
    hold_v(replicas, "a", 40, "p/step_1/model.pt", v2, version=2, mtime=time.time() - 3600, seen=seen)

    [report] = run(t)

    assert report.conflicts == [], "the owner's own stale object was taken for another node's newer write"
    assert report.uploaded == ["p/step_1/model.pt"]
    in_bucket(store, "p/step_1/model.pt", v2)
    assert provenance_of(store.objects["p/step_1/model.pt"].metadata) == Provenance("a", JOURNAL, 40, 2)
    assert store.objects["p/step_1/model.pt"].metadata["ckptfs-by"] == "b"


def test_a_file_rewritten_within_the_second_of_its_last_upload_replaces_it(tmp_path: Path) -> None:
    """Uploaded at T (LastModified has whole seconds), rewritten at T + 0.3 s: still newer than its upload."""
    t, store, replicas, _ = setup(tmp_path)
    at = float(int(time.time()))
    v1, v2 = os.urandom(3000), os.urandom(3000)
    drained(store, "p/step_2/optim.pt", v1, ino=41, version=3, at=at)
    # an owner that never saw the object's ETag (its listing lagged): its own provenance at an older version suffices
    hold_v(replicas, "a", 41, "p/step_2/optim.pt", v2, version=4, mtime=at + 0.3, seen="")

    [report] = run(t)

    assert report.conflicts == [] and report.uploaded == ["p/step_2/optim.pt"]
    in_bucket(store, "p/step_2/optim.pt", v2)


def test_another_nodes_write_is_never_replaced_whatever_the_clocks_say(tmp_path: Path) -> None:
    """Node c wrote the key (its provenance) with a LastModified an hour before the owner's last change: not the
    object the owner last saw, so another node's write, left as it is."""
    t, store, replicas, _ = setup(tmp_path)
    seen = drained(store, "p/step_3/x.pt", b"a's first version", ino=42, version=1)
    theirs = os.urandom(2000)
    drained(store, "p/step_3/x.pt", theirs, ino=7, version=9, node="c", at=time.time() - 3600)
    hold_v(replicas, "a", 42, "p/step_3/x.pt", b"a's second version", version=2, mtime=time.time(), seen=seen)

    [report] = run(t)

    assert report.conflicts == ["p/step_3/x.pt"] and report.uploaded == []
    assert store.objects["p/step_3/x.pt"].body == theirs


def test_a_takeover_write_whose_object_changed_since_it_was_judged_gets_412_and_is_not_retried(tmp_path: Path) -> None:
    """Between the takeover's HEAD and its PutObject (and its CompleteMultipartUpload), node c writes the key. The
    write is conditional on the ETag judged: the store refuses it (412), c's object stays, the key counts as a
    conflict and nothing is sent again; the takeover finishes."""
    t, store, replicas, _ = setup(tmp_path)
    small_v1, small_v2 = os.urandom(2000), os.urandom(2000)
    big_v2 = os.urandom(PART + 7)
    seen = drained(store, "p/step_4/small.pt", small_v1, ino=43, version=1)
    hold_v(replicas, "a", 43, "p/step_4/small.pt", small_v2, version=2, mtime=time.time(), seen=seen, seq=1)
    hold_v(replicas, "a", 44, "p/step_4/big.pt", big_v2, version=1, mtime=time.time(), seen="", seq=2)  # nothing there
    theirs = {"p/step_4/small.pt": b"c wrote this after the HEAD", "p/step_4/big.pt": b"c created this after the HEAD"}
    enter = store._enter
    raced: set[str] = set()

    def racing(op: str, key: str, *args: object) -> None:
        if op in ("put_object_body", "put_object", "complete") and key in theirs and key not in raced:
            raced.add(key)
            drained(store, key, theirs[key], ino=9, version=1, node="c")  # lands just before the takeover's request
        enter(op, key, *args)

    store._enter = racing  # type: ignore[method-assign]
    [report] = run(t)

    assert sorted(report.conflicts) == ["p/step_4/big.pt", "p/step_4/small.pt"] and t.conflicts_total == 2
    assert report.uploaded == []
    for key, body in theirs.items():
        assert store.objects[key].body == body, f"{key}: a stale takeover write replaced another node's object"
    assert len(store.calls["put_object_body"]) == 1 and len(store.calls["complete"]) == 1, "a refused write was retried"
    assert not store.uploads, "the refused multipart upload was left behind"
    assert record(store, "a")["takeover_done"] and t.failures_total == 0


def test_a_checkpoint_durable_before_its_owner_was_lost_is_handed_to_the_tracker(tmp_path: Path) -> None:
    """Both shards of step_5 were durable (the owner told this holder to forget them) but the owner's tracker had
    not committed it when it was lost: the holder still claims the owner (no replica left, only the note) and hands
    step_5 to `on_taken_over`. A checkpoint with a file that could not be made durable is not handed over."""
    t, store, replicas, _ = setup(tmp_path)
    for ino, name in ((1, "shard0.pt"), (2, "shard1.pt")):
        data = os.urandom(1000)
        hold_v(replicas, "a", ino, f"p/step_5/{name}", data, version=1, mtime=time.time(), seen="", checkpoint="step_5", seq=ino)
        drained(store, f"p/step_5/{name}", data, ino=ino, version=1)
        replicas.forget("a", ino, 1)  # durable: what the owner's sender tells its peers
    hold_v(replicas, "a", 3, "p/step_6/shard0.pt", b"x", version=1, mtime=time.time(), seen="", checkpoint="step_6", seq=3)
    replicas.forget("a", 3, 1)
    replicas.put_entry("a", 4, {"key": "p/step_6/shard1.pt", "version": 1, "size": 5, "copy_from": None, "marker": False,
                                "seq": 4, "mtime": time.time(), "checkpoint": "step_6"})  # never sealed
    assert replicas.owners() == ["a"] and [e.key for e in replicas.entries("a")] == ["p/step_6/shard1.pt"]
    heard: list[list[str]] = []
    t.on_taken_over.append(heard.append)

    [report] = run(t)

    assert heard == [["step_5"]], "a checkpoint durable before the loss was not handed over (or an incomplete one was)"
    assert record(store, "a")["takeover_done"] and replicas.owners() == []


def test_the_rule_never_compares_clocks_between_nodes() -> None:
    mine = Provenance("a", JOURNAL, 5, 3)

    def obj(meta: dict[str, str], etag: str = "e1", modified: float = 0.0, size: int = 10, xxh3: str = "x") -> ObjectInfo:
        return ObjectInfo(size, etag, None, {**meta, XXH3_META: xxh3}, modified)

    assert judge(mine, 10, "new", None, "").if_none_match
    assert judge(mine, 10, "x", obj({}), "").action == DURABLE
    v = judge(mine, 10, "new", obj({}, etag="seen"), "seen")
    assert (v.action, v.if_match) == (WRITE, "seen")
    assert judge(mine, 10, "new", obj(Provenance("a", JOURNAL, 5, 2).meta(), modified=1e12), "").action == WRITE
    assert judge(mine, 10, "new", obj(Provenance("a", JOURNAL, 5, 3).meta()), "").action == CONFLICT
    assert judge(mine, 10, "new", obj(Provenance("a", "another journal", 5, 1).meta()), "").action == CONFLICT
    assert judge(mine, 10, "new", obj(Provenance("c", JOURNAL, 5, 1).meta(), modified=0.0), "", legacy_mtime=1e12).action == CONFLICT
    assert judge(mine, 10, "new", obj({}, etag="other"), "seen", legacy_mtime=1e12).action == CONFLICT


def test_a_store_answers_conditions_as_s3_does() -> None:
    """The in-memory store the takeover tests run over answers conditional writes as S3 (and SeaweedFS) do."""
    store = MemoryStore()
    body = b"abc"
    crc = crc32_b64(zlib.crc32(body))
    etag = store.put_object_body("k", body, crc, {}, if_none_match=True)
    with pytest.raises(StoreError) as e:
        store.put_object_body("k", body, crc, {}, if_none_match=True)
    assert e.value.kind == PRECONDITION
    with pytest.raises(StoreError) as e:
        store.put_object_body("k", body, crc, {}, if_match="other")
    assert e.value.kind == PRECONDITION
    store.put_object_body("k", b"new", crc32_b64(zlib.crc32(b"new")), {}, if_match=etag)
    assert store.objects["k"].body == b"new"


def test_the_mount_says_whether_the_store_fences_stale_writes() -> None:
    """`store_refuses_stale_writes` (asked once at mount, logged as an error when False): a store that answers the
    second create-only write with 412 fences; one that ignores the condition does not. The probe leaves nothing."""
    from ckptfs.publishing import store_refuses_stale_writes

    class Ignoring(MemoryStore):
        def put_bytes(self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None,
                      content_type: str = "application/json") -> str:
            return super().put_bytes(key, body, content_type=content_type)

    honours, ignores = MemoryStore(), Ignoring()
    assert store_refuses_stale_writes(honours, "p/.ckptfs/probe-") is True
    assert store_refuses_stale_writes(ignores, "p/.ckptfs/probe-") is False
    assert honours.objects == {} and ignores.objects == {}


def test_a_node_back_keeps_its_rewrite_of_the_same_second_and_the_drain_writes_provenance(tmp_path: Path) -> None:
    """Reconcile (gateway/peers/reconcile.py) by the same rule. The real drain uploads v1 (with its provenance); v2 is
    written and closed within the same second (LastModified has whole seconds) and never reached the bucket (not
    replicated: the taker had nothing of it). Back after the takeover, the node's v2 is its own newer version, left
    to its drain, not "another node's write since" to be dropped for the bucket's v1."""
    from ckptfs.journal import DIRTY, DURABLE, ROOT_INODE
    from ckptfs.peers.reconcile import Reconcile, ReconcileReport
    from tests.unit.test_drain_faults import drain_until, drainer, namespace

    ns, store = namespace(tmp_path), MemoryStore()
    step = ns.tree.mkdir(ROOT_INODE, "step_8", 0o755, 0, 0)
    from tests.unit.test_journal import write_file

    ino = write_file(ns, step.ino, "w.pt", b"v1" * 1000)
    drain_until(drainer(ns, store), lambda: ns.journal.get(ino).state == DURABLE)  # type: ignore[union-attr]
    obj = store.objects["p/step_8/w.pt"]
    mine = provenance_of(obj.metadata)
    assert mine is not None and (mine.ino, mine.journal) == (ino, ns.journal.journal_id), "the drain wrote no provenance"
    fd = ns.files.open(ino, write=True)
    ns.files.write(ino, fd, 0, b"v2" * 1000)
    os.close(fd)
    ns.files.release(ino, write=True)
    row = ns.journal.get(ino)
    assert row is not None and row.state == DIRTY and row.closed_at
    obj.mtime = float(int(row.closed_at))  # v1's LastModified: the second v2 was closed in

    report = ReconcileReport("b")
    trio.run(Reconcile(ns.cfg, ns, store, None)._files, report, row.closed_at + 5)  # type: ignore[arg-type]

    assert report.bucket_won == [], "this node's own newer version was dropped for its older upload"
    assert report.left_to_drain == ["p/step_8/w.pt"]
    assert ns.journal.get(ino).state == DIRTY  # type: ignore[union-attr]


def test_a_lost_nodes_checkpoint_is_never_committed_over_a_temporary_name(tmp_path: Path) -> None:
    """The taker's tracker (Tracker.taken_over) commits a lost node's checkpoint only complete: DCP's `.metadata.tmp`
    in the bucket without `.metadata` (the rename never reached it) is not committed; once `.metadata` is there under
    its final name (a later takeover hands the checkpoint over again), it is."""
    from types import SimpleNamespace

    from ckptfs.lifecycle.manifest import MANIFEST, read_manifest
    from ckptfs.lifecycle.tracker import Tracker
    from ckptfs.patterns import Patterns
    from tests.unit.test_journal import make_ns

    (tmp_path / "taker").mkdir()
    ns = make_ns(tmp_path / "taker", checkpoint_quiet_seconds=0, checkpoint_tags=False)
    store = MemoryStore()
    old = time.time() - 100
    for name, body in (("__0_0.distcp", os.urandom(1000)), (".metadata.tmp", b"{}")):
        store.objects[f"p/step_9/{name}"] = StoredObject(body, f"e-{name}", {XXH3_META: digest(body)}, mtime=old)

    async def io(fn, *args):  # type: ignore[no-untyped-def]
        return await trio.to_thread.run_sync(fn, *args)

    lc = SimpleNamespace(ns=ns, patterns=Patterns(["step_{step}"]), keys=ns.keys, cfg=ns.cfg, store=store, io=io, on_commit=[])
    tracker = Tracker(lc, str(tmp_path / "taker"))  # type: ignore[arg-type]
    tracker.taken_over(["step_9"])
    trio.run(tracker.tick)
    assert read_manifest(store, f"p/step_9/{MANIFEST}") is None, "committed over a temporary name"

    store.objects["p/step_9/.metadata"] = store.objects.pop("p/step_9/.metadata.tmp")
    tracker.taken_over(["step_9"])
    trio.run(tracker.tick)
    manifest = read_manifest(store, f"p/step_9/{MANIFEST}")
    assert manifest is not None and sorted(f["path"] for f in manifest.files) == [".metadata", "__0_0.distcp"]
