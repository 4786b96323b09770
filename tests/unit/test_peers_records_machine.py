"""The node records as a state machine (issue 42: Hypothesis's stateful testing of the protocol over the in-memory
store): nodes start (with their cache or an empty one), renew, read the others, list their holders, crash, pause
(time passes while they do nothing), claim dead nodes and finish takeovers, in any order Hypothesis draws, and
after every step what the takeover protocol rests on must hold:

* a node that believes its lease valid owns its record: the bucket's record of its name is live, under its
  incarnation (so no claim can have succeeded while it uploads, and no other incarnation renews its name);
* a claim that succeeds was made by a holder the owner's record lists (or by anyone, where it lists none) and only
  once the owner's lease ran out by the shared clock;
* a node whose lease is valid counts copies only on the holders its record in the bucket lists.

A failure is shrunk by Hypothesis to the shortest schedule that shows it (a claim by a holder the record does not list,
or one without the lease check, is found in every run here: 1-2.5 min of shrinking; a pass takes about 8 s). The real daemons' version of the same
questions is the peers campaign (tests/integration/test_peers_campaign.py); this one runs in seconds and reaches
interleavings (a claim racing a restart, a listing written by a node that was just taken over) that real timing
rarely does.
"""

from __future__ import annotations

import json
from typing import Any

import trio
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ckptfs.peers.membership import Membership
from ckptfs.peers.records import LIVE, TAKEN_OVER
from tests.support.memstore import MemoryStore
from tests.unit.test_peers_membership import TTL, Clock, config, key_of

NAMES = ("a", "b", "c", "d")


class NodeRecords(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.clock = Clock(1_000_000.0)
        self.nodes: dict[str, Membership] = {}  # running daemons, by name
        self.journals: dict[str, str] = {}  # name -> the journal id of its cache directory (kept across restarts)
        self.serial = 0

    # ------------------------------------------------------------ helpers
    def record(self, name: str) -> dict[str, Any] | None:
        obj = self.store.objects.get(key_of(f".ckptfs/nodes/{name}.json"))
        return None if obj is None else dict(json.loads(obj.body))

    def run(self, fn: Any) -> Any:
        return trio.run(fn)

    # ------------------------------------------------------------ rules
    @initialize()
    def three_nodes(self) -> None:
        for name in NAMES[:3]:
            self.start(name, False)

    @rule(name=st.sampled_from(NAMES), empty_cache=st.booleans(), needs_all=st.booleans())
    def start(self, name: str, empty_cache: bool, needs_all: bool = True) -> None:
        """A daemon for `name` starts (or restarts): its cache kept, or a new empty one (a new journal); reading every
        changed record in full, or only node a's (the others' changes taken for renewals: membership.py's cost)."""
        self.serial += 1
        if empty_cache or name not in self.journals:
            self.journals[name] = f"{name}-journal-{self.serial}"
        self.nodes.pop(name, None)  # a restart: the old daemon is gone
        m = Membership(config(), self.store, key_of, name, f"{name}-{self.serial}", f"10.0.0.{NAMES.index(name) + 1}:7470",
                       clock=self.clock, monotonic=self.clock, journal_id=self.journals[name])
        m.mounting = False  # no live-duplicate probe (there is no listener here)
        if not needs_all:
            m.interest = lambda: {"a"}
        self.nodes[name] = m
        try:
            self.run(m.announce)
        except Exception:  # noqa: BLE001 - a store that changed under every write: it retries at its renewals
            pass

    @precondition(lambda self: self.nodes)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        m = self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]
        self.run(m.renew)

    @precondition(lambda self: self.nodes)
    @rule(data=st.data())
    def refresh(self, data: st.DataObject) -> None:
        m = self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]
        self.run(m.refresh)

    @precondition(lambda self: self.nodes)
    @rule(data=st.data())
    def list_holders(self, data: st.DataObject) -> None:
        """The owner's sender found these channels ready: its record lists them (holders.py)."""
        m = self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]
        m.listing.ask(data.draw(st.lists(st.sampled_from([n for n in NAMES if n != m.me]), min_size=1, max_size=2, unique=True)))
        if m.copies_uncounted() is None:
            self.run(m.renew)

    @precondition(lambda self: self.nodes)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """The daemon is gone (its record stays as it left it)."""
        del self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]

    @rule(seconds=st.sampled_from([TTL / 3, TTL, 2 * TTL]))
    def time_passes(self, seconds: float) -> None:
        """Every node is paused for this long (or simply does nothing meanwhile)."""
        self.clock.now += seconds

    @precondition(lambda self: len(self.nodes) >= 1)
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        claimer = self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]
        owner_name = data.draw(st.sampled_from([n for n in NAMES if n != claimer.me]))
        self.run(claimer.renew)  # its own renewal and read of the records first, as its loops would have done
        self.run(claimer.refresh)
        before = self.record(owner_name)
        owner = self.nodes.get(owner_name)
        owner_believed_live = owner is not None and owner.lease_valid() and (
            before is not None and before.get("incarnation") == owner.incarnation)
        won = self.run(lambda: claimer.claim(owner_name))
        event(f"claim {'won' if won else 'lost'}, holders listed: {bool(before and before.get('holders'))}")
        if not won:
            return
        assert before is not None
        holders = before.get("holders") or []
        assert not holders or claimer.me in holders, f"{claimer.me} claimed {owner_name}, whose record lists {holders}"
        if before["state"] == LIVE:
            assert before["expires_at"] <= self.clock.now, f"{owner_name} claimed before its lease ran out"
        assert not owner_believed_live, f"{owner_name} was claimed while its daemon held a valid lease"
        after = self.record(owner_name)
        assert after is not None and after["state"] == TAKEN_OVER and after["taken_over_by"] == claimer.me

    @precondition(lambda self: self.nodes)
    @rule(data=st.data(), owner_name=st.sampled_from(NAMES))
    def finish_takeover(self, data: st.DataObject, owner_name: str) -> None:
        taker = self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]
        self.run(lambda: taker.mark_takeover_done(owner_name))

    @precondition(lambda self: self.nodes)
    @rule(data=st.data())
    def reconcile_and_rejoin(self, data: st.DataObject) -> None:
        """A node taken over while away: once its takeover is settled, it rejoins (its reconcile is not modelled)."""
        m = self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]
        if m.fenced and self.run(m.takeover_settled):
            self.run(m.rejoin)

    # ------------------------------------------------------------ what must hold after every step
    @invariant()
    def a_valid_lease_owns_its_live_record(self) -> None:
        for name, m in self.nodes.items():
            if m.lease_valid():
                rec = self.record(name)
                assert rec is not None and rec["state"] == LIVE and rec["incarnation"] == m.incarnation, (
                    f"{name} ({m.incarnation}) believes its lease valid, the bucket says {rec}")
                assert rec["expires_at"] > self.clock.now

    @invariant()
    def copies_count_only_on_listed_holders(self) -> None:
        for name, m in self.nodes.items():
            if m.lease_valid() and m.copies_uncounted() is None:
                rec = self.record(name)
                assert rec is not None and set(rec.get("holders") or []) == m.listing.listed(), (name, rec, m.listing.listed())


TestNodeRecords = NodeRecords.TestCase
TestNodeRecords.settings = settings(max_examples=300, stateful_step_count=30, deadline=None, database=None,
                                    suppress_health_check=[HealthCheck.too_slow])
