"""Membership (gateway/peers/membership.py): node records, the lease and its fence, dead nodes, takeover claims,
the choice of peers. Against the in-memory store (tests/support/memstore.py, whose conditional writes answer as
S3's do) with clocks the tests move: a node "paused" is one whose clocks jumped past its ttl. The proof that the
conditional writes give one winner on a real S3 server is tests/integration/test_peer_membership.py.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
import trio
import trio.testing

from ckptfs.config import load_config
from ckptfs.journal import ROOT_INODE
from ckptfs.peers.membership import Membership
from ckptfs.peers.records import DOWN, LIVE, TAKEN_OVER, is_dead, rendezvous
from tests.support.memstore import MemoryStore
from tests.unit.test_drain_faults import BOUND, drainer, durable, namespace
from tests.unit.test_journal import write_file

TTL = 30.0


class Clock:
    """Wall and monotonic time of one node, moved by the test (a pause moves both)."""

    def __init__(self, now: float | None = None) -> None:
        self.now = time.time() if now is None else now

    def __call__(self) -> float:
        return self.now


def key_of(path: str) -> str:
    return f"p/{path}"


def config(**kw: Any) -> Any:
    return load_config(environ={}, overrides=dict(bucket="ckpt", prefix="p", mountpoint="/m", cache_dir="/tmp",
                                                  peer_lease_ttl=TTL, **kw))


def node(store: MemoryStore, name: str, clock: Clock, domain: str = "", peers: list[str] | None = None,
         incarnation: str | None = None) -> Membership:
    return Membership(config(failure_domain=domain, peers=peers or []), store, key_of, name, incarnation or f"{name}-1",
                      f"10.0.0.{ord(name[0]) % 250}:7470", clock=clock, monotonic=clock)


def record(store: MemoryStore, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(store.objects[f"p/.ckptfs/nodes/{name}.json"].body)
    return doc


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return trio.run(fn)


# ------------------------------------------------------------ announce, renew, expiry
def test_announce_writes_a_live_record_and_renewals_push_its_expiry() -> None:
    store, clock = MemoryStore(), Clock()
    a = node(store, "a", clock, domain="rack1")
    run(a.announce)
    doc = record(store, "a")
    assert doc["format"] == "ckptfs-node/1"
    assert (doc["node"], doc["incarnation"], doc["peer_addr"], doc["failure_domain"], doc["state"]) == (
        "a", "a-1", a.peer_addr, "rack1", "live")
    assert doc["expires_at"] == clock.now + TTL and doc["takeover_done"] is False
    assert a.record_at_start is None and not a.must_reconcile and not a.fenced and a.lease_valid()
    first_etag = store.objects["p/.ckptfs/nodes/a.json"].etag
    assert store.calls["put_bytes"] and all(c[0] == "p/.ckptfs/nodes/a.json" for c in store.calls["put_bytes"])

    clock.now += TTL / 3
    run(a.renew)
    doc = record(store, "a")
    assert doc["expires_at"] == clock.now + TTL and doc["renewed_at"] == clock.now
    assert store.objects["p/.ckptfs/nodes/a.json"].etag != first_etag
    assert a.lease_valid()
    # the local lease ends before the record expires (the margin), by the node's own clock
    clock.now += TTL * 0.76
    assert not a.lease_valid()


def test_a_restarted_node_takes_its_live_record_back_with_a_new_incarnation() -> None:
    store, clock = MemoryStore(), Clock()
    run(node(store, "a", clock).announce)
    again = node(store, "a", clock, incarnation="a-2")
    run(again.announce)
    assert again.record_at_start is not None and again.record_at_start.incarnation == "a-1"
    assert record(store, "a")["incarnation"] == "a-2" and again.lease_valid() and not again.must_reconcile


def test_a_node_not_renewed_for_its_ttl_is_dead_and_down() -> None:
    store, clock = MemoryStore(), Clock()
    a, b = node(store, "a", clock), node(store, "b", clock)

    async def main() -> None:
        await a.announce()
        await b.announce()
        await b.refresh()
        assert [(p.node, p.state, p.addr) for p in b.peers()] == [("a", LIVE, a.peer_addr)]
        assert b.dead() == []
        clock.now += TTL / 2
        await b.renew()
        await b.refresh()
        assert b.dead() == []  # half a ttl without a renewal: still live
        clock.now += TTL / 2 + 0.001
        await b.renew()
        await b.refresh()
        assert b.dead() == ["a"]
        assert [(p.node, p.state) for p in b.peers()] == [("a", DOWN)]
        assert b.targets() == []
        assert not a.lease_valid()  # a knows it by its own clock before anyone could claim it

    run(main)


def test_down_names_a_node_whose_record_ran_out_only_while_the_records_are_fresh() -> None:
    """The sender closes its channels to `down()` nodes: a peer that died silently is dropped once its lease runs
    out. Records this node could not read again (cut from the store) say nothing: no peer is taken for down then."""
    store, clock = MemoryStore(), Clock()
    a, b = node(store, "a", clock), node(store, "b", clock)

    async def main() -> None:
        await a.announce()
        await b.announce()
        assert b.down() == set()  # nothing read yet
        await b.refresh()
        assert b.down() == set()
        clock.now += TTL + 0.001  # a renewed nothing for its ttl
        await b.refresh()
        assert b.down() == {"a"}
        clock.now += TTL / 2 + 0.001  # b's last read is older than half a ttl: what it knows is stale
        assert b.down() == set()
        await a.renew()  # a is back (its record live again)
        await b.refresh()
        assert b.down() == set()

    run(main)


def test_a_refresh_gets_only_the_records_that_changed() -> None:
    store, clock = MemoryStore(), Clock()
    nodes = [node(store, n, clock) for n in "abcd"]

    async def main() -> None:
        for m in nodes:
            await m.announce()
        await nodes[0].refresh()
        store.calls.clear()
        clock.now += 1  # a renewal changes the body (and so the ETag) only if time moved
        await nodes[1].renew()
        await nodes[0].refresh()

    run(main)
    assert len(store.calls["list"]) == 1
    assert [c[0] for c in store.calls["get_bytes"]] == ["p/.ckptfs/nodes/b.json"]


# ------------------------------------------------------------ claims
class BarrierStore(MemoryStore):
    """Holds the writes of one key until `parties` of them arrive: every claimer has read the record before any writes."""

    def __init__(self, key: str, parties: int) -> None:
        super().__init__()
        self.key = key
        self.barrier = threading.Barrier(parties, timeout=BOUND)

    def put_bytes(self, key: str, body: bytes, **kw: Any) -> str:
        if key == self.key:
            self.barrier.wait()
        return super().put_bytes(key, body, **kw)


@pytest.mark.parametrize("claimers", [2, 5])
def test_concurrent_claimers_of_a_dead_node_have_exactly_one_winner(claimers: int) -> None:
    store = BarrierStore("p/.ckptfs/nodes/dead.json", claimers)
    clock = Clock()
    dead = node(store, "dead", clock)
    others = [node(store, f"n{i}", clock) for i in range(claimers)]

    async def main() -> list[bool]:
        store.barrier = threading.Barrier(1)
        await dead.announce()
        for m in others:
            await m.announce()
        clock.now += TTL + 1
        for m in others:
            await m.renew()
        for m in others:
            await m.refresh()
            assert m.dead() == ["dead"]
        store.barrier = threading.Barrier(claimers, timeout=BOUND)
        won: list[bool] = [False] * claimers

        async def claim(i: int) -> None:
            won[i] = await others[i].claim("dead")

        async with trio.open_nursery() as nursery:
            for i in range(claimers):
                nursery.start_soon(claim, i)
        return won

    won = run(main)
    assert won.count(True) == 1
    winner = others[won.index(True)]
    doc = record(store, "dead")
    assert (doc["state"], doc["taken_over_by"], doc["taken_over_by_incarnation"], doc["takeover_done"]) == (
        TAKEN_OVER, winner.me, winner.incarnation, False)
    assert winner.claims_total == 1 and sum(m.claims_total for m in others) == 1


def test_a_live_node_cannot_be_claimed_and_a_node_without_a_lease_claims_nobody() -> None:
    store, clock = MemoryStore(), Clock()
    a, b = node(store, "a", clock), node(store, "b", clock)

    async def main() -> None:
        await a.announce()
        await b.announce()
        assert not await b.claim("a")  # live
        clock.now += TTL + 1
        assert not await b.claim("a")  # dead, but b's own lease lapsed too: it proves nothing about itself
        await b.renew()
        assert await b.claim("a")
        assert not await b.claim("a")  # already ours

    run(main)


def test_only_the_holders_an_owners_record_lists_may_claim_it() -> None:
    """Campaign seed 396681806 episode 73: the owner moved from a full holder (b) to another (c) and sent c a delete
    b never saw. Its record lists c once c's copies count; b, holding older copies, may no longer claim it."""
    store, clock = MemoryStore(), Clock()
    a, b, c = node(store, "a", clock), node(store, "b", clock), node(store, "c", clock)
    listed: list[int] = []
    a.listing.on_listed = lambda: listed.append(1)

    async def main() -> None:
        for m in (a, b, c):
            await m.announce()
        assert record(store, "a")["holders"] == [] and a.listing.listed() == frozenset()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.listing.run)
            a.listing.ask(["b"])
            with trio.fail_after(BOUND):
                while not listed:
                    await trio.sleep(0.01)
            assert record(store, "a")["holders"] == ["b"] and a.listing.listed() == {"b"}
            a.listing.ask(["c"])  # b stopped taking a's changes; c is ready
            with trio.fail_after(BOUND):
                while len(listed) < 2:
                    await trio.sleep(0.01)
            assert record(store, "a")["holders"] == ["c"] and a.listing.listed() == {"c"}
            puts = len(store.calls["put_bytes"])
            a.listing.ask(["c"])  # listed already: nothing written
            await trio.sleep(0.1)
            assert len(store.calls["put_bytes"]) == puts and len(listed) == 2
            nursery.cancel_scope.cancel()
        clock.now += TTL + 1
        for m in (b, c):
            await m.renew()
        assert not await b.claim("a")  # dead, but b is not listed: its copies are older than c's
        assert record(store, "a")["state"] == LIVE
        assert await c.claim("a")

    run(main)


