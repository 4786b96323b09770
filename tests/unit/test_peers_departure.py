"""A node that leaves the cluster (gateway/peers/departure.py, issue 43): a clean unmount says `left` in its record,
nobody claims it, holders drop its replicas, the others list it `left` and alert on nothing; `ckptfs remove-node`
marks a node that will not come back, refusing a live one and one whose takeover has not finished unless forced.
Against the in-memory store, whose conditional writes answer as S3's, with clocks the tests move."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs.metrics import peer_families
from ckptfs.peers.departure import RemoveRefused, leave, remove_node
from ckptfs.peers.membership import peer_state
from ckptfs.peers.records import LEFT, LIVE, NodeRecord, is_dead, is_expired, unclaimed_for
from ckptfs.peers.replicas import ReplicaStore
from ckptfs.peers.sweep import Sweep
from tests.support.memstore import MemoryStore
from tests.unit.test_peers_identity import meta
from tests.unit.test_peers_membership import TTL, Clock, config, node, record, run


def test_a_node_that_leaves_says_so_is_never_claimed_and_stops_renewing() -> None:
    store, clock = MemoryStore(), Clock()
    a, b = node(store, "a", clock), node(store, "b", clock)
    run(a.announce)
    run(b.announce)
    assert run(lambda: leave(a)) is True
    doc = record(store, "a")
    assert doc["state"] == "left" and doc["incarnation"] == "a-1"
    run(a.renew)  # a renewal after the leave writes nothing: the record stays left
    assert record(store, "a")["state"] == "left" and not a.lease_valid()
    clock.now += 10 * TTL
    run(b.refresh)
    assert [(p.node, p.state) for p in b.peers()] == [("a", LEFT)]
    assert b.dead() == [] and b.targets() == [] and run(lambda: b.claim("a")) is False
    assert record(store, "a")["state"] == "left"
    # mounted again (same cache directory, a new incarnation): it announces live over its left record
    a2 = node(store, "a", clock, incarnation="a-2")
    run(a2.announce)
    assert record(store, "a")["state"] == LIVE and a2.lease_valid()


def test_a_left_record_is_not_dead_expires_like_a_finished_takeover_and_shows_as_left() -> None:
    rec = NodeRecord("a", "a-1", "h:1", "", LEFT, 100.0, 100.0)
    assert not is_dead(rec, {}, 10_000.0) and peer_state(rec, 10_000.0) == LEFT
    assert not is_expired(rec, 100.0 + 50, 60) and is_expired(rec, 100.0 + 60, 60)
    assert unclaimed_for(NodeRecord("b", "b-1", "h:2", "", LIVE, 100.0, 70.0), 160.0) == 60.0


def test_a_node_with_its_record_changed_under_it_does_not_leave() -> None:
    store, clock = MemoryStore(), Clock()
    a = node(store, "a", clock)
    run(a.announce)
    other = node(store, "a", clock, incarnation="a-9")  # another daemon renewed the name meanwhile
    run(other.announce)
    assert run(lambda: leave(a)) is False
    assert record(store, "a")["state"] == LIVE and record(store, "a")["incarnation"] == "a-9"


def test_remove_node_refuses_a_live_node_and_an_unfinished_takeover_unless_forced() -> None:
    store, clock = MemoryStore(), Clock()
    a, b, c = node(store, "a", clock), node(store, "b", clock), node(store, "c", clock)
    for m in (a, b, c):
        run(m.announce)
    with pytest.raises(RemoveRefused, match="is live"):
        run(lambda: remove_node(a, "b", False))
    with pytest.raises(RemoveRefused, match="is this node"):
        run(lambda: remove_node(a, "a", False))
    with pytest.raises(RemoveRefused, match="no node zz"):
        run(lambda: remove_node(a, "zz", False))
    clock.now += 2 * TTL  # b and c stop renewing; a renews
    run(a.renew)
    with pytest.raises(RemoveRefused, match="nobody has taken it over yet.*--force"):
        run(lambda: remove_node(a, "b", False))
    assert record(store, "b")["state"] == LIVE
    assert "removed" in run(lambda: remove_node(a, "b", True))
    assert record(store, "b")["state"] == LEFT
    # c taken over by a, to the end: removed without --force
    assert run(lambda: a.claim("c"))
    with pytest.raises(RemoveRefused, match="its takeover by a has not finished"):
        run(lambda: remove_node(a, "c", False))
    assert run(lambda: a.mark_takeover_done("c"))
    assert "removed" in run(lambda: remove_node(a, "c", False))
    assert record(store, "c")["state"] == LEFT
    assert run(lambda: remove_node(a, "c", False)) == "node c already left the cluster"


def test_the_holders_drop_the_replicas_of_a_node_that_left(tmp_path: Path) -> None:
    store, clock = MemoryStore(), Clock()
    a, b = node(store, "a", clock), node(store, "b", clock)
    run(a.announce)
    run(b.announce)
    replicas = ReplicaStore(config(), str(tmp_path))
    replicas.put_entry("a", 5, meta("p/f", 5, 1), "", "a-1")
    assert replicas.owners() == ["a"]
    run(lambda: leave(a))
    run(b.refresh)
    report = run(Sweep(config(), store, replicas, b, clock=clock).once)
    assert report.owners_dropped == ["a"] and replicas.owners() == [] and replicas.held_bytes() == 0


def test_the_metrics_leave_a_node_that_left_out_and_count_a_refusing_peer_down() -> None:
    families = {f.name: f for f in peer_families({"peers": [
        {"node": "b", "state": "live"}, {"node": "c", "state": "refusing", "error": "peer c refused"},
        {"node": "d", "state": "left"}], "peer_unclaimed_nodes": ["e"]})}
    up = {s.labels["peer"]: s.value for s in families["ckptfs_peer_up"].samples}
    assert up == {"b": 1.0, "c": 0.0}
    assert [s.value for s in families["ckptfs_peer_unclaimed_nodes"].samples] == [1.0]


def test_a_leave_or_a_removal_the_store_refuses_changes_nothing_and_says_why() -> None:
    """A failure is a state: the store failing at unmount leaves the record live (its lease runs out, and a holder
    finds nothing to take over); `remove-node` against a failing store raises the store's error (`Peers.remove_node`
    answers it in one line, "cannot be read or written now ... try again") and writes nothing."""
    from ckptfs.objects import StoreError

    store, clock = MemoryStore(), Clock()
    a, b = node(store, "a", clock), node(store, "b", clock)
    run(a.announce)
    run(b.announce)
    store.fail("put_bytes", "server", times=1)
    with pytest.raises(StoreError):
        run(lambda: leave(a))
    assert record(store, "a")["state"] == LIVE and a.lease_valid()
    clock.now += TTL + 1
    run(b.renew)
    run(b.refresh)
    assert b.dead() == ["a"]  # as after a crash: claimable, and its takeover finds nothing to upload
    store.fail("get_bytes", "server", times=1)
    with pytest.raises(StoreError):
        run(lambda: remove_node(b, "a", False))
    assert record(store, "a")["state"] == LIVE
