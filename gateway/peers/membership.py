"""Membership: this node's record in the bucket, its lease, the fence, the others' records, takeover claims.

Why in the bucket: every node already reaches it, and its conditional writes (If-None-Match: *,
If-Match: ETag) give the one thing a takeover needs, exactly one winner, without a cluster of its
own. The records are `records.NodeRecord`s at `.ckptfs/nodes/<node>.json` under the mount's prefix.

* Announce (`run`, at start): the record an earlier incarnation of this node left is read first
  (`record_at_start`). If it says `taken_over`, this node was declared dead while it was away and
  another node uploaded its replicas: it is fenced (`must_reconcile`), writes nothing of its own
  record, and its drain waits until the takeover helper's reconcile has run and called `rejoin()`.
  Otherwise the record is written live with this incarnation (If-Match on what was there, or
  If-None-Match when nothing was: a claim racing the restart wins or loses as a whole).
* Renew every ttl/3 with If-Match on the ETag last written. The lease is valid *locally* until
  the moment the renewal was sent + ttl - margin (margin = ttl/4), on CLOCK_BOOTTIME, which keeps
  counting while the process is stopped and while the machine is suspended. Other nodes judge
  `expires_at` by their wall clocks, so clocks must agree within the margin (NTP: milliseconds).
  A renewal whose If-Match fails reads the record: `taken_over` -> this node is fenced.
* Identity (docs/peers.md): the record carries this node's journal id (made with its cache directory). A record
  under our name with *another* journal id that was not taken over to the end is a predecessor: a node of this name
  whose disk was lost, whose peers may still hold files nobody uploaded. This incarnation then writes nothing
  (`waiting_for`): the predecessor's record stays as it is, so its holders claim it when its lease runs out and
  take it over; the peers' listeners refuse this incarnation's frames meanwhile (its record is not the one in
  the bucket), so an empty journal never tells them to forget anything. Once the record says the takeover
  finished, ours is written live. A predecessor nobody claims for 2 x ttl after it became dead had no live
  holder: its record is written over then (logged), or the name could never be mounted again.
* The fence: `admit()` returns at once while the lease is valid and the node is not fenced;
  otherwise it waits for the next renewal (or for `rejoin`). The drain awaits it before every
  request that writes to the bucket, so a node paused past its ttl sends at most the requests
  already in flight when it stopped.
* The others: every ttl/3 one LIST of `.ckptfs/nodes/` (a page per 1,000 nodes) and a GET of each record whose
  ETag changed since the last read, of the nodes this one needs in full (`interest`, the daemon's: the takers of
  takeovers of owners it holds, and peers whose connection failed). Another node's record that changed is taken
  for a renewal without a GET: its expiry is pushed to a ttl after the change was seen (it renews every ttl/3, so a
  live node keeps changing). When it stops changing, the nodes holding its replicas (`confirming`: they may have
  to claim it) read it in full once it missed a renewal (half a ttl), the others take it for down after a ttl
  with no GET: a death costs R GETs, not N (a claim reads the record again anyway). A new record is read in full
  only if this node needs it, holds its replicas, or it is among this node's first candidates (candidates.py: the
  rendezvous order walked until peer_replicas + 2 live ones of another domain are known); any other is known from
  the LIST alone (`records.listed_only`, dated by its LastModified): a cluster started at once costs N x (R + 2)
  GETs, not N^2. A needed one is read when it becomes needed; a listener reads an owner's record at each
  connection. So in steady state a node makes one PUT and the LIST's pages per ttl/3, whatever N (before: N-1
  GETs, N*(N+1) requests per ttl/3 in all: 100,000/s at 1,000 nodes); `ckptfs_membership_requests_total` counts
  them, bench/peers_scale.py simulates them. The price: a node that does not hold a dead node's replicas sees it
  down, not taken over, and a state change up to a ttl late; an address is as of its last full read (a connection
  that fails has it read again).
* `claim(node)`: a holder of a dead node's replicas writes its record `taken_over` by itself, If-Match
  on the ETag it judged dead: of any number of claimers exactly one wins. A takeover whose taker died
  before `mark_takeover_done` is dead again and can be claimed again (records.is_dead).

The store calls block: they run in worker threads (`threads.call`), one at a time per record.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable

import trio

from .. import threads
from ..objects import NO_OBJECT, PRECONDITION, StoreError
from ..peering import PeerOptionError, StaticPeer, parse_addr, parse_peer
from ..storeapi import LifecycleStore, read_json
from .holders import HolderListing
from .identity import Owners, refuse_live_duplicate, stamp, wait_for_predecessor
from .candidates import SPARES, RendezvousOrder, read_into
from .records import (DOWN, LEFT, LIVE, NODES_DIR, TAKEN_OVER, NodeRecord, assume_renewed, is_dead, is_live,
                      listed_only, may_claim, nothing_to_take_over, other_domain, record_path, rendezvous, same_journal)

log = logging.getLogger(__name__)

ANNOUNCE_ATTEMPTS = 5  # writes of our record at start that may each find it changed (a claim racing the restart)
MARGIN = 0.25  # of the ttl: the lease is trusted locally until ttl * (1 - MARGIN) after its renewal was sent


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def boottime() -> float:
    """Seconds on a clock that counts a stopped process and a suspended machine (a paused node must see the pause):
    CLOCK_BOOTTIME; where there is none, the monotonic clock (which stops while a machine is suspended)."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