def test_a_restart_with_the_same_journal_keeps_the_holders_its_previous_incarnation_listed() -> None:
    store, clock = MemoryStore(), Clock()
    first = Membership(config(), store, key_of, "a", "a-1", "10.0.0.1:7470", clock=clock, monotonic=clock, journal_id="j1")

    async def main() -> None:
        await first.announce()
        first.listing.wanted = ["b"]
        await first.renew()
        again = Membership(config(), store, key_of, "a", "a-2", "10.0.0.1:7470", clock=clock, monotonic=clock, journal_id="j1")
        await again.announce()
        assert record(store, "a")["holders"] == ["b"] and again.listing.listed() == {"b"}
        store.objects.pop("p/.ckptfs/nodes/a.json")
        first.listing.wanted = ["b"]
        await first.announce()
        other = Membership(config(), store, key_of, "a", "a-3", "10.0.0.1:7470", clock=clock, monotonic=clock, journal_id="j2")
        assert other.listing.wanted == []  # another journal: nothing its predecessor counted is its own

    run(main)


def test_an_unfinished_takeover_whose_taker_died_is_claimed_again() -> None:
    store, clock = MemoryStore(), Clock()
    a, b, c = node(store, "a", clock), node(store, "b", clock), node(store, "c", clock)

    async def main() -> None:
        for m in (a, b, c):
            await m.announce()
        clock.now += TTL + 1
        await b.renew()
        await c.renew()
        assert await b.claim("a")
        await c.refresh()
        assert c.dead() == []  # taken over by a live b: not c's to take
        assert not await c.claim("a")
        clock.now += TTL + 1  # b dies before marking the takeover done
        await c.renew()
        await c.refresh()
        assert sorted(c.dead()) == ["a", "b"]
        assert await c.claim("a")
        assert record(store, "a")["taken_over_by"] == "c"
        assert not await b.mark_takeover_done("a"), "the dead taker's claim is no longer its own"
        assert await c.mark_takeover_done("a")
        doc = record(store, "a")
        assert doc["takeover_done"] is True and doc["taken_over_by"] == "c"
        await c.refresh()
        assert c.dead() == ["b"]  # a's takeover finished: nothing left to take over

    run(main)


