"""The drain's writes as a fence (gateway/drainfence.py; issue 42, case 7), over the in-memory store's conditional
writes: a write conditional on what this node last saw at the key, and what the drain does when the store refuses it.
The same conditions against SeaweedFS, and the late write they stop on real daemons: tests/integration/
test_peers_publishing.py."""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

from ckptfs.drain import Drainer
from ckptfs.journal import ROOT_INODE
from ckptfs.namespace import Namespace
from ckptfs.objects import ObjectInfo
from ckptfs.peering import node_name_of
from ckptfs.publishing import CONFLICT, DURABLE, WRITE, Provenance, after_refusal
from ckptfs.upload import XXH3_META
from tests.support.memstore import MemoryStore, StoredObject
from tests.unit.test_drain_faults import drain_until, drainer, durable, namespace, sha
from tests.unit.test_journal import write_file


def fenced(ns: Namespace, store: MemoryStore) -> Drainer:
    d = drainer(ns, store)
    d.fence.enabled = lambda: True  # what the daemon sets once the peers' probe found the store honours conditions
    return d


def rewrite(ns: Namespace, ino: int, data: bytes) -> None:
    fd = ns.files.open(ino, write=True)
    os.ftruncate(fd, 0)
    ns.files.write(ino, fd, 0, data)
    os.close(fd)
    ns.files.release(ino, write=True)


def mine(ns: Namespace, ino: int) -> Provenance:
    row = ns.journal.get(ino)
    assert row is not None
    return Provenance(node_name_of(ns.cfg), ns.journal.journal_id, ino, row.version)