def new_incarnation() -> str:
    return uuid.uuid4().hex[:16]


def peer_state(rec: NodeRecord | None, now: float) -> str:
    """A peer as `ckptfs status` shows it: live, taken_over (claimed by another node, until it rejoins), left (it
    unmounted cleanly, or an operator removed it), or down."""
    if is_live(rec, now):
        return LIVE
    return rec.state if rec is not None and rec.state in (TAKEN_OVER, LEFT) else DOWN


@dataclass(frozen=True)
class PeerState:
    """Another node as this one sees it: where its listener is, its domain, whether it renews its record."""

    node: str
    addr: str
    failure_domain: str
    state: str  # LIVE | DOWN | TAKEN_OVER (until it rejoins) | LEFT
    incarnation: str | None  # of its record (None: no record read)
    # "record": the state as its record was last read; "listing": as the LIST shows it since (it keeps changing:
    # live; it stopped for a ttl: down, whether it died, left or was taken over, which only a read would tell)
    known_from: str = "record"


class Membership:
    def __init__(self, cfg: Any, store: LifecycleStore, key_of: Callable[[str], str], me: str, incarnation: str,
                 peer_addr_bound: str, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = boottime, journal_id: str = "") -> None:
        self.store, self.key_of, self.me, self.incarnation = store, key_of, me, incarnation
        self.journal_id = journal_id
        self.peer_addr, self.failure_domain = peer_addr_bound, cfg.failure_domain
        self.ttl: float = cfg.peer_lease_ttl
        self.margin = self.ttl * MARGIN
        self.candidates_wanted = cfg.peer_replicas + SPARES  # targets known in full (candidates.py)
        self.clock, self.monotonic = clock, monotonic
        self.static: dict[str, StaticPeer] = {p.name: p for p in map(parse_peer, cfg.peers) if p.name != me}
        self.record_at_start: NodeRecord | None = None  # what an earlier incarnation left (read at announce)
        self.must_reconcile = False  # taken over while away: reconcile, then rejoin()
        self.waiting_for: NodeRecord | None = None  # a predecessor (another journal under our name) not yet taken over
        self.record_error = ""  # why our record could not be written at the last attempt ("": it was)
        self._read_at_start = False
        self.mounting = True  # until run() reports started: only then is a live duplicate of our name refused
        self._warned_predecessor = -1e18
        self.owners = Owners(self)  # whose replicas this node's listener takes
        self.listing = HolderListing(self)  # the holders our record names: only they may claim this node
        self.admitted = self.owners.admitted
        self.announced = trio.Event()  # set once the record at start is known (and ours written, unless fenced)
        self._own: NodeRecord | None = None  # our record as last written or read by us (its etag: the next If-Match)
        self._fenced = False
        self._valid_until = 0.0  # monotonic
        self._records: dict[str, NodeRecord] = {}  # the others, as last read
        # the nodes whose full record a refresh reads when it changed (None: every node); the others' changes are taken
        # for renewals (`_assumed`: their records as last read, the expiry pushed to a ttl after the change was seen)
        self.interest: Callable[[], set[str] | None] = lambda: None
        self.confirming: Callable[[], set[str]] = set  # whose silence this node reads in full (the owners it holds)
        self._assumed: set[str] = set()
        self._order = RendezvousOrder(me)  # the others' names in the order this node's replicas go to them
        self._read_at: float | None = None  # monotonic: when the last refresh that succeeded started
        self._changed = trio.Event()  # set (and replaced) whenever admit() may now answer otherwise
        self._own_lock = trio.Lock()
        self._warned_other_incarnation = 0.0
        self.errors: dict[str, str] = {}  # "renew" / "read" -> why the last one failed (status: membership.error)
        self.renewals_failed_total = 0
        self.claims_total = 0  # claims this node won

    # ------------------------------------------------------------ state
    @property
    def fenced(self) -> bool:
        """Taken over while away (or paused): uploads nothing until reconcile has run and `rejoin` succeeded."""
        return self._fenced

    def lease_valid(self) -> bool:
        return not self._fenced and self._own is not None and self.monotonic() < self._valid_until

    def state(self) -> str:
        if self.waiting_for is not None:
            return "waiting_predecessor"
        if self._own is None and not self._fenced:
            return "unannounced"
        return "fenced" if self._fenced else LIVE if self.lease_valid() else "expired"

    def copies_uncounted(self) -> str | None:
        """Why peer copies of this node's files must not count as replicas now (None: they count). Only a node whose
        record is in the bucket under this incarnation can be taken over, and its peers refuse the frames of one
        that has none (`owner_refused`): what they were sent would be dropped, never uploaded."""
        if self.waiting_for is not None:
            return (f"this node's record still names a predecessor with another cache (journal {self.waiting_for.journal_id[:8]}): "
                    "waiting for its takeover")
        if self._fenced:
            return "this node was taken over and has not rejoined"
        if self._own is None or self._own.incarnation != self.incarnation:
            why = f" ({self.record_error})" if self.record_error else ""
            return f"this node's record {self.key_of(record_path(self.me))} could not be written{why}"
        return None

    async def admit(self) -> None:
        """The drain's fence: returns at once while the lease is valid; else waits for a renewal (or `rejoin`)."""
        while not self.lease_valid():
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def peers(self) -> list[PeerState]:
        """The other nodes, live or down: the static `peers` list if one is configured (liveness still from records)."""
        now = self.clock()
        out = []
        if self.static:
            for p in self.static.values():
                rec = self._records.get(p.name)
                domain = p.failure_domain or (rec.failure_domain if rec else "")  # the list's, else the node's own
                out.append(PeerState(p.name, p.addr, domain, peer_state(rec, now), rec.incarnation if rec else None,
                                     self._known_from(p.name)))
        else:
            for rec in self._records.values():
                out.append(PeerState(rec.node, rec.peer_addr, rec.failure_domain, peer_state(rec, now),
                                     rec.incarnation or None, self._known_from(rec.node)))
        return sorted(out, key=lambda p: p.node)

    def _known_from(self, node: str) -> str:
        return "listing" if node in self._assumed else "record"

    def targets(self) -> list[PeerState]:
        """Live peers outside this node's failure domain, in the order this node's replicas go to them (rendezvous)."""
        live = {p.node: p for p in self.peers()
                if p.state == LIVE and p.addr and other_domain(self.failure_domain, p.failure_domain)}  # addr: read in full
        return [live[n] for n in rendezvous(self.me, live)]

    def down(self) -> set[str]:
        """Other nodes known to be down now: their record, read by a refresh that started less than half the ttl ago,
        is not live (expired, taken over, or absent while a static `peers` list names the node). A node that renews
        every third of the ttl showed a record valid two thirds of it past that read, so a fresh read never takes a
        live node for down; stale records (this node cut from the store) say nothing: empty then, and the peers it
        streams to are kept. The sender closes its channels to these nodes: one that died silently while nothing was
        sent to it is dropped as soon as its lease runs out, if the idle ping has not noticed it first."""
        if self._read_at is None or self.monotonic() - self._read_at > self.ttl / 2:
            return set()
        return {p.node for p in self.peers() if p.state != LIVE}

    def dead(self) -> list[str]:
        """Other nodes that may be claimed now (records.is_dead), by the records last read."""
        now = self.clock()
        records = self._with_own()
        return sorted(n for n, rec in self._records.items() if is_dead(rec, records, now))

    def assumed(self, node: str) -> bool:
        """`node`'s record as last read was taken for renewed since, not read in full (refresh)."""
        return node in self._assumed

    def _with_own(self) -> dict[str, NodeRecord]:
        """The others' records and ours (a takeover by this node is alive while ours is)."""
        records = dict(self._records)
        if self._own is not None:
            records[self.me] = self._own
        return records

    def record_of(self, node: str) -> NodeRecord | None:
        """`node`'s record as last read (ours: as last written)."""
        return self._own if node == self.me else self._records.get(node)

    def status(self) -> dict[str, Any]:
        return {"node": self.me, "incarnation": self.incarnation, "journal_id": self.journal_id, "state": self.state(),
                "failure_domain": self.failure_domain, "peer_addr": self.peer_addr, "must_reconcile": self.must_reconcile,
                "copies_uncounted": self.copies_uncounted(),
                "peers": [{"node": p.node, "addr": p.addr, "state": p.state, "failure_domain": p.failure_domain,
                           "known_from": p.known_from} for p in self.peers()]}

    # ------------------------------------------------------------ store calls
    async def _read(self, node: str) -> NodeRecord | None:
        """`node`'s record now (None: no record, or one this version cannot read)."""
        return (await self._read_etag(node))[0]

    async def _read_etag(self, node: str) -> tuple[NodeRecord | None, str | None]:
        """(`node`'s record or None, the object's ETag or None if there is no object): our own record is written over
        (If-Match that ETag) even when this version cannot read what is there."""
        doc, etag = await threads.call(lambda: read_json(self.store, self.key_of(record_path(node))))
        if doc is None:
            return None, None
        rec = NodeRecord.from_doc(doc, etag)
        if rec is None:
            log.warning("node record %s is not one this version reads: ignored", self.key_of(record_path(node)))
        return rec, etag

    async def _write(self, rec: NodeRecord, if_match: str | None) -> NodeRecord | None:
        """Write `rec` (If-Match `if_match`, or If-None-Match when None); the record as written, or None if the condition failed."""
        key = self.key_of(record_path(rec.node))
        body = rec.to_json()
        try:
            etag = await threads.call(lambda: self.store.put_bytes(key, body, if_none_match=if_match is None, if_match=if_match))
        except StoreError as e:
            if e.kind in (PRECONDITION, NO_OBJECT):  # NO_OBJECT: If-Match on a record deleted meanwhile (S3 answers 404)
                return None
            raise
        return replace(rec, etag=etag)

    def _live_record(self, now: float) -> NodeRecord:
        return NodeRecord(self.me, self.incarnation, self.peer_addr, self.failure_domain, LIVE, now + self.ttl, now,
                          journal_id=self.journal_id, holders=list(self.listing.wanted))

    # ------------------------------------------------------------ our record
    async def announce(self) -> None:
        """Read what an earlier incarnation left; fence if it was taken over, wait if it is a predecessor with another
        journal not yet taken over (`identity.wait_for_predecessor`: not announced, asked again at each renewal), else
        write ours live."""
        async with self._own_lock:
            try:
                rec, etag = await self._read_etag(self.me)
            except StoreError as e:
                self.record_error = str(e)
                raise
            if not self._read_at_start:
                self._read_at_start = True
                self.record_at_start = rec  # a run restarted by the supervisor announces again: the first read stays
                self.listing.keep(rec)
            for _ in range(ANNOUNCE_ATTEMPTS):
                if rec is not None and not same_journal(rec.journal_id, self.journal_id) and not nothing_to_take_over(rec):
                    if self.mounting:
                        await refuse_live_duplicate(self, rec)  # another live mount with our name: refused at mount
                    if wait_for_predecessor(self, rec):
                        return  # not announced: asked again at each renewal
                elif rec is not None and nothing_to_take_over(rec) and not same_journal(rec.journal_id, self.journal_id):
                    pass  # a predecessor taken over to the end, or that left: nothing of it is ours to reconcile, written over
                elif rec is not None and rec.state == TAKEN_OVER:
                    self._fence(rec)
                    break
                if self._fenced:
                    break  # fenced before (a restarted run): only rejoin writes our record live again
                if await self._write_live(etag):
                    if self.waiting_for is not None:
                        log.warning("node %s: its predecessor (journal %s) was taken over: announced with journal %s",
                                    self.me, self.waiting_for.journal_id, self.journal_id)
                        self.waiting_for = None
                    log.info("node %s announced (incarnation %s, journal %s, peer_addr %s, failure_domain %s)", self.me,
                             self.incarnation, self.journal_id, self.peer_addr, self.failure_domain or "-")
                    break
                rec, etag = await self._read_etag(self.me)  # a claim got there first (or a record appeared): look again
            else:
                raise StoreError(PRECONDITION, f"{self.key_of(record_path(self.me))} changed under each of {ANNOUNCE_ATTEMPTS} writes")
        self.announced.set()

    async def _write_live(self, if_match: str | None) -> bool:
        """Our record live for another ttl; the local lease runs from when it was sent."""
        sent = self.monotonic()
        try:
            written = await self._write(self._live_record(self.clock()), if_match)
        except StoreError as e:
            self.record_error = str(e)
            raise
        self.record_error = ""
        if written is None:
            return False
        self._own = written
        self._valid_until = sent + self.ttl - self.margin
        self._notify()
        return True

    def _fence(self, rec: NodeRecord) -> None:
        if not self._fenced:
            log.error("node %s was taken over by %s while it was away: it uploads nothing until it has reconciled",
                      self.me, rec.taken_over_by)
        self._own = rec
        self._fenced = True
        self.must_reconcile = True
        self._valid_until = 0.0
        self._notify()

    async def renew(self) -> None:
        """One renewal (If-Match our last ETag); a record found taken over fences this node."""
        if not self.announced.is_set():  # the store did not answer at start: announce now
            await self.announce()
            return
        async with self._own_lock:
            own = self._own
            if own is None:  # announced but fenced on a record since removed by hand: rejoin writes it again
                return
            if self._fenced:
                if own.taken_over_by == self.me and own.taken_over_by_incarnation == self.incarnation and not own.takeover_done:
                    await self._renew_self_claim(own)  # reconciling our own files: nobody else may claim them meanwhile
                return
            if await self._write_live(own.etag):
                return
            rec, etag = await self._read_etag(self.me)
            if rec is not None and rec.state == TAKEN_OVER:
                self._fence(rec)
                return
            if rec is not None and not same_journal(rec.journal_id, self.journal_id) and rec.state == LIVE:
                self._own = None  # another journal renews this name: it is not ours to write over (announce waits)
                self.announced = trio.Event()
                self._valid_until = 0.0
                self._notify()
                log.error("node %s: another daemon with another cache directory (journal %s) renews this node's record: "
                          "this one stops counting peer copies; give each mount its own node_name", self.me, rec.journal_id)
                return
            if rec is not None and rec.incarnation != self.incarnation and self.clock() - self._warned_other_incarnation > self.ttl:
                self._warned_other_incarnation = self.clock()
                log.error("another daemon wrote node %s's record (incarnation %s, peer_addr %s): two mounts share node_name %s; "
                          "give each its own node_name", self.me, rec.incarnation, rec.peer_addr, self.me)
            # ours with a lost answer (the write happened), another incarnation, or none: write it back
            await self._write_live(etag)

    async def _renew_self_claim(self, own: NodeRecord) -> None:
        now = self.clock()
        written = await self._write(replace(own, expires_at=now + self.ttl, renewed_at=now), own.etag)
        if written is not None:
            self._own = written
        else:
            rec = await self._read(self.me)
            if rec is not None:
                self._own = rec

    async def takeover_settled(self) -> bool:
        """For the reconcile of a fenced node: True once this node may reconcile (its takeover finished, or it holds
        its own record's claim because the taker died unfinished: claimed here, so nobody else re-claims it meanwhile)."""
        async with self._own_lock:
            rec = await self._read(self.me)
            if rec is None or rec.state in (LIVE, LEFT):
                return True  # nothing to wait for (a record removed by hand, or rejoined already): rejoin writes it
            self._own = rec
            if rec.takeover_done or (rec.taken_over_by == self.me and rec.taken_over_by_incarnation == self.incarnation):
                return True
            records = self._with_own()
            if rec.taken_over_by and rec.taken_over_by != self.me:
                taker = await self._read(rec.taken_over_by)
                if taker is not None:
                    records[taker.node] = taker
                else:
                    records.pop(rec.taken_over_by, None)
            if not is_dead(rec, records, self.clock()):
                return False
            now = self.clock()
            written = await self._write(rec.claimed_by(self.me, self.incarnation, now, now + self.ttl), rec.etag)
            if written is None:
                return False
            log.warning("node %s: its taker %s died before finishing: this node reconciles its own files", self.me, rec.taken_over_by)
            self._own = written
            return True

    async def wait_settled(self) -> None:
        """`takeover_settled`, asked every ttl/3 until it is."""
        while not await self.takeover_settled():
            await trio.sleep(self.ttl / 3)

    async def rejoin(self, incarnation: str | None = None) -> bool:
        """After reconcile: our record live again under a new incarnation, the gate open. False if the record says
        another node's takeover is still running (reconcile was early): stay fenced, wait, reconcile again."""
        async with self._own_lock:
            if not self._fenced:
                return True
            rec, etag = await self._read_etag(self.me)
            if rec is not None and rec.state == TAKEN_OVER and not rec.takeover_done and not (
                    rec.taken_over_by == self.me and rec.taken_over_by_incarnation == self.incarnation):
                return False
            previous = self.incarnation
            self.incarnation = incarnation or new_incarnation()
            if not await self._write_live(etag):
                self.incarnation = previous
                return False
            self._fenced = False
            self.must_reconcile = False
            self._notify()
            log.info("node %s rejoined after reconciling (incarnation %s)", self.me, self.incarnation)
            return True

    # ------------------------------------------------------------ the others
    async def refresh(self) -> None:
        """One LIST of the records and a GET of each one changed since that this node needs in full (`interest`), or that
        it took for renewed and that then expired, and of the first candidates it may send to that it has not read
        (candidates.py); another new record is known from the LIST alone (see the module's docstring for the cost)."""
        prefix = self.key_of(NODES_DIR)
        started = self.monotonic()
        listing = await threads.call(lambda: self.store.list(prefix))
        seen: dict[str, NodeRecord] = {}
        changed: list[str] = []
        interest, confirming, now = self.interest(), self.confirming(), self.clock()
        assumed = set(self._assumed)
        for obj in listing.objects:
            if not obj.name.endswith(".json"):
                continue
            node = obj.name[: -len(".json")]
            if node == self.me:
                continue
            old = self._records.get(node)
            wanted = interest is None or node in interest
            # a record taken for renewed that stopped changing is read in full by the nodes holding its replicas (they
            # claim it: `confirming`, or its record lists them) once it missed a renewal (half a ttl unchanged: the
            # claim comes as the lease runs out), and by those that need it; the others take it for down after a ttl,
            # with no GET (a death costs R GETs, not N)
            holder = node in confirming or old is not None and self.me in (old.holders or [])
            if old is None and not wanted and not holder and node not in self.static:  # the LIST's word (no GET)
                seen[node] = listed_only(node, obj.etag, min(now, obj.mtime or now) + self.ttl)
                assumed.add(node)
            elif old is not None and old.etag == obj.etag and not (node in self._assumed and (
                    wanted or holder and now - (old.expires_at - self.ttl) >= self.ttl / 2)):
                seen[node] = old  # unchanged (taken for renewed: live, or down until it changes or is needed in full)
            elif old is not None and old.etag != obj.etag and old.state == LIVE and not wanted:
                seen[node] = assume_renewed(old, obj.etag, now + self.ttl)  # no GET: see the module's docstring
                assumed.add(node)
            else:
                changed.append(node)
        errors = await read_into(self._read, self._records, seen, assumed, changed, self._order.of, self.failure_domain,
                                 self.candidates_wanted, interest or set(), now)
        for node, rec in list(seen.items()):
            newer = self._records.get(node)  # read meanwhile by a listener admitting the node: the later read wins
            if newer is not None and newer is not rec and stamp(newer) > stamp(rec):
                seen[node] = newer
                assumed.discard(node)
        self._records, self._assumed = seen, assumed & set(seen)
        if errors:  # what was read is kept; the view is not called fresh (`down`), and the failure is logged
            raise errors[0]
        self._read_at = started

    async def claim(self, node: str) -> bool:
        """Take `node` over: its record `taken_over` by this node, If-Match on the ETag judged dead. True: this node
        won and must finish the takeover, then `mark_takeover_done`. False: not dead after all, or another won."""
        if node == self.me or not self.lease_valid():
            return False  # a node that cannot prove it is live itself takes nobody over
        rec = await self._read(node)
        if rec is None:
            return False
        if not may_claim(rec, self.me):
            self._records[node] = rec  # its replicas here are older than what the listed holders have (holders.py)
            return False
        records = self._with_own()
        records[node] = rec
        if rec.state == TAKEN_OVER and rec.taken_over_by not in (None, node, self.me):
            taker = await self._read(rec.taken_over_by)  # type: ignore[arg-type]
            if taker is not None:
                records[taker.node] = taker
            else:
                records.pop(rec.taken_over_by, None)  # type: ignore[arg-type]
        now = self.clock()
        if not is_dead(rec, records, now):
            self._records[node] = rec
            return False
        written = await self._write(rec.claimed_by(self.me, self.incarnation, now), rec.etag)
        if written is None:
            return False
        self._records[node] = written
        self.claims_total += 1
        log.warning("node %s: took over %s", self.me, rec.describe())
        return True

    async def mark_takeover_done(self, node: str) -> bool:
        """`node`'s takeover finished (its replicas uploaded): its record says so, If-Match. False if this node no
        longer holds the claim (judged dead itself meanwhile and re-claimed by another)."""
        rec = await self._read(node)
        if rec is None or rec.state != TAKEN_OVER or rec.taken_over_by != self.me or rec.taken_over_by_incarnation != self.incarnation:
            return False
        written = await self._write(replace(rec, takeover_done=True, etag=None), rec.etag)
        if written is None:
            return False
        self._records[node] = written
        return True

    # ------------------------------------------------------------ the service
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Announce, then renew and read the others every ttl/3. Reports started after the first attempt to announce
        (a store that does not answer leaves the lease invalid and the drain waiting, never the mount's start)."""
        try:
            await self.announce()
        except StoreError as e:
            log.warning("node %s: could not announce itself (%s): retrying", self.me, e)
        try:
            await self.refresh()
        except StoreError as e:
            log.warning("node %s: could not read the node records (%s): retrying", self.me, e)
        self.mounting = False
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(every_third, self, self.refresh, "read")
            nursery.start_soon(every_third, self, self.renew, "renew")
            nursery.start_soon(self.listing.run)


async def every_third(m: Membership, step: Callable[[], Any], what: str) -> None:
    """`step` every ttl/3. After a failure a renewal is tried again in ttl/6 (the lease is at stake); a read backs
    off, doubling up to the ttl (the last view is kept meanwhile: a throttled store is not asked harder)."""
    wait, failures = m.ttl / 3, 0
    while True:
        await trio.sleep(wait)
        try:
            await step()
            wait, failures = m.ttl / 3, 0
            m.errors.pop(what, None)
        except StoreError as e:
            failures += 1
            m.errors[what] = str(e)
            if what == "renew":
                m.renewals_failed_total += 1
            wait = m.ttl / 6 if what == "renew" else min(m.ttl, m.ttl / 3 * 2 ** (failures - 1))
            log.warning("node %s: could not %s the node records (%s): again in %.1fs", m.me, what, e, wait)


def takers_of(m: Membership, owners: list[str]) -> set[str]:
    """The nodes that took `owners` over, by their records as last read: a refresh reads them in full (a taker that
    restarted has forgotten its takeover, which another holder must then take over)."""
    return {rec.taken_over_by for n in owners if (rec := m.record_of(n)) is not None and rec.taken_over_by}


def membership_error(m: Membership) -> str | None:
    """Why the last renewal or read of the records failed (None: both succeeded): `ckptfs status`'s membership.error."""
    return "; ".join(f"could not {what}: {why}" for what, why in sorted(m.errors.items())) or None


def stale_seconds(m: Membership) -> float | None:
    """Seconds since the last refresh of the others' records that succeeded began (None: none yet): `ckptfs status`."""
    return None if m._read_at is None else max(0.0, m.monotonic() - m._read_at)


async def live_peer_nodes(store: LifecycleStore, key_of: Callable[[str], str], limit: int = 16) -> list[str]:
    """Nodes whose records under this prefix are live now (at most `limit` read): a mount with durability = local
    says at start that it shares the prefix with nodes that replicate, where its own writes are not replicated."""
    listing = await threads.call(lambda: store.list(key_of(NODES_DIR)))
    live = []
    for obj in [o for o in listing.objects if o.name.endswith(".json")][:limit]:
        doc, etag = await threads.call(lambda: read_json(store, key_of(NODES_DIR + obj.name)))
        rec = NodeRecord.from_doc(doc, etag) if doc is not None else None
        if rec is not None and is_live(rec, time.time()):
            live.append(rec.node)
    return sorted(live)


def known_hosts(peers: list[PeerState]) -> set[str]:
    """The hosts the other nodes' records (or the static list) announce: the listener serves them first."""
    hosts = set()
    for p in peers:
        try:
            hosts.add(parse_addr(p.addr)[0])
        except PeerOptionError:
            continue  # an address this release cannot read: that node is served as anyone
    return hosts