def test_a_taker_that_restarted_has_forgotten_its_takeover_so_it_is_claimable() -> None:
    store, clock = MemoryStore(), Clock()
    a, b, c = node(store, "a", clock), node(store, "b", clock), node(store, "c", clock)

    async def main() -> None:
        for m in (a, b, c):
            await m.announce()
        clock.now += TTL + 1
        await b.renew()
        await c.renew()
        assert await b.claim("a")
        await node(store, "b", clock, incarnation="b-2").announce()  # b restarts: a new incarnation, live
        await c.refresh()
        assert c.dead() == ["a"]
        assert await c.claim("a")

    run(main)


# ------------------------------------------------------------ the fence
def test_a_paused_node_is_fenced_before_it_uploads(tmp_path: Path) -> None:
    """Node a has a file to drain; it is paused past its ttl (its clocks jump), b takes it over meanwhile. When a
    runs again its drain, gated by its membership, sends nothing: its renewal finds the record taken over."""
    ns, store = namespace(tmp_path), MemoryStore()
    clock_a, clock_b = Clock(), Clock()
    a, b = node(store, "a", clock_a), node(store, "b", clock_b)
    ino = write_file(ns, ROOT_INODE, "shard.bin", os.urandom(1000))
    d = drainer(ns, store)
    asked: list[int] = []

    async def gate() -> None:
        asked.append(1)
        await a.admit()

    d.gate = gate

    async def main() -> None:
        await a.announce()
        await b.announce()
        clock_a.now += TTL + 5  # a was stopped (SIGSTOP) for longer than its ttl
        clock_b.now += TTL + 5
        await b.renew()
        await b.refresh()
        assert await b.claim("a")
        async with trio.open_nursery() as nursery:
            await nursery.start(d.run)
            with trio.fail_after(BOUND):
                while not asked:  # the upload is at the gate: a's lease lapsed by its own clock
                    await trio.sleep(0.005)
            await a.renew()
            assert a.fenced and a.must_reconcile and a.state() == "fenced"
            await a.renew()  # still fenced: renewing does not write over the takeover
            assert record(store, "a")["taken_over_by"] == "b"
            assert "p/shard.bin" not in store.objects and "put_object_body" not in store.calls
            assert not durable(ns, ino)
            # the takeover finishes; a reconciles (the takeover helper's job) and rejoins: the gate opens
            assert await b.mark_takeover_done("a")
            assert await a.takeover_settled()
            assert await a.rejoin()
            assert not a.fenced and a.incarnation != "a-1" and a.lease_valid()
            with trio.fail_after(BOUND):
                while not durable(ns, ino):
                    await trio.sleep(0.005)
            nursery.cancel_scope.cancel()

    run(main)
    doc = record(store, "a")
    assert (doc["state"], doc["incarnation"]) == (LIVE, a.incarnation)


