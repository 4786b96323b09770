"""A node's identity (issue 42, cases 2 and 9; docs/peers.md) with real daemons on a real SeaweedFS.

* A node lost and at once mounted again under its name with an empty cache directory (a rescheduled pod with an
  emptyDir cache, a replaced disk): on main the new incarnation wrote its record over the old one's before anyone
  claimed it and told the holder to forget what its empty journal did not list, and the fsynced shards never
  reached the bucket. Now it waits for the takeover of its predecessor: both shards reach the bucket, bytes equal.
* A node whose record cannot be written (a bucket policy that does not cover `.ckptfs/nodes/`): on main its fsyncs
  were acknowledged `replicated` though nobody could ever take it over. Now its peer copies do not count: the file
  stays `dirty`, the degraded write is counted, and `ckptfs status` says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import peer_cluster, sha256_file, write_random
from tests.support.peer_nodes import Cluster, wait_until
from tests.support.seaweed import SeaweedServer

MiB = 1 << 20
HELD = 3600  # upload_delay that keeps a node's drain from uploading anything in a test's time


@pytest.fixture
def cluster(s3: SeaweedServer, bucket: str, tmp_path: Path) -> Iterator[Cluster]:
    yield from peer_cluster(s3, bucket, tmp_path)


def test_a_node_back_at_once_with_an_empty_cache_under_its_name_loses_nothing(cluster: Cluster) -> None:
    a = cluster.node("a", failure_domain="rack1", upload_delay=HELD)
    b = cluster.node("b", failure_domain="rack2")
    cluster.wait_live("ab")
    (a.path / "run").mkdir()
    shards = {f"run/shard{i}.bin": write_random(a.path / f"run/shard{i}.bin", 8 * MiB, seed=i) for i in range(2)}
    assert [a.state(name) for name in shards] == ["replicated", "replicated"]
    assert cluster.heads(a.key(n) for n in shards) == {}  # nothing in the bucket: b's replicas are the only other copy
    old_journal = (a.record() or {}).get("journal_id")

    a.kill(delete_cache=True)
    a2 = cluster.node("a", failure_domain="rack1")  # the same name, an empty cache directory, at once

    for name, digest in shards.items():
        wait_until(f"{name} in the bucket", lambda name=name, digest=digest: cluster.object_sha256(a.key(name)) == digest, 180)
    # b took the predecessor over; then the new incarnation announced with its own journal, and serves
    wait_until("b to count the takeover", lambda: b.metric("ckptfs_peer_takeovers_total") == 1, 60)
    wait_until("a's new incarnation live", lambda: (a2.record() or {}).get("state") == "live", 120)
    assert old_journal and (a2.record() or {}).get("journal_id") not in (None, "", old_journal)
    for name, digest in shards.items():
        assert sha256_file(a2.path / name) == digest
    digest = write_random(a2.path / "after.bin", 2 * MiB, seed=9)
    wait_until("a's new writes replicated", lambda: a2.state("after.bin") in ("replicated", "durable"), 60)
    assert a2.flush().returncode == 0
    assert cluster.object_sha256(a2.key("after.bin")) == digest


def test_a_node_whose_record_cannot_be_written_acknowledges_no_peer_copy(cluster: Cluster) -> None:
    b = cluster.node("b", failure_domain="rack2")
    a = cluster.node("a", start=False, failure_domain="rack1", upload_delay=HELD, on_no_peer="degrade", peer_timeout=3)
    a.proxy.deny(".ckptfs/nodes/")  # the bucket policy does not cover the node records (reads pass)
    a.start()
    cluster.wait_live("b")
    wait_until("a to see b live", lambda: any(p["node"] == "b" and p["state"] == "live" for p in a.status().get("peers", [])), 120)
    assert a.record() is None

    digest = write_random(a.path / "shard.bin", 4 * MiB, seed=1)  # fsync returns: acknowledged on a's disk alone
    assert a.state("shard.bin") == "dirty"
    assert a.metric("ckptfs_peer_degraded_writes_total") >= 1
    assert a.metric("ckptfs_single_copy_bytes") >= 4 * MiB
    st = a.status()
    assert st["peer_state"] == "unannounced"
    assert "could not be written" in (st.get("peer_copies_uncounted") or ""), st.get("peer_copies_uncounted")
    status_text = a.cli("status", str(a.path)).stdout
    assert "peer copies not counted" in status_text, status_text
    # b holds nothing of a's as if it were safe: it refuses an owner that has no record
    assert b.replica_files("a") == []
    assert sha256_file(a.path / "shard.bin") == digest

    # the policy fixed: a announces, its next writes are replicated
    a.proxy.allow()
    wait_until("a's record written", lambda: (a.record() or {}).get("state") == "live", 60)
    write_random(a.path / "later.bin", 1 * MiB, seed=2)
    wait_until("a's next write replicated", lambda: a.state("later.bin") == "replicated", 60)


def test_an_owner_taken_over_while_paused_does_not_count_the_copies_it_sends_after(cluster: Cluster) -> None:
    """Case 8 on real daemons: a paused past its lease, taken over by b; resumed, it saves again. On main b
    acknowledged the new file (a said `replicated`) though the takeover that claimed a would never upload it."""
    a = cluster.node("a", failure_domain="rack1", upload_delay=HELD, on_no_peer="degrade", peer_timeout=3)
    b = cluster.node("b", failure_domain="rack2")
    cluster.wait_live("ab")
    (a.path / "run").mkdir()
    first = write_random(a.path / "run/first.bin", 4 * MiB, seed=1)
    assert a.state("run/first.bin") == "replicated"
    a.pause()
    try:
        wait_until("b to take a over", lambda: (a.record() or {}).get("state") == "taken_over"
                   and (a.record() or {}).get("takeover_done"), 120)
        assert cluster.object_sha256(a.key("run/first.bin")) == first
    finally:
        a.resume()
    second = write_random(a.path / "run/second.bin", 4 * MiB, seed=2)  # its fsync returned
    assert a.state("run/second.bin") != "replicated"
    # a reconciles and rejoins: what it acknowledged reaches the bucket from its own cache
    wait_until("a to rejoin", lambda: (a.record() or {}).get("state") == "live", 120)
    assert a.flush().returncode == 0
    assert cluster.object_sha256(a.key("run/second.bin")) == second
    assert cluster.object_sha256(a.key("run/first.bin")) == first
