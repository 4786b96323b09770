"""The membership simulator (bench/peers_scale.py) on a small cluster: the daemon's own Membership for 60 virtual
nodes on the models of S3 and of etcd, on trio's simulated clock (a few seconds of real time). What its report
says must hold where the issue's figures are measured: no false takeover, every dead node claimed about a lease
after its death, at most 3 requests per node per third of the lease on the bucket and none for the LIST on etcd."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from bench.peers_scale import Simulation


@pytest.mark.parametrize("membership", ["bucket", "etcd"])
def test_the_simulator_claims_every_dead_node_once_and_no_live_one(membership: str) -> None:
    sim = Simulation(60, 30.0, seed=3, failure_rate=0.01, membership=membership)
    report = trio.run(sim.run, 1.5, 60.0, clock=trio.testing.MockClock(autojump_threshold=0))
    assert report["false_takeovers"] == 0
    assert report["dead"] == report["dead_claimed"] >= 1
    # its last renewal came up to ttl/3 before the death, and its lease ran a ttl from that renewal
    assert 30.0 * 2 / 3 <= report["death_to_claim_seconds"]["max"] <= 30.0 + 10
    assert report["throttled"] == {}
    if membership == "bucket":
        assert report["requests_per_node_per_third_ttl"] <= 3
    else:
        assert report["requests_per_second"]["list"] == 0 and report["bucket_requests_for_liveness"] == 0
        assert report["requests_per_node_per_third_ttl"] <= 1.5  # a renewal, and the few reads of needed records
