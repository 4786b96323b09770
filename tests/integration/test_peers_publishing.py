"""Issue 42, cases 5-7, on real daemons and a real SeaweedFS (the in-memory proofs: tests/unit/test_peers_publishing.py).

* Case 5: a checkpoint whose files were all durable, not yet committed, when its node was lost is committed by a
  survivor (its holder noted it when the owner said the files were durable): `ckptfs.latest()` on a third node
  shows it committed, its manifest lists both shards.
* Case 6: a file overwritten `cp -p` style (its new bytes carry an mtime an hour older than its last upload), then
  its node lost: the taker uploads the new bytes over the stale object (provenance, not clocks).
* Case 7: SeaweedFS answers a conditional PutObject and CompleteMultipartUpload whose condition no longer holds with
  412, which the store layer reports as PRECONDITION (what the takeover counts as a conflict and never retries).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest

from ckptfs.config import Config
from ckptfs.objects import PRECONDITION, StoreError, crc32_b64
from ckptfs.publishing import store_refuses_stale_writes
from ckptfs.store import Store
from ckptfs.upload import XXH3_META
from tests.conftest import peer_cluster
from tests.support.peer_nodes import Cluster, Node, wait_until
from tests.support.seaweed import SeaweedServer

MiB = 1 << 20


@pytest.fixture
def cluster(s3: SeaweedServer, bucket: str, tmp_path: Path) -> Iterator[Cluster]:
    """One transport only: what is proven here happens in the peers and the store, not in the FUSE transport."""
    yield from peer_cluster(s3, bucket, tmp_path, fuse_transport="libfuse")


def three(cluster: Cluster, a: dict[str, Any], bc: dict[str, Any]) -> tuple[Node, Node, Node]:
    """a in rack1 (its replicas go to b only), b in rack2, c in rack1."""
    na = cluster.node("a", failure_domain="rack1", **a)
    nb = cluster.node("b", failure_domain="rack2", **bc)
    nc = cluster.node("c", failure_domain="rack1", **bc)
    cluster.wait_live("abc")
    return na, nb, nc


def write_fsynced(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def test_a_checkpoint_durable_but_not_committed_when_its_node_is_lost_is_committed_by_a_survivor(cluster: Cluster) -> None:
    import ckptfs

    # a would commit only after 10 minutes of quiet: it is lost long before; the survivors commit after 5 s of theirs
    a, b, c = three(cluster, a={"checkpoint_quiet_seconds": 600}, bc={"checkpoint_quiet_seconds": 5})
    digests = {name: write_fsynced(a.path / "run" / "step_7" / name, os.urandom(3 * MiB + i))
               for i, name in enumerate(("shard0.pt", "shard1.pt"))}
    assert a.flush("run/step_7").returncode == 0
    assert [a.state(f"run/step_7/{n}") for n in digests] == ["durable", "durable"]
    # a told b the files are durable (b dropped its replicas): from now on only b's note remembers the checkpoint
    wait_until("b to drop a's replicas of the durable shards", lambda: b.replica_files("a") == [], 60)
    before = ckptfs.latest(c.path / "run")
    assert before is None or not before.committed, "a committed the checkpoint before it was lost: nothing to show"
    a.kill()

    def committed() -> Any:
        ck = ckptfs.latest(c.path / "run")
        return ck if ck is not None and ck.step == 7 and ck.committed else None

    ck = wait_until("step 7 committed by a survivor", committed, 180)
    assert ck.info.get("files") == 2, ck.info
    for name, digest in digests.items():
        assert cluster.object_sha256(a.key(f"run/step_7/{name}")) == digest
    wait_until("b to count the takeover (done once its checkpoints are committed)", lambda: b.metric("ckptfs_peer_takeovers_total") == 1, 60)


def test_a_file_overwritten_with_an_older_mtime_then_its_node_lost_reaches_the_bucket(cluster: Cluster, tmp_path: Path) -> None:
    # a's drain holds back what it does not flush: v2 stays on a and its peer only
    a, b, c = three(cluster, a={"upload_delay": 3600}, bc={})
    v1 = os.urandom(2 * MiB)
    write_fsynced(a.path / "run" / "model.pt", v1)
    assert a.flush("run/model.pt").returncode == 0 and a.state("run/model.pt") == "durable"
    key = a.key("run/model.pt")
    assert cluster.object_sha256(key) == hashlib.sha256(v1).hexdigest()
    # `cp -p`: new bytes, an mtime an hour before the upload of v1
    v2 = os.urandom(2 * MiB)
    src = tmp_path / "model.pt"
    src.write_bytes(v2)
    old = os.stat(src).st_mtime - 3600
    os.utime(src, (old, old))
    shutil.copy2(src, a.path / "run" / "model.pt")
    with open(a.path / "run" / "model.pt", "rb+") as f:
        os.fsync(f.fileno())
    assert int(os.stat(a.path / "run" / "model.pt").st_mtime) == int(old)
    wait_until("v2 replicated", lambda: a.state("run/model.pt") == "replicated", 60)
    a.kill()

    wait_until("the taker to upload v2 over the stale v1",
               lambda: cluster.object_sha256(key) == hashlib.sha256(v2).hexdigest(), 180)


def test_a_write_of_an_older_version_landing_after_the_takeover_is_refused_by_the_store(cluster: Cluster) -> None:
    """Case 7's timeline: a's PutObject of v1 is held up in the network (the proxy keeps it); a rewrites the file (v2,
    fsynced: on b too) and is paused past its lease; b takes it over and uploads v2; then v1's request lands. It
    carries a's condition (nothing was at the key when a sent it): the store refuses it, the bucket keeps v2. Without
    the condition v1 replaces v2, and a, back, finds its own older version there."""
    a, b, c = three(cluster, a={"upload_delay": 0}, bc={})
    wait_until("a to know the store honours conditions", lambda: a.status().get("peer_conditional_writes") is True, 60)
    path = a.path / "late" / "model.pt"
    a.proxy.hold("late/model.pt", {"PUT"})
    v1, v2 = os.urandom(300 * 1024), os.urandom(300 * 1024)
    write_fsynced(path, v1)
    wait_until("a's upload of v1 held up on its way", lambda: a.proxy.held >= 1, 60)
    write_fsynced(path, v2)  # replicated to b before fsync returns; a's drain is busy with v1
    key = a.key("late/model.pt")
    a.pause()
    try:
        wait_until("b to take a over and upload v2", lambda: cluster.object_sha256(key) == hashlib.sha256(v2).hexdigest(), 180)
        a.proxy.release()
        wait_until("v1's request to land", lambda: len(a.proxy.landed) >= 1, 60)
        assert a.proxy.landed[0] == 412, f"the late write of v1 was answered {a.proxy.landed[0]}, not refused"
        assert cluster.object_sha256(key) == hashlib.sha256(v2).hexdigest(), "the late write of v1 replaced v2"
    finally:
        a.resume()
    wait_until("a durable again after reconciling", lambda: a.state("late/model.pt") == "durable", 180)
    assert cluster.object_sha256(key) == hashlib.sha256(v2).hexdigest()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(v2).hexdigest()


def test_seaweedfs_refuses_a_conditional_write_whose_condition_no_longer_holds(s3: SeaweedServer, bucket: str,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    store = Store(Config(bucket=bucket, endpoint_url=s3.endpoint_url))
    assert store_refuses_stale_writes(store, "probe/") is True  # what the mount asks (and logs when False)
    body = b"the first writer"
    crc = crc32_b64(zlib.crc32(body))
    first = store.put_object_body("k/a", body, crc, {}, if_none_match=True)
    with pytest.raises(StoreError) as e:
        store.put_object_body("k/a", b"x", crc32_b64(zlib.crc32(b"x")), {}, if_none_match=True)
    assert e.value.kind == PRECONDITION
    with pytest.raises(StoreError) as e:
        store.put_object_body("k/a", b"x", crc32_b64(zlib.crc32(b"x")), {}, if_match="0" * 32)
    assert e.value.kind == PRECONDITION
    second = store.put_object_body("k/a", b"y", crc32_b64(zlib.crc32(b"y")), {}, if_match=first)
    assert store.get_bytes("k/a")[0] == b"y"

    part = os.urandom(5 * MiB)
    pcrc = crc32_b64(zlib.crc32(part))

    def upload() -> tuple[str, list[tuple[int, str, str]]]:
        upload_id = store.create_multipart("k/a", {})
        fd = os.memfd_create("part")
        try:
            os.write(fd, part)
            etag = store.upload_part("k/a", upload_id, 1, fd, 0, len(part), pcrc)
        finally:
            os.close(fd)
        return upload_id, [(1, etag, pcrc)]

    upload_id, parts = upload()
    with pytest.raises(StoreError) as e:
        store.complete("k/a", upload_id, parts, if_match=first)  # replaced since by `second`
    assert e.value.kind == PRECONDITION
    store.abort("k/a", upload_id)
    upload_id, parts = upload()
    with pytest.raises(StoreError) as e:
        store.complete("k/a", upload_id, parts, if_none_match=True)
    assert e.value.kind == PRECONDITION
    store.abort("k/a", upload_id)
    assert store.get_bytes("k/a")[0] == b"y", "a refused write changed the object"
    upload_id, parts = upload()
    store.complete("k/a", upload_id, parts, if_match=second)
    assert store.get_bytes("k/a")[0] == part


@pytest.mark.parametrize("size", [0, 1000, 6 * MiB + 3])
def test_a_conditional_copy_is_refused_by_seaweedfs_when_its_destination_changed(s3: SeaweedServer, bucket: str, size: int,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A takeover's copy of a renamed file is conditional on the object it judged at the new key (`Store.copy`: the
    parts path at any size, since CopyObject takes no condition on its destination): a destination written since is
    left as it is; the copy lands, with the source's bytes and metadata, only where the condition holds."""
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    store = Store(Config(bucket=bucket, endpoint_url=s3.endpoint_url))
    body = os.urandom(size)
    fd = os.memfd_create("src")
    try:
        os.write(fd, body)
        store.put_object("src", fd, size, crc32_b64(zlib.crc32(body)), {XXH3_META: "abc"})
    finally:
        os.close(fd)
    other = store.put_object_body("dst", b"another node's", crc32_b64(zlib.crc32(b"another node's")), {})
    with pytest.raises(StoreError) as e:
        store.copy("src", "dst", size, 5 * MiB, 8 * MiB, if_none_match=True)
    assert e.value.kind == PRECONDITION
    with pytest.raises(StoreError) as e:
        store.copy("src", "dst", size, 5 * MiB, 8 * MiB, if_match="0" * 32)
    assert e.value.kind == PRECONDITION
    assert store.get_bytes("dst")[0] == b"another node's", "a refused copy changed the object"
    store.copy("src", "dst", size, 5 * MiB, 8 * MiB, if_match=other)
    assert store.get_bytes("dst")[0] == body
    assert store.head_object("dst").metadata.get(XXH3_META) == "abc"
    store.copy("src", "new", size, 5 * MiB, 8 * MiB, if_none_match=True)
    assert store.get_bytes("new")[0] == body
