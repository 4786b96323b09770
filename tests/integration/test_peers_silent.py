"""A peer that dies silently (issue 42, case 3), on real daemons and a real SeaweedFS.

Power lost on the node holding an owner's replicas sends no FIN and no RST: nothing tells the owner, and an owner
whose channel to it is idle has nothing that could time out. Here the holder's daemon is stopped with SIGSTOP and
never continued (its kernel still acknowledges TCP segments, so only the owner's idle ping or the holder's record
going down can tell). What a user checks: the owner stops calling its files `replicated` and counts them in
`ckptfs_single_copy_bytes` while no peer holds them, copies them to the next candidate, and when the owner is then
lost too, every acknowledged shard reaches the bucket with the bytes written (sha256), taken over by that candidate.

The paused holder is continued only at teardown (`Node.stop` sends SIGCONT so it can unmount).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import peer_cluster, write_random
from tests.support.peer_nodes import WRITER, Cluster, Node, file_spec, wait_until
from tests.support.seaweed import SeaweedServer

pytestmark = pytest.mark.one_transport  # the peers' connections, not the FUSE transport, are under test

MiB = 1 << 20
HELD = 3600  # upload_delay that keeps a node's drain from uploading anything in a test's time


@pytest.fixture
def cluster(s3: SeaweedServer, bucket: str, tmp_path: Path) -> Iterator[Cluster]:
    yield from peer_cluster(s3, bucket, tmp_path)


def save(node: Node, spec: list[dict[str, Any]]) -> dict[str, str]:
    """Each file written to a tmp name, fsynced, renamed (tests/support/peer_nodes.py's writer): name -> sha256."""
    out = subprocess.run([sys.executable, "-c", WRITER, str(node.path), json.dumps(spec)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return {e["name"]: e["sha256"] for e in map(json.loads, out.stdout.splitlines()) if e["event"] == "fsync"}


def states(node: Node, spec: list[dict[str, Any]]) -> list[str]:
    return [node.state(f["name"]) for f in spec]


def held_by(node: Node, owner: str, count: int) -> bool:
    return len(node.replica_files(owner)) == count


def lose_and_check(cluster: Cluster, owner: Node, taker: Node, spec: list[dict[str, Any]], digests: dict[str, str]) -> None:
    """The owner lost for good (SIGKILL, cache deleted): every shard in the bucket under its final name with the
    bytes written, uploaded by `taker`'s takeover."""
    assert cluster.heads(owner.key(f["name"]) for f in spec) == {}  # nothing drained before: the takeover must do it
    owner.kill(delete_cache=True)
    for f in spec:
        key = owner.key(f["name"])
        wait_until(f"{key} in the bucket", lambda key=key, f=f: cluster.object_sha256(key) == digests[f["name"]], 240)
    wait_until(f"{taker.name} to count the takeover", lambda: taker.metric("ckptfs_peer_takeovers_total") == 1, 60)


def test_a_holder_that_dies_silently_is_replaced_and_the_owner_lost_next_loses_nothing(cluster: Cluster) -> None:
    """The issue's case 3: three nodes, a's replicas on one of b and c, that one stopped for good."""
    a = cluster.node("a", failure_domain="rack1", upload_delay=HELD)
    b = cluster.node("b", failure_domain="rack2")
    c = cluster.node("c", failure_domain="rack3")
    cluster.wait_live("abc")
    spec = file_spec(2, 8 * MiB + 7)
    digests = save(a, spec)
    assert states(a, spec) == ["replicated"] * 2
    holder = wait_until("a's replicas on b or c", lambda: next((n for n in (b, c) if held_by(n, "a", 2)), None), 60)
    third = c if holder is b else b
    assert third.replica_files("a") == []
    assert a.metric("ckptfs_single_copy_bytes") == 0

    holder.pause()  # power lost: no FIN, no RST; never continued (until teardown)
    single_copy: list[float] = []

    def copied_to_the_third() -> bool:
        single_copy.append(a.metric("ckptfs_single_copy_bytes"))
        return held_by(third, "a", 2) and states(a, spec) == ["replicated"] * 2 and single_copy[-1] == 0

    # the third holds a's replicas only once a gave up on the holder (R = 1): the states say `replicated` again
    # because of it, and nothing is single-copy any more
    wait_until("a to copy its files to the third node", copied_to_the_third, 120)
    log = (a.cache_dir / "ckptfs.log").read_text()
    assert f"peer {holder.name} (" in log and "dropped" in log, log[-3000:]
    print(f"single-copy bytes seen on a meanwhile: {sorted(set(single_copy))}")

    lose_and_check(cluster, a, third, spec, digests)  # the holder, still stopped, takes no part


def test_files_whose_only_holder_stopped_answering_are_single_copy_until_another_node_holds_them(
        cluster: Cluster) -> None:
    """Two nodes: a's only candidate b is stopped. a must notice by itself (b's lease is longer than peer_timeout,
    so the idle ping, not b's record, tells) and say the truth: its files are `dirty` and counted single-copy. A
    third node joins: the files go there, `replicated` again, and a lost next loses nothing."""
    common = {"peer_lease_ttl": 12, "peer_timeout": 4}
    a = cluster.node("a", failure_domain="rack1", upload_delay=HELD, **common)
    b = cluster.node("b", failure_domain="rack2", **common)
    cluster.wait_live("ab")
    spec = file_spec(2, 6 * MiB + 3)
    digests = save(a, spec)
    size = sum(f["size"] for f in spec)
    assert states(a, spec) == ["replicated"] * 2 and held_by(b, "a", 2)
    assert a.metric("ckptfs_single_copy_bytes") == 0

    b.pause()  # never continued (until teardown)
    wait_until("a to count its files single-copy",
               lambda: a.metric("ckptfs_single_copy_bytes") == size and states(a, spec) == ["dirty"] * 2, 120)
    log = (a.cache_dir / "ckptfs.log").read_text()
    assert "peer b (" in log and "no answer to a ping" in log, log[-3000:]
    assert a.metric("ckptfs_single_copy_oldest_age_seconds") > 0

    c = cluster.node("c", failure_domain="rack3", **common)
    wait_until("a to copy its files to c",
               lambda: held_by(c, "a", 2) and states(a, spec) == ["replicated"] * 2 and a.metric("ckptfs_single_copy_bytes") == 0,
               120)
    lose_and_check(cluster, a, c, spec, digests)

    # b continued at last: nothing breaks. Its connection from a is gone, the replicas it kept of a are dropped
    # (c finished a's takeover), and it serves and drains its own files, replicated to c
    b.resume()
    wait_until("b to drop the replicas it kept of a", lambda: b.replica_files("a") == [], 120)
    wait_until("b to see c live", lambda: {"node": "c", "state": "live"}.items() <= next(
        (p for p in b.status()["peers"] if p["node"] == "c"), {}).items(), 120)
    digest = write_random(b.path / "after.bin", 2 * MiB, seed=3)
    assert b.metric("ckptfs_peer_degraded_writes_total") == 0  # its fsync found a peer (c): acknowledged with two copies
    assert b.flush().returncode == 0
    assert cluster.object_sha256(b.key("after.bin")) == digest


def test_a_holder_the_owner_moved_away_from_cannot_take_it_over_with_older_copies(cluster: Cluster) -> None:
    """The peers campaign, seed 396681806 episodes 73 and 103: the owner's holder stops answering (here paused past
    peer_timeout), the owner copies its files to the third node and deletes one there; the old holder comes back
    with the deleted file's sealed replica. The owner lost next: the file must stay deleted, so the old holder may
    not claim it (holders.py: the owner's record lists the third node only); the third node takes it over."""
    common = {"peer_lease_ttl": 12, "peer_timeout": 4}
    a = cluster.node("a", failure_domain="rack1", upload_delay=HELD, **common)
    b = cluster.node("b", failure_domain="rack2", **common)
    c = cluster.node("c", failure_domain="rack3", **common)
    cluster.wait_live("abc")
    spec = file_spec(2, 1 * MiB + 7)
    digests = save(a, spec)
    holder = wait_until("a's replicas on b or c", lambda: next((n for n in (b, c) if held_by(n, "a", 2)), None), 60)
    third = c if holder is b else b
    assert a.status()["peer_holders"] == [holder.name] and (a.record() or {}).get("holders") == [holder.name]

    holder.pause()
    wait_until("a to copy its files to the third node and list it as their holder",
               lambda: held_by(third, "a", 2) and states(a, spec) == ["replicated"] * 2
               and a.status()["peer_holders"] == [third.name], 120)
    assert (a.record() or {}).get("holders") == [third.name]
    gone, kept = spec
    (a.path / gone["name"]).unlink()  # reaches the third node only: the paused holder keeps its sealed replica
    wait_until("the third node to forget the deleted file", lambda: held_by(third, "a", 1), 60)
    holder.resume()
    wait_until(f"{holder.name} to renew its record again", lambda: (holder.record() or {}).get("state") == "live"
               and holder.status()["peer_state"] == "live", 120)
    assert len(holder.replica_files("a")) == 2  # the older copies, the deleted file's among them

    a.kill(delete_cache=True)
    key = a.key(kept["name"])
    wait_until(f"{key} in the bucket", lambda: cluster.object_sha256(key) == digests[kept["name"]], 240)
    wait_until("a's takeover to finish", lambda: (a.record() or {}).get("takeover_done") is True, 120)
    rec = a.record() or {}
    assert rec["taken_over_by"] == third.name, rec
    assert cluster.heads([a.key(gone["name"])]) == {}, "a deleted file came back from the old holder's copy"


def test_what_keeping_the_node_records_costs_does_not_grow_with_the_cluster(cluster: Cluster) -> None:
    """Issue 44: five real daemons, replicating, and in steady state each renews its record and lists the others' per
    third of the lease, reading none of them in full (before: a GET of each of the four others each time). Counted by
    each daemon (`ckptfs status --json` `membership`, `ckptfs_membership_requests_total`), compared with its own
    renewals over the same stretch: no clock in the assertion."""
    nodes = [cluster.node(f"n{i}", peer_lease_ttl=3) for i in range(5)]
    cluster.wait_live([n.name for n in nodes])
    write_random(nodes[0].path / "a.bin", 1 * MiB, seed=1)  # a channel open, replicas held: not an idle cluster
    before = {n.name: n.status()["membership"]["requests"] for n in nodes}
    wait_until("ten renewals on every node", lambda: all(
        n.status()["membership"]["requests"]["put"] - before[n.name]["put"] >= 10 for n in nodes), 120)
    for n in nodes:
        st = n.status()["membership"]
        assert st["backend"] == "bucket" and st["stale_seconds"] is not None
        done = {k: st["requests"][k] - before[n.name][k] for k in ("put", "list", "get")}
        assert done["get"] <= done["put"] // 4, (n.name, done)  # it was 4 GETs a renewal
        assert done["list"] >= done["put"] // 2, (n.name, done)  # still reading the others: by the LIST
        assert n.metric("ckptfs_membership_requests_total", 'kind="put"') >= st["requests"]["put"]
        print(f"{n.name}: {done}")