def test_admit_waits_for_a_renewal_when_the_lease_lapsed_without_a_takeover() -> None:
    store, clock = MemoryStore(), Clock()
    a = node(store, "a", clock)
    admitted: list[float] = []

    async def main() -> None:
        await a.announce()
        await a.admit()  # valid: at once
        clock.now += TTL
        async with trio.open_nursery() as nursery:
            async def upload() -> None:
                await a.admit()
                admitted.append(clock.now)

            nursery.start_soon(upload)
            await trio.testing.wait_all_tasks_blocked()
            assert admitted == []
            clock.now += 1
            await a.renew()  # nobody took it over: the renewal succeeds and the waiting upload goes on
        assert admitted == [clock.now] and not a.fenced

    run(main)


def test_a_node_back_after_a_takeover_reconciles_before_it_uploads() -> None:
    store, clock = MemoryStore(), Clock()
    a, b = node(store, "a", clock), node(store, "b", clock)

    async def main() -> None:
        await a.announce()
        await b.announce()
        clock.now += TTL + 1
        await b.renew()
        assert await b.claim("a")
        back = node(store, "a", clock, incarnation="a-2")  # a's daemon restarted with its cache intact
        await back.announce()
        assert back.record_at_start is not None and back.record_at_start.state == TAKEN_OVER
        assert back.must_reconcile and back.fenced and not back.lease_valid()
        assert record(store, "a")["taken_over_by"] == "b"  # announcing did not write over the takeover
        assert not await back.takeover_settled()  # b still at work
        assert not await back.rejoin()  # too early: still fenced
        assert back.fenced
        assert await b.mark_takeover_done("a")
        assert await back.takeover_settled()
        assert await back.rejoin()
        assert not back.must_reconcile and back.lease_valid()
        assert record(store, "a")["state"] == LIVE

    run(main)