def test_a_write_whose_key_changed_since_is_refused_then_replaces_another_nodes_object(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    ino = write_file(ns, ROOT_INODE, "f.bin", os.urandom(1000))
    d = fenced(ns, store)
    drain_until(d, lambda: durable(ns, ino))
    assert d.fence.refusals_total == 0  # nothing was there: If-None-Match held
    # another node writes the key; this node, not having listed it since, rewrites its file
    theirs = Provenance("other-node", "j-other", 7, 1).meta()
    store.objects["p/f.bin"] = StoredObject(b"theirs", "e-theirs", theirs)
    v2 = os.urandom(2000)
    rewrite(ns, ino, v2)
    drain_until(d, lambda: durable(ns, ino))
    assert d.fence.refusals_total == 1  # If-Match on its own last upload: refused, judged, written again
    assert sha(store.objects["p/f.bin"].body) == sha(v2)  # between nodes the last writer wins
    assert [c[0] for c in store.calls["put_object_body"]] == ["p/f.bin"] * 3


def test_a_late_write_over_a_takers_newer_version_of_the_same_file_is_never_made(tmp_path: Path) -> None:
    """The case-7 timeline in memory: a taker wrote this file's version from a replica; the owner's write of an older
    version (the bucket had nothing when it saw it) is refused and left as a conflict, the taker's object kept."""
    ns, store = namespace(tmp_path), MemoryStore()
    ino = write_file(ns, ROOT_INODE, "f.bin", os.urandom(1000))
    newer = mine(ns, ino)
    newer = Provenance(newer.node, newer.journal, ino, newer.version + 1)
    taker = {**newer.meta(by="taker"), XXH3_META: xxhash.xxh3_128_hexdigest(b"v2")}
    store.objects["p/f.bin"] = StoredObject(b"v2", "e-v2", taker)
    d = fenced(ns, store)
    drain_until(d, lambda: d.fence.conflicts_total >= 1)
    assert store.objects["p/f.bin"].body == b"v2" and store.objects["p/f.bin"].etag == "e-v2"
    assert not durable(ns, ino)  # not taken as durable: its bytes are not there
    assert "not uploaded" in d.last_error and "takeover" in d.last_error


def test_the_same_bytes_found_after_a_refusal_are_durable_without_another_write(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    data = os.urandom(1000)
    ino = write_file(ns, ROOT_INODE, "f.bin", data)
    store.objects["p/f.bin"] = StoredObject(data, "e-same", {XXH3_META: xxhash.xxh3_128_hexdigest(data)})
    d = fenced(ns, store)
    drain_until(d, lambda: durable(ns, ino))
    assert len(store.calls["put_object_body"]) == 1 and store.objects["p/f.bin"].etag == "e-same"
    row = ns.journal.get(ino)
    assert row is not None and row.etag == "e-same"


def test_without_the_fence_writes_go_unconditional(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    ino = write_file(ns, ROOT_INODE, "f.bin", b"mine")
    store.objects["p/f.bin"] = StoredObject(b"theirs", "e-theirs", {})
    d = drainer(ns, store)
    drain_until(d, lambda: durable(ns, ino))
    assert store.objects["p/f.bin"].body == b"mine" and d.fence.refusals_total == 0


def info(size: int, etag: str, metadata: dict[str, str]) -> ObjectInfo:
    return ObjectInfo(size=size, etag=etag, version_id=None, metadata=metadata)


def test_the_rule_after_a_refusal() -> None:
    me = Provenance("a", "ja", 5, 3)
    assert after_refusal(me, 10, "x", None).if_none_match
    assert after_refusal(me, 10, "x", info(10, "e", {XXH3_META: "x"})).action == DURABLE
    for version in (3, 4):  # this file's own version, at or past mine: a taker's; never replaced
        assert after_refusal(me, 10, "x", info(9, "e", Provenance("a", "ja", 5, version).meta())).action == CONFLICT
    for other in (Provenance("a", "ja", 5, 2), Provenance("a", "ja", 6, 9), Provenance("a", "jb", 5, 9), Provenance("b", "jb", 5, 9)):
        v = after_refusal(me, 10, "x", info(9, "e", other.meta()))  # older, another file, another journal, another node
        assert (v.action, v.if_match) == (WRITE, "e")
    assert (after_refusal(me, 10, "x", info(9, "e", {})).action, after_refusal(me, 10, "x", info(9, "e", {})).if_match) == (WRITE, "e")


def test_a_delete_removes_only_the_object_it_was_queued_for(tmp_path: Path) -> None:
    """A file removed here: its object goes (If-Match on the ETag this node uploaded). Another file removed after
    another node rewrote its key: that node's object stays, and the delete is done, not retried."""
    ns, store = namespace(tmp_path), MemoryStore()
    gone = write_file(ns, ROOT_INODE, "gone.bin", os.urandom(100))
    kept = write_file(ns, ROOT_INODE, "kept.bin", os.urandom(100))
    d = fenced(ns, store)
    d.fence.deletes_enabled = lambda: True
    drain_until(d, lambda: durable(ns, gone) and durable(ns, kept))
    store.objects["p/kept.bin"] = StoredObject(b"theirs", "e-theirs", Provenance("other-node", "j", 3, 1).meta())
    ns.tree.unlink(ROOT_INODE, "gone.bin")
    ns.tree.unlink(ROOT_INODE, "kept.bin")
    drain_until(d, lambda: not ns.journal.pending_deletes())
    assert "p/gone.bin" not in store.objects
    assert store.objects["p/kept.bin"].body == b"theirs"
    assert d.fence.deletes_refused_total == 1 and len(store.calls["delete_if_match"]) == 2
    assert "delete" not in store.calls  # never unconditional


def test_a_delete_also_removes_a_version_of_its_own_file_a_takeover_uploaded(tmp_path: Path) -> None:
    """Found by the peers campaign (seed 396681806, episodes 12 and 73: a file deleted on its node stayed in the
    bucket): while the node was away, a takeover uploaded its file for it, with its provenance but an ETag its
    journal never saw; the delete queued with the old ETag was refused and the object kept for good. It goes now,
    If-Match its own ETag; another node's object at a deleted key stays (the test above)."""
    ns, store = namespace(tmp_path), MemoryStore()
    stale = write_file(ns, ROOT_INODE, "stale.bin", os.urandom(100))
    d = fenced(ns, store)
    d.fence.deletes_enabled = lambda: True
    drain_until(d, lambda: durable(ns, stale))
    store.objects["p/stale.bin"] = StoredObject(b"by the taker", "e-taker", mine(ns, stale).meta("taker"))
    ns.tree.unlink(ROOT_INODE, "stale.bin")
    drain_until(d, lambda: not ns.journal.pending_deletes())
    assert "p/stale.bin" not in store.objects
    assert d.fence.deletes_refused_total == 0
    assert [c[0] for c in store.calls["delete_if_match"]] == ["p/stale.bin", "p/stale.bin"]  # refused, then its own


def test_own_stale_version_keeps_a_live_files_object_and_another_nodes() -> None:
    from ckptfs.publishing import own_stale_version

    ours = ObjectInfo(1, "e", None, Provenance("a", "j", 7, 2).meta())
    assert own_stale_version("a", "j", ours, lambda ino: False)
    assert not own_stale_version("a", "j", ours, lambda ino: ino == 7)  # a file of ours lives at the key
    assert not own_stale_version("b", "j", ours, lambda ino: False)  # another node's
    assert not own_stale_version("a", "other-journal", ours, lambda ino: False)  # another incarnation's disk
    assert not own_stale_version("a", "j", ObjectInfo(1, "e", None, {}), lambda ino: False)  # no provenance


def test_the_probe_of_conditional_deletes() -> None:
    from ckptfs.publishing import store_refuses_stale_deletes

    store = MemoryStore()
    assert store_refuses_stale_deletes(store, "p/.ckptfs/probe-") is True
    assert not store.objects  # the probe object is gone either way

    class Ignores(MemoryStore):  # a store that takes DeleteObject's If-Match for a plain delete
        def delete_if_match(self, key: str, etag: str) -> None:
            self.delete(key)

    ignores = Ignores()
    assert store_refuses_stale_deletes(ignores, "p/.ckptfs/probe-") is False and not ignores.objects


def test_keys_a_never_uploaded_file_leaves_while_a_takeover_may_run_are_cleaned_of_what_it_made(tmp_path: Path) -> None:
    """Found by the peers campaign (seed 396681806, episode 12, owner paused past its lease): a takeover uploaded the
    paused node's files for it; right after it resumed, the node removed one (never uploaded by itself: no delete
    was queued) and the takeover's object stayed for good; a file renamed likewise stayed under its old name.
    While `away` (a takeover may be uploading for it), a key such a file leaves gets an OWN_OBJECT_ONLY delete:
    the object there goes if it is a version of that file by provenance; another node's object stays."""
    from ckptfs.journal import OWN_OBJECT_ONLY

    ns, store = namespace(tmp_path), MemoryStore()
    gone = write_file(ns, ROOT_INODE, "gone.bin", b"removed while away")
    moved = write_file(ns, ROOT_INODE, "step.tmp", b"renamed while away")
    theirs = write_file(ns, ROOT_INODE, "theirs.bin", b"removed, another node's object there")
    for ino, name in ((gone, "gone.bin"), (moved, "step.tmp")):  # what the takeover made of them, with their provenance
        store.objects[f"p/{name}"] = StoredObject(b"taken over", f"e-{name}", mine(ns, ino).meta("taker"))
    store.objects["p/theirs.bin"] = StoredObject(b"theirs", "e-theirs", Provenance("other-node", "j", 3, 1).meta())
    ns.uploads.away = lambda: True
    ns.tree.unlink(ROOT_INODE, "gone.bin")
    ns.tree.unlink(ROOT_INODE, "theirs.bin")
    ns.tree.rename(ROOT_INODE, "step.tmp", ROOT_INODE, "step", False)
    queued = {key: (after, ns.journal.delete_etag(i)) for i, key, after in
              ns.journal.db.execute("SELECT id, key, after_ino FROM deletes").fetchall()}
    assert queued == {"p/gone.bin": (None, OWN_OBJECT_ONLY), "p/theirs.bin": (None, OWN_OBJECT_ONLY),
                      "p/step.tmp": (moved, OWN_OBJECT_ONLY)}
    ns.uploads.away = lambda: False  # back: the drain runs (its gate waited for the rejoin)
    d = fenced(ns, store)
    d.fence.deletes_enabled = lambda: True
    drain_until(d, lambda: not ns.journal.pending_deletes() and durable(ns, moved))
    assert "p/gone.bin" not in store.objects and "p/step.tmp" not in store.objects
    assert store.objects["p/theirs.bin"].body == b"theirs"
    assert store.objects["p/step"].body == b"renamed while away"


def test_nothing_is_queued_for_a_never_uploaded_file_outside_that_window(tmp_path: Path) -> None:
    ns = namespace(tmp_path)
    write_file(ns, ROOT_INODE, "a.bin", b"a")
    write_file(ns, ROOT_INODE, "b.tmp", b"b")
    ns.tree.unlink(ROOT_INODE, "a.bin")
    ns.tree.rename(ROOT_INODE, "b.tmp", ROOT_INODE, "b", False)
    assert ns.journal.pending_deletes() == []
