"""peer_membership = etcd (issue 44, gateway/store/etcd.py): the node records in a real etcd (Debian's etcd-server,
started on free loopback ports by the `etcd` fixture, like SeaweedFS), with the daemon's own Membership over it
and with real daemons: conditional writes with one winner, the LIST answered from the watch, a watch that stopped
noticed, a lost node taken over, a paused owner fenced and back, and an etcd that does not answer, which the
mounts survive and report. Each test has a key prefix of its own in the one etcd of its worker.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import trio

from ckptfs.objects import NETWORK, PRECONDITION, StoreError
from tests.conftest import peer_cluster, write_random
from tests.support.etcd import EtcdServer
from tests.support.peer_nodes import Cluster, Node, file_spec, node_loss_trial, wait_until
from tests.support.seaweed import SeaweedServer, free_port

MiB = 1 << 20
HELD = 3600  # upload_delay that keeps a node's drain from uploading anything in a test's time



def records(etcd: EtcdServer, prefix: str) -> Any:
    from ckptfs.store.etcd import EtcdRecords

    return EtcdRecords(etcd.endpoint, prefix, timeout=5)


def fresh_prefix() -> str:
    return f"/ckptfs-test-{uuid.uuid4().hex[:8]}/"


# ------------------------------------------------------------ the store
def test_conditional_writes_on_etcd_have_one_winner_and_the_watch_shows_other_writers(etcd: EtcdServer) -> None:
    prefix = fresh_prefix()
    a, b = records(etcd, prefix), records(etcd, prefix)
    try:
        key = "p/.ckptfs/nodes/n1.json"
        first = a.put_bytes(key, b"one", if_none_match=True)
        with pytest.raises(StoreError) as refused:
            b.put_bytes(key, b"other", if_none_match=True)
        assert refused.value.kind == PRECONDITION
        # eight claimers of one record, each If-Match on the ETag they judged it by: exactly one wins
        def claim(i: int) -> bool:
            try:
                records_i = records(etcd, prefix)
                records_i.put_bytes(key, f"claimed by {i}".encode(), if_match=first)
                return True
            except StoreError as e:
                assert e.kind == PRECONDITION
                return False

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            won = list(pool.map(claim, range(8)))
        assert won.count(True) == 1
        body, etag = b.get_bytes(key)
        assert body == f"claimed by {won.index(True)}".encode() and etag != first
        # b lists the records from its watched copy: a's later writes and deletes show, with no request of b's
        assert [o.name for o in b.list("p/.ckptfs/nodes/").objects] == ["n1.json"]
        lists = b.requests_by_kind["list"]
        a.put_bytes("p/.ckptfs/nodes/n2.json", b"two", if_none_match=True)
        wait_until("b's copy to show n2", lambda: [o.name for o in b.list("p/.ckptfs/nodes/").objects] == ["n1.json", "n2.json"], 30)
        _, etag2 = a.get_bytes("p/.ckptfs/nodes/n2.json")
        with pytest.raises(StoreError) as stale:
            a.delete_if_match("p/.ckptfs/nodes/n2.json", first)
        assert stale.value.kind == PRECONDITION
        a.delete_if_match("p/.ckptfs/nodes/n2.json", etag2)
        wait_until("b's copy to lose n2", lambda: [o.name for o in b.list("p/.ckptfs/nodes/").objects] == ["n1.json"], 30)
        assert b.requests_by_kind["list"] == lists  # every LIST since the first answered from the watch
        assert etcd.get(prefix + key) == body  # where the docs say a record is
    finally:
        a.stop()
        b.stop()


def test_a_watch_that_stopped_is_noticed_by_our_own_write_and_the_records_read_again(
        etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import ckptfs.store.etcd as etcd_module

    monkeypatch.setattr(etcd_module, "WATCH_LAG", 0.5)
    prefix = fresh_prefix()
    mine, other = records(etcd, prefix), records(etcd, prefix)
    try:
        assert mine.list("p/").objects == []
        assert mine._watcher is not None
        mine._watcher.stop()  # the stream broke without a word
        other.put_bytes("p/theirs.json", b"x", if_none_match=True)
        mine.put_bytes("p/mine.json", b"y", if_none_match=True)  # its event never comes: the watch is gone
        time.sleep(1.0)
        assert [o.name for o in mine.list("p/").objects] == ["mine.json", "theirs.json"]
        assert mine.resyncs_total == 1 and mine.requests_by_kind["list"] == 2
    finally:
        mine.stop()
        other.stop()


def test_a_watch_silent_for_a_lease_is_read_again_even_with_nothing_written_here(etcd: EtcdServer) -> None:
    """A node that writes nothing (fenced, waiting for a predecessor) has no write of its own to check its watch by:
    a watch that delivered nothing for `quiet` (a lease, in which every live node renews) is read again."""
    from ckptfs.store.etcd import EtcdRecords

    quiet = EtcdRecords(etcd.endpoint, fresh_prefix(), timeout=5, quiet=0.5)
    try:
        quiet.list("p/")
        time.sleep(1.0)
        quiet.list("p/")
        assert quiet.resyncs_total == 1 and quiet.requests_by_kind["list"] == 2
    finally:
        quiet.stop()


def test_an_unreachable_etcd_is_one_error_naming_its_endpoints() -> None:
    from ckptfs.store.etcd import EtcdRecords

    port = free_port()
    s = EtcdRecords(f"http://127.0.0.1:{port}", "/x/", timeout=2)
    with pytest.raises(StoreError) as e:
        s.list("p/")
    assert e.value.kind == NETWORK and f"etcd at http://127.0.0.1:{port} cannot be reached" in str(e.value)


# ------------------------------------------------------------ the daemon's membership over etcd
def test_membership_on_etcd_reads_no_record_list_per_refresh_and_a_claim_has_one_winner(etcd: EtcdServer) -> None:
    from ckptfs.config import load_config
    from ckptfs.peers.membership import Membership
    from ckptfs.peers.records import LIVE
    from ckptfs.peers.requests import CountedStore

    prefix, now = fresh_prefix(), [time.time()]
    clock = lambda: now[0]  # noqa: E731
    cfg = load_config(environ={}, overrides=dict(bucket="ckpt", prefix="p", mountpoint="/m", cache_dir="/tmp",
                                                 peer_lease_ttl=30.0, peer_membership="etcd", etcd_endpoints=etcd.endpoint))
    stores = {n: CountedStore(records(etcd, prefix)) for n in ("a", "b", "c", "d")}
    nodes = {n: Membership(cfg, s, lambda p: f"p/{p}", n, f"{n}-1", f"10.0.0.{i}:7470", clock=clock, monotonic=clock)
             for i, (n, s) in enumerate(stores.items())}

    async def main() -> None:
        for m in nodes.values():
            await m.announce()
        for _ in range(3):
            now[0] += 10
            for m in nodes.values():
                await m.renew()
            await trio.sleep(0.3)  # the watch delivers the others' renewals
            for m in nodes.values():
                await m.refresh()
        for n, m in nodes.items():
            assert {p.node for p in m.peers() if p.state == LIVE} == set(nodes) - {n}
            counts = stores[n].counts
            assert counts["list"] == 1 and counts["watch"] == 1  # the first LIST; then the watch
            assert counts["put"] == 4  # the announce and three renewals
        # d dies; a, b and c all hold its replicas and claim it at once: one wins
        now[0] += 31
        for n in "abc":
            await nodes[n].renew()
        await trio.sleep(0.3)
        for n in "abc":
            await nodes[n].refresh()
            assert "d" in nodes[n].dead()
        won: list[str] = []

        async def claim(n: str) -> None:
            if await nodes[n].claim("d"):
                won.append(n)

        async with trio.open_nursery() as nursery:
            for n in "abc":
                nursery.start_soon(claim, n)
        assert len(won) == 1
        doc = json.loads(etcd.get(f"{prefix}p/.ckptfs/nodes/d.json") or b"{}")
        assert doc["state"] == "taken_over" and doc["taken_over_by"] == won[0]

    try:
        trio.run(main)
    finally:
        for s in stores.values():
            s.stop()


# ------------------------------------------------------------ real daemons
@pytest.fixture
def cluster(s3: SeaweedServer, bucket: str, tmp_path: Path, etcd: EtcdServer) -> Iterator[Cluster]:
    yield from peer_cluster(s3, bucket, tmp_path, peer_membership="etcd", etcd_endpoints=etcd.endpoint,
                            etcd_prefix=fresh_prefix())


def three(cluster: Cluster, a: dict[str, Any] | None = None) -> tuple[Node, Node, Node]:
    na = cluster.node("a", failure_domain="rack1", **(a or {}))
    nb = cluster.node("b", failure_domain="rack2")
    nc = cluster.node("c", failure_domain="rack1")
    cluster.wait_live("abc")
    return na, nb, nc


def bucket_records(cluster: Cluster) -> list[str]:
    client = cluster.s3.client()
    out = client.list_objects_v2(Bucket=cluster.bucket, Prefix=f"{cluster.prefix}/.ckptfs/nodes/")
    return [o["Key"] for o in out.get("Contents", [])]


def test_on_etcd_a_lost_node_is_taken_over_and_the_bucket_holds_no_node_record(cluster: Cluster) -> None:
    a, b, c = three(cluster, a={"upload_delay": HELD})
    membership = a.status()["membership"]
    assert membership["backend"] == "etcd" and membership["error"] is None
    assert a.metric("ckptfs_membership_requests_total", 'backend="etcd",kind="watch"') >= 1
    spec = file_spec(3, 8 * MiB + 5)
    r = node_loss_trial(cluster, a, [b, c], spec, kill_after=None)
    assert r.acknowledged == 3 and r.undrained_bytes == r.acknowledged_bytes  # only the takeover can have uploaded them
    assert r.lost == [] and r.misnamed == [] and r.under_tmp_name == [], r.as_dict()
    assert r.taken_over_by == ["b"]
    wait_until("a's record in etcd to say its takeover is done",
               lambda: (a.record() or {}).get("state") == "taken_over" and (a.record() or {}).get("takeover_done"), 120)
    assert bucket_records(cluster) == []  # liveness cost the bucket nothing


def test_on_etcd_a_paused_owner_is_fenced_and_rejoins(cluster: Cluster) -> None:
    a, b, c = three(cluster, a={"upload_delay": 2})
    spec = file_spec(2, 4 * MiB + 3)
    digests = {}
    (a.path / "run" / "step_1").mkdir(parents=True)
    for f in spec:
        digests[f["name"]] = write_random(a.path / f["name"], f["size"], seed=f["seed"])
    a.pause()  # before its drain starts; longer than peer_lease_ttl
    try:
        wait_until("b to take the paused a over", lambda: (a.record() or {}).get("takeover_done"), 240)
        for f in spec:
            assert cluster.object_sha256(a.key(f["name"])) == digests[f["name"]]
    finally:
        a.resume()
    wait_until("a's record live again", lambda: (a.record() or {}).get("state") == "live", 120)
    assert a.flush().returncode == 0
    digest = write_random(a.path / "later.bin", 2 * MiB, seed=7)
    assert a.flush().returncode == 0
    assert cluster.object_sha256(a.key("later.bin")) == digest


def test_with_etcd_not_answering_the_mounts_serve_and_say_why(cluster: Cluster, etcd: EtcdServer) -> None:
    a, b, c = three(cluster, a={"peer_timeout": 2})
    etcd.pause()
    try:
        error = wait_until("a's status to name etcd", lambda: (a.status()["membership"] or {}).get("error"), 60)
        assert "etcd at" in error, error
        # its lease cannot be renewed: it says so, and uploads nothing (another node may have claimed it, for all it
        # can prove), while its mount goes on acknowledging and serving what is written
        wait_until("a's lease to lapse", lambda: a.status()["peer_state"] == "expired", 60)
        digest = write_random(a.path / "during.bin", 1 * MiB, seed=3)
        assert hashlib.sha256((a.path / "during.bin").read_bytes()).hexdigest() == digest
        assert a.flush(timeout=3).returncode != 0
        assert a.state("during.bin") != "durable" and cluster.heads([a.key("during.bin")]) == {}
    finally:
        etcd.resume()
    wait_until("a's membership error to clear", lambda: (a.status()["membership"] or {}).get("error") is None, 120)
    assert a.flush().returncode == 0
    assert cluster.object_sha256(a.key("during.bin")) == digest