def test_a_node_back_whose_taker_died_claims_itself_so_nobody_else_does() -> None:
    store, clock = MemoryStore(), Clock()
    a, b, c = node(store, "a", clock), node(store, "b", clock), node(store, "c", clock)

    async def main() -> None:
        for m in (a, b, c):
            await m.announce()
        clock.now += TTL + 1
        await b.renew()
        assert await b.claim("a")
        clock.now += TTL + 1  # b dies unfinished
        back = node(store, "a", clock, incarnation="a-2")
        await back.announce()
        assert back.fenced
        assert await back.takeover_settled()
        doc = record(store, "a")
        assert (doc["taken_over_by"], doc["taken_over_by_incarnation"]) == ("a", "a-2")
        await c.renew()
        await c.refresh()
        assert "a" not in c.dead()
        assert not await c.claim("a"), "a reconciles its own files: nobody else takes them"
        clock.now += TTL / 3
        await back.renew()  # keeps its self-claim alive while it reconciles
        clock.now += TTL * 0.9
        await c.renew()
        await c.refresh()
        assert "a" not in c.dead()
        assert await back.rejoin()
        assert record(store, "a")["state"] == LIVE

    run(main)


# ------------------------------------------------------------ the choice of peers
def test_rendezvous_order_is_deterministic_and_moves_little_when_a_node_leaves() -> None:
    names = [f"node-{i}" for i in range(12)]
    order = rendezvous("owner", names)
    for _ in range(5):
        shuffled = random.sample(names, len(names))
        assert rendezvous("owner", shuffled) == order
    assert "owner" not in rendezvous("owner", names + ["owner"])
    gone = order[0]
    assert rendezvous("owner", [n for n in names if n != gone]) == order[1:]  # the rest keep their order
    assert rendezvous("other", names) != order  # each owner its own order


def test_targets_are_live_nodes_of_other_failure_domains_in_rendezvous_order() -> None:
    store, clock = MemoryStore(), Clock()
    me = node(store, "me", clock, domain="rack1")
    same = node(store, "same", clock, domain="rack1")
    others = [node(store, f"r2-{i}", clock, domain="rack2") for i in range(4)]
    blank = node(store, "blank", clock, domain="")
    stale = node(store, "stale", clock, domain="rack3")

    async def main() -> None:
        await stale.announce()
        clock.now += TTL + 1  # stale stops renewing
        for m in [me, same, blank, *others]:
            await m.announce()
        await me.refresh()

    run(main)
    targets = [p.node for p in me.targets()]
    assert "same" not in targets and "stale" not in targets and "me" not in targets
    assert sorted(targets) == sorted(["blank", *(m.me for m in others)])
    assert targets == rendezvous("me", targets)
    # an empty domain of my own: every other node is another domain
    mine_blank = node(store, "me", clock, domain="")
    mine_blank._records = me._records
    assert "same" in [p.node for p in mine_blank.targets()]


def test_static_peers_give_addresses_and_domains_and_the_records_give_liveness() -> None:
    store, clock = MemoryStore(), Clock()
    static = ["b=10.1.0.2:7470@rack2", "c=10.1.0.3:7471@rack2", "d=10.1.0.4:7470@rack1", "me=10.1.0.1:7470@rack1"]
    me = node(store, "me", clock, domain="rack1", peers=static)
    b, d, x = node(store, "b", clock), node(store, "d", clock), node(store, "x", clock)

    async def main() -> None:
        for m in (me, b, d, x):
            await m.announce()
        await me.refresh()

    run(main)
    assert [(p.node, p.addr, p.failure_domain, p.state) for p in me.peers()] == [
        ("b", "10.1.0.2:7470", "rack2", LIVE),  # the list's address, not the one b announced
        ("c", "10.1.0.3:7471", "rack2", DOWN),  # no record: down
        ("d", "10.1.0.4:7470", "rack1", LIVE),
    ]  # x announced itself but is not in the list; me is not my own peer
    assert [p.node for p in me.targets()] == ["b"]  # c down, d in my domain


def test_a_static_peer_without_a_domain_takes_the_one_its_record_announces() -> None:
    store, clock = MemoryStore(), Clock()
    me = node(store, "me", clock, domain="rack1", peers=["b=10.1.0.2:7470", "c=10.1.0.3:7470"])
    b, c = node(store, "b", clock, domain="rack1"), node(store, "c", clock, domain="rack2")

    async def main() -> None:
        for m in (me, b, c):
            await m.announce()
        await me.refresh()

    run(main)
    assert [(p.node, p.failure_domain) for p in me.peers()] == [("b", "rack1"), ("c", "rack2")]
    assert [p.node for p in me.targets()] == ["c"]


