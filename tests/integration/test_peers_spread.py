"""The load bound (gateway/peers/spread.py, issue 44) on real daemons: six mounts of one bucket whose names make one
node, h, the first rendezvous choice of three owners. With peer_replicas = 1 a node takes 2 owners: the third is
sent on to its next candidate, and its fsync is still replicated (never single-copy); h counts what it redirected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from ckptfs.peers.records import rendezvous
from tests.conftest import peer_cluster, write_random
from tests.support.peer_nodes import Cluster, wait_until
from tests.support.seaweed import SeaweedServer

MiB = 1 << 20
OWNERS = ["o0-22", "o1-22", "o2-22"]  # each puts h-22 first among h, x, y (checked below)
HOT, OTHERS = "h-22", ["x-22", "y-22"]


@pytest.fixture
def cluster(s3: SeaweedServer, bucket: str, tmp_path: Path) -> Iterator[Cluster]:
    yield from peer_cluster(s3, bucket, tmp_path, upload_delay=3600, on_no_peer="fail")


@pytest.mark.one_transport
def test_a_node_past_its_share_of_owners_sends_the_next_one_on_and_every_write_is_replicated(cluster: Cluster) -> None:
    assert all(rendezvous(o, [HOT, *OTHERS])[0] == HOT for o in OWNERS)
    # the holders first: an owner connects to its best candidate live when it starts and stays there while it
    # answers, so one started before x and y existed would have had only h, and been taken insisting
    nodes = {HOT: cluster.node(HOT, failure_domain="r2")}
    for n in OTHERS:
        nodes[n] = cluster.node(n, failure_domain="r3")
    cluster.wait_live([HOT, *OTHERS])
    for n in OWNERS:
        nodes[n] = cluster.node(n, failure_domain="r1")
    cluster.wait_live(list(nodes))
    for i, o in enumerate(OWNERS):  # on_no_peer = fail: an fsync that returns has a peer copy
        write_random(nodes[o].path / f"shard_{i}.bin", 2 * MiB, seed=i)
    holders = {o: [p["node"] for p in nodes[o].status()["peers"] if p.get("connected")] for o in OWNERS}
    on_hot = [o for o in OWNERS if holders[o] == [HOT]]
    assert len(on_hot) == 2, holders  # its share: 2 x peer_replicas
    sent_on = [o for o in OWNERS if o not in on_hot]
    assert len(holders[sent_on[0]]) == 1 and holders[sent_on[0]][0] in OTHERS, holders
    assert nodes[HOT].metric("ckptfs_peer_owners_redirected_total") >= 1
    for o in OWNERS:
        assert nodes[o].status()["peer_degraded_writes_total"] == 0 and nodes[o].state(f"shard_{OWNERS.index(o)}.bin") == "replicated"
    wait_until("h to hold two owners' replicas and the other one the third's",
               lambda: sorted(o for o in OWNERS if nodes[HOT].replica_files(o)) == sorted(on_hot)
               and nodes[holders[sent_on[0]][0]].replica_files(sent_on[0]) != [], 60)