def test_a_record_this_version_cannot_read_is_ignored_and_our_own_is_written_over() -> None:
    store, clock = MemoryStore(), Clock()
    a = node(store, "a", clock)
    for name in ("a", "b"):
        store.put_bytes(f"p/.ckptfs/nodes/{name}.json", b'{"format": "ckptfs-node/9", "node": "%s"}' % name.encode())

    async def main() -> None:
        await a.announce()
        await a.refresh()

    run(main)
    assert record(store, "a")["state"] == LIVE and a.lease_valid()
    assert a.peers() == [] and a.dead() == []  # b's record says nothing this version may act on
    assert record(store, "b")["format"] == "ckptfs-node/9"  # and it is left alone


def test_is_dead_of_a_takeover_follows_its_taker() -> None:
    clock = Clock()
    store = MemoryStore()
    a, b = node(store, "a", clock), node(store, "b", clock)
    run(a.announce)
    run(b.announce)
    rec_a = a.record_of("a")
    rec_b = b.record_of("b")
    assert rec_a is not None and rec_b is not None
    claimed = rec_a.claimed_by("b", "b-1", clock.now)
    assert not is_dead(claimed, {"b": rec_b}, clock.now)
    assert is_dead(claimed, {}, clock.now)  # the taker's record is gone
    assert is_dead(claimed, {"b": rec_b}, clock.now + TTL + 1)  # the taker expired


# ------------------------------------------------------------ the service
def test_run_announces_renews_and_reads_the_others_on_its_own() -> None:
    """With real clocks and a short ttl: the record's renewed_at moves on, and another node appears live."""
    store = MemoryStore()
    cfg = config(failure_domain="")
    cfg.peer_lease_ttl = 1.5
    a = Membership(cfg, store, key_of, "a", "a-1", "127.0.0.1:7470")
    b = Membership(cfg, store, key_of, "b", "b-1", "127.0.0.1:7471")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            first = record(store, "a")["renewed_at"]
            with trio.fail_after(BOUND):
                while record(store, "a")["renewed_at"] == first or [p.node for p in a.targets()] != ["b"]:
                    await trio.sleep(0.01)
            await a.admit()
            nursery.cancel_scope.cancel()

    run(main)


def test_membership_requests_are_counted_by_kind_and_a_refresh_reads_changed_records_at_once() -> None:
    """Issue 44: what the records cost (ckptfs_membership_requests_total). A refresh after every other node renewed
    GETs each changed record, 16 at a time (not one after another); a GET that fails fails the refresh with the
    store's error (not a group of them): what it read is kept, the rest keeps its last view."""
    from ckptfs.objects import StoreError
    from ckptfs.peers.requests import CountedStore

    store, clock = MemoryStore(), Clock()
    counted = CountedStore(store)
    me = Membership(config(), counted, key_of, "me", "me-1", "10.0.0.1:7470", clock=clock, monotonic=clock)  # type: ignore[arg-type]
    others = [node(store, f"n{i:02d}", clock) for i in range(40)]
    in_flight, most = [0], [0]
    get = store.get_bytes

    def slow_get(key: str) -> tuple[bytes, str]:
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        time.sleep(0.02)
        in_flight[0] -= 1
        return get(key)

    async def main() -> None:
        await me.announce()
        for m in others:
            await m.announce()
        assert dict(counted.counts) == {"list": 0, "get": 1, "put": 1, "delete": 0}  # our record read, then written
        store.get_bytes = slow_get  # type: ignore[method-assign]
        await me.refresh()
        assert len(me.peers()) == 40 and dict(counted.counts) == {"list": 1, "get": 41, "put": 1, "delete": 0}
        assert 1 < most[0] <= 16
        await me.refresh()  # nothing changed: the LIST alone
        assert dict(counted.counts) == {"list": 2, "get": 41, "put": 1, "delete": 0}
        clock.now += TTL / 3
        for m in others:
            await m.renew()
        store.fail("get_bytes", "server", times=1)
        with pytest.raises(StoreError):
            await me.refresh()
        assert len(me.peers()) == 40  # the last view, kept

    run(main)


def test_a_refresh_reads_in_full_only_the_records_this_node_needs_and_confirms_a_death_it_assumed_away() -> None:
    """Issue 44: at N nodes a refresh made N-1 GETs (every renewal changes every record). Now the records this node
    needs (`interest`) are read at each change; another's change is taken for a renewal (no GET) until it stops
    changing for a ttl: then it is down, read in full only by the nodes its record lists as holders (they claim it),
    so a node taken over shows taken_over there (up to a ttl late: the price). A node that becomes needed is read in
    full at the next refresh."""
    from ckptfs.peers.requests import CountedStore

    store, clock = MemoryStore(), Clock()
    counted = CountedStore(store)
    me = Membership(config(), counted, key_of, "me", "me-1", "10.0.0.1:7470", clock=clock, monotonic=clock)  # type: ignore[arg-type]
    others = {f"n{i:02d}": node(store, f"n{i:02d}", clock) for i in range(30)}
    interest = {"n00", "n01"}
    me.interest = lambda: set(interest)

    async def renew_all(skip: set[str] = set()) -> None:
        for name, m in others.items():
            if name not in skip:
                await m.renew()

    async def main() -> None:
        await me.announce()
        for m in others.values():
            await m.announce()
        await me.refresh()  # every record is new: read in full once
        gets = counted.counts["get"]
        for _ in range(3):
            clock.now += TTL / 3
            await me.renew()
            await renew_all()
            await me.refresh()
        assert counted.counts["get"] - gets == 3 * 2  # n00 and n01 at each of their changes, nobody else
        assert {p.node for p in me.peers() if p.state == LIVE} == set(others)
        # n05 dies, n07 (whose replicas this node holds, with n08) is taken over by n08, n09 becomes needed
        me.confirming = lambda: {"n07"}
        gets = counted.counts["get"]
        for _ in range(4):
            clock.now += TTL / 3
            await me.renew()
            await renew_all(skip={"n05", "n07"})
            if _ == 3:
                await others["n08"].refresh()
                assert await others["n08"].claim("n07")
            await me.refresh()
        assert "n05" in me.down() and "n05" in me.dead() and me.assumed("n05")  # down, no GET: not its holder
        assert {p.node: p.state for p in me.peers()}["n07"] == LIVE  # its claim taken for a renewal, for now
        for _ in range(4):  # a ttl with no change: read in full
            clock.now += TTL / 3
            await me.renew()
            await renew_all(skip={"n05", "n07"})
            await me.refresh()
        assert {p.node: p.state for p in me.peers()}["n07"] == TAKEN_OVER
        interest.add("n09")
        await me.refresh()
        assert me.record_of("n09") == await me._read("n09")  # read in full, not the assumed copy
        assert counted.counts["get"] - gets <= 8 * 2 + 6  # the two needed, a few confirmations: not 29 a round (8 * 29)

    run(main)


def test_a_record_not_read_yet_is_read_in_full_only_when_it_is_among_the_first_candidates_or_needed() -> None:
    """Issue 44: a node read every record in full when it first appeared, so a cluster started at once made N^2 GETs
    (a million at 1,000 nodes: S3 throttled them for minutes and the views went stale). Now it reads, of the records
    it has not read, its first candidates in rendezvous order (peer_replicas + 2 live ones of another domain), the
    owners it holds and the nodes it needs; the others it knows from the LIST alone: live while they change, down
    once they stop, with no address (never a target) and no peer_up series once silent."""
    from ckptfs.metrics import peer_families
    from ckptfs.peers.candidates import SPARES
    from ckptfs.peers.records import rendezvous_score
    from ckptfs.peers.requests import CountedStore

    store, clock = MemoryStore(), Clock()
    store.clock = clock
    counted = CountedStore(store)
    me = Membership(config(failure_domain="rack1"), counted, key_of, "me", "me-1", "10.0.0.1:7470",  # type: ignore[arg-type]
                    clock=clock, monotonic=clock)
    domains = {f"n{i:02d}": "rack1" if i % 4 == 0 else "rack2" for i in range(40)}
    others = {name: node(store, name, clock, domain=d) for name, d in domains.items()}
    interest: set[str] = set()
    me.interest = lambda: set(interest)
    order = rendezvous("me", others)

    def first_candidates(skip: set[str] = set()) -> list[str]:
        """The prefix of `order` a walk reads: up to the 1 + SPARES-th live node of another domain (not skipped)."""
        out, found = [], 0
        for n in order:
            if n in skip or n in dead:
                continue
            out.append(n)
            found += domains[n] != "rack1"
            if found == 1 + SPARES:
                return out
        return out

    dead: set[str] = set()

    async def renew_all() -> None:
        for name, m in others.items():
            if name not in dead:
                await m.renew()

    async def main() -> None:
        await me.announce()
        for m in others.values():
            await m.announce()
        gets = counted.counts["get"]
        await me.refresh()
        read = first_candidates()
        assert counted.counts["get"] - gets == len(read) < 10  # not 40
        assert [p.node for p in me.targets()] == [n for n in read if domains[n] == "rack2"]
        states = {p.node: p for p in me.peers()}
        assert len(states) == 40 and all(p.state == LIVE for p in states.values())
        unread = sorted(set(others) - set(read))
        assert all(states[n].known_from == "listing" and states[n].addr == "" for n in unread)
        assert all(states[n].known_from == "record" and states[n].addr for n in read)
        # renewals, a ttl of them: the LIST alone (no GET), everyone still live
        gets = counted.counts["get"]
        for _ in range(3):
            clock.now += TTL / 3
            await me.renew()
            await renew_all()
            await me.refresh()
        assert counted.counts["get"] == gets and all(p.state == LIVE for p in me.peers())
        # a new node that ranks first joins: read at the next refresh, and first of the targets
        name = next(f"new{i}" for i in range(10_000) if rendezvous_score("me", f"new{i}") > rendezvous_score("me", order[0]))
        others[name], domains[name] = node(store, name, clock, domain="rack2"), "rack2"
        await others[name].announce()
        await me.refresh()
        assert counted.counts["get"] == gets + 1 and me.targets()[0].node == name
        # the connections to two targets fail (the sender names them in `interest`): they are read at each change, and
        # candidates further down the order until 1 + SPARES usable ones are known again
        first, second = [p.node for p in me.targets()][:2]
        interest.update({first, second})
        clock.now += TTL / 3
        await me.renew()
        await renew_all()
        gets = counted.counts["get"]
        await me.refresh()
        usable = [p.node for p in me.targets() if p.node not in interest]
        assert counted.counts["get"] - gets >= 3 and len(usable) == 1 + SPARES
        assert usable == [n for n in rendezvous("me", others) if domains[n] == "rack2" and n not in interest][:1 + SPARES]
        # an unread node dies: down after a ttl with no GET, and no ckptfs_peer_up series from this node
        victim = next(p.node for p in me.peers() if p.addr == "")  # never read in full
        dead.add(victim)
        gets = counted.counts["get"]
        for _ in range(4):
            clock.now += TTL / 3
            await me.renew()
            await renew_all()
            await me.refresh()
        assert counted.counts["get"] - gets == 4 * 2  # the two needed at each of their changes, nothing for the victim
        state = {p.node: p for p in me.peers()}[victim]
        assert state.state == DOWN and state.known_from == "listing" and victim not in {p.node for p in me.targets()}
        up = [f for f in peer_families({"peers": me.status()["peers"]}) if f.name == "ckptfs_peer_up"][0]
        labelled = {s.labels["peer"]: s.value for s in up.samples}
        assert victim not in labelled and labelled[first] == 1.0 and len(labelled) == len(others) - 1
        # the owners it holds are read in full as they appear, like the nodes it needs
        me.confirming = lambda: {"late"}
        others["late"] = node(store, "late", clock, domain="rack2")
        await others["late"].announce()
        await me.refresh()
        assert {p.node: p for p in me.peers()}["late"].known_from == "record"

    run(main)


def test_a_record_first_seen_long_after_it_was_last_written_is_down_without_a_get() -> None:
    """The LIST's LastModified dates a record known from the LIST alone: a node that stopped renewing a ttl before
    this node first listed it (it died, left or was taken over while this node was away) is down at once, and
    never read as a candidate."""
    from ckptfs.peers.requests import CountedStore

    store, clock = MemoryStore(), Clock()
    store.clock = clock
    counted = CountedStore(store)
    me = Membership(config(), counted, key_of, "me", "me-1", "10.0.0.1:7470", clock=clock, monotonic=clock)  # type: ignore[arg-type]
    me.interest = set
    gone = [node(store, f"gone{i}", clock) for i in range(5)]

    async def main() -> None:
        for m in gone:
            await m.announce()
        clock.now += 2 * TTL
        await me.announce()
        gets = counted.counts["get"]
        await me.refresh()
        assert counted.counts["get"] == gets and {p.state for p in me.peers()} == {DOWN} and me.targets() == []

    run(main)
