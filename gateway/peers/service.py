"""`Peers`: what the rest of the daemon sees of peer durability, and the services behind it, each supervised.

Why one facade: fs.py waits on `replicated`, the drain on `gate`, the control socket reads `status` and
`unreplicated_under`, the lifecycle hears `on_taken_over`; none of them needs to know that a listener,
node records, a sender and a takeover loop do the work. Built by the daemon only with `durability = peer`.

Each part runs under the daemon's supervisor (`supervisor.supervise`): a peer that misbehaves, a broken
connection or a full replica disk is an error of that part, logged, counted and restarted; the mount goes on.
Order at start: the listener first (its bound port goes into the node record), then the node record and the
others' (the sender chooses among them), then the sender and the takeover loop.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import trio

from ..cache import Cache
from ..namespace import Namespace
from .. import threads
from ..objects import StoreError
from ..peering import PeerOptionError, node_name_of, peer_warnings, read_secret
from ..publishing import store_refuses_stale_deletes, store_refuses_stale_writes
from ..storeapi import ObjectStore
from ..supervisor import Supervisor
from .link import PeerLink, PeerRefused, answers_as
from .listener import Listener
from .departure import RemoveRefused, leave, remove_node
from .membership import Membership, known_hosts, membership_error, new_incarnation, stale_seconds, takers_of
from .requests import CountedStore
from .records import LIVE, unclaimed_for
from .reconcile import Reconcile
from .replicas import ReplicaStore
from .sender import Sender
from .sweep import Sweep
from .takeover import Takeover

log = logging.getLogger(__name__)


def records_store(cfg: Any, store: ObjectStore) -> Any:
    """Where the node records are (`peer_membership`): the bucket itself, or etcd (store/etcd.py: the same conditional
    writes, a watch instead of the LIST). etcd's client is the `etcd` extra: without it, one line at mount."""
    if cfg.peer_membership != "etcd":
        return store
    try:
        from ..store.etcd import EtcdRecords
    except ImportError as e:
        raise PeerOptionError(f"peer_membership = etcd needs the etcd client ({e.name} is not installed): "
                              "pip install 'ckptfs[etcd]', or set peer_membership = bucket") from None
    return EtcdRecords(cfg.etcd_endpoints, f"{cfg.etcd_prefix}{cfg.bucket}/", timeout=cfg.peer_timeout,
                       quiet=cfg.peer_lease_ttl)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)

DUPLICATE_PROBE_SECONDS = 5.0  # at mount, for an answer at the address a live record with our name announces
REFUSING = "refusing"  # a peer's state in `ckptfs status`: its record is live, its listener refuses this node's handshake


class Peers:
    def __init__(self, cfg: Any, ns: Namespace, cache: Cache, store: ObjectStore, metrics: Any, supervisor: Supervisor) -> None:
        self.cfg, self.ns, self.cache, self.store, self.metrics, self.supervisor = cfg, ns, cache, store, metrics, supervisor
        self.me = node_name_of(cfg)
        self.incarnation = new_incarnation()
        # the shared secret, and during a rotation the previous one too: accepted by the listener, tried second when connecting
        self.secrets = [read_secret(cfg.peer_secret_file)] + (
            [read_secret(cfg.peer_secret_previous_file)] if cfg.peer_secret_previous_file else [])
        for warning in peer_warnings(cfg):
            log.warning(warning)
        if cfg.peer_encryption != "none":  # kernel TLS would keep sendfile; not used (docs/peers.md)
            log.info("peer_encryption = %s: replicated bytes are encrypted in the daemon (AES-256-GCM), read through it "
                     "rather than sent by sendfile; kernel TLS offload is not used", cfg.peer_encryption)
        self.replicas = ReplicaStore(cfg, cfg.cache_dir)
        self.listener = Listener(cfg, self.replicas, self.secrets, self.me)
        self.journal_id: str = getattr(ns.journal, "journal_id", "")
        self.records_store = records_store(cfg, store)  # where the node records are: the bucket, or etcd
        self.requests = CountedStore(self.records_store)  # what membership asks of it, by kind (the metric)
        self.membership = Membership(cfg, self.requests, ns.keys.of, self.me, self.incarnation, cfg.peer_addr, journal_id=self.journal_id)
        self.listener.judge = self.membership.owners  # replicas only from an owner incarnation whose record is live
        self.listener.known_hosts = lambda: known_hosts(self.membership.peers())  # the nodes' addresses: slots of their own
        self.listener.on_listening = self._listening
        self.membership.answers_as_me = self._answers_as_me  # type: ignore[attr-defined]  # identity.refuse_live_duplicate
        self.sender = Sender(cfg, ns, self._open_link, self.membership.targets, down=self.membership.down)
        self.sender.uncounted = self.membership.copies_uncounted  # no record of ours: peer copies are not replicas
        self.sender.find_peers = self._find_peers
        self.sender.listed, self.sender.ask_listing = self.membership.listing.listed, self.membership.listing.ask
        self.membership.interest = self._interest  # whose records a refresh reads in full (the others: the LIST's word)
        self.membership.confirming = lambda: set(self.replicas.owners())  # whose death it confirms: it may claim them
        self.membership.listing.on_listed = self.sender.notify  # holders.py: their copies count once listed
        # a takeover may upload this node's files while its lease is not valid: keys they leave then are cleaned after
        ns.uploads.away = lambda: self.membership.must_reconcile or not self.membership.lease_valid()
        self.takeover = Takeover(cfg, store, self.replicas, self.membership, ns.keys)  # type: ignore[arg-type]
        self.reconcile = Reconcile(cfg, ns, store, self.membership)  # type: ignore[arg-type]
        self.sweep = Sweep(cfg, store, self.replicas, self.membership)  # type: ignore[arg-type]
        self._reconciling = False
        self.conditional_writes: bool | None = None  # the store refuses a stale conditional write (None: not known yet)
        self.conditional_deletes: bool | None = None  # and a stale conditional delete
        self.takeover.conditional_deletes = lambda: self.conditional_deletes is True
        # mount-relative checkpoint paths a takeover uploaded files into, after it is done (a counter)
        self.on_taken_over: list[Callable[[list[str]], None]] = self.takeover.on_taken_over
        # checkpoints of an owner another holder took over, noted here (their files durable before the loss): the
        # sweep hands them over before it drops that owner's replicas (the daemon: the lifecycle tracker too)
        self.on_checkpoints: list[Callable[[list[str]], None]] = self.sweep.on_checkpoints
        # the counters metrics.py declares for the peers (peers-surface); absent there, nothing is counted
        sent, degraded = getattr(metrics, "peer_replicated_bytes", None), getattr(metrics, "peer_degraded_writes", None)
        takeovers = getattr(metrics, "peer_takeovers", None)
        if sent is not None and degraded is not None and takeovers is not None:
            self.sender.on_sent = sent.inc
            self.sender.on_degraded = degraded.inc
            self.on_taken_over.append(lambda paths: takeovers.inc())

    def fence(self, drain: Any) -> None:
        """Make the drain's writes (drainfence.DrainFence) conditional once the store is found to refuse a stale write,
        and its deletes once it is found to refuse a stale delete."""
        drain.enabled = lambda: self.conditional_writes is True
        drain.deletes_enabled = self.takeover.conditional_deletes

    def commit_taken_over_with(self, commit: Callable[[list[str], frozenset[str]], Awaitable[None]]) -> None:
        """What commits a takeover's checkpoints (the daemon: the lifecycle tracker), awaited before it is done."""
        self.takeover.commit = commit

    def _interest(self) -> set[str]:
        """The nodes whose records this node reads in full at each change (the others' changes are taken for renewals
        until they stop: membership.py): the takers of the takeovers of owners it holds replicas of (a taker that
        restarted must be seen at once, or its takeover is never taken over), and the peers its connections to failed
        (their addresses as they are now). In steady state none: a renewal and the LIST's pages per ttl/3."""
        return takers_of(self.membership, self.replicas.owners()) | set(self.sender.rested) | set(self.sender.failures)

    async def _find_peers(self) -> None:
        """The node records read now, for an fsync at start-up that knows no peer yet (Sender._awaited_a_first_peer)."""
        try:
            await self.membership.refresh()
        except StoreError as e:
            log.info("node %s: could not read the node records to find a first peer: %s", self.me, e)

    async def _answers_as_me(self, addr: str) -> bool:
        for secret in self.secrets:
            if await answers_as(addr, self.me, secret, self.me, self.incarnation, self.journal_id,
                                min(self.cfg.peer_timeout, DUPLICATE_PROBE_SECONDS), self.cfg.peer_encryption):
                return True
        return False

    async def _open_link(self, node: str, addr: str) -> PeerLink:
        """Connect with peer_secret_file's secret; a peer that refuses it is tried with the previous one (a rotation:
        a node that has only the old secret yet)."""
        for i, secret in enumerate(self.secrets):
            try:
                return await PeerLink.open(self.cfg, self.me, self.membership.incarnation, node, addr, secret, self.journal_id)
            except PeerRefused:
                if i == len(self.secrets) - 1:
                    raise
        raise AssertionError("no secret")  # never: self.secrets holds peer_secret_file's at least

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listener, membership, sender, each supervised. An address the listener cannot bind raises the OSError
        before started (the daemon's one line)."""
        supervise = self.supervisor.supervise
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(supervise, "peer-listener", self.listener.run)  # port 0: the one bound is announced
                await nursery.start(supervise, "peer-membership", self.membership.run)
                await nursery.start(supervise, "peer-reconcile", self._reconcile)
                await nursery.start(supervise, "peer-sender", self.sender.run)
                await nursery.start(supervise, "peer-takeover", self.takeover.run)
                await nursery.start(supervise, "peer-sweep", self.sweep.run)
                nursery.start_soon(self._probe_conditions)
                task_status.started()
        finally:
            stop = getattr(self.records_store, "stop", None)
            if stop is not None and self.records_store is not self.store:
                stop()  # etcd's watch

    async def _probe_conditions(self) -> None:
        """Say at mount whether the store fences stale writes (docs/peers.md, "The store is the fence"): a takeover's
        writes are conditional on the ETag it judged; a store that ignores the condition lets a late one land."""
        try:
            ok = await threads.call(lambda: store_refuses_stale_writes(self.store, self.ns.keys.of(".ckptfs/probe-")))  # type: ignore[arg-type]
        except StoreError as e:
            log.info("could not ask the object store whether it honours conditional writes: %s", e)
            return
        self.conditional_writes = ok
        try:
            self.conditional_deletes = await threads.call(
                lambda: store_refuses_stale_deletes(self.store, self.ns.keys.of(".ckptfs/probe-")))  # type: ignore[arg-type]
        except StoreError as e:
            log.info("could not ask the object store whether it honours conditional deletes: %s", e)
        if self.conditional_deletes is False:
            log.warning("the object store ignores If-Match on DeleteObject: the drain's deletes go unconditional (a delete "
                        "landing late can remove an object another node wrote since; docs/peers.md)")
        if not ok:
            log.error("the object store ignores conditional writes (If-None-Match / If-Match): with durability = peer a "
                      "takeover's late write can replace a newer object and two claims of one node can both win; use a "
                      "store that supports them (AWS S3, SeaweedFS, MinIO; docs/peers.md)")

    def _listening(self, addr: str) -> None:
        """The listener bound `addr` (at start, or another port after a restart): the node record announces it at
        the next renewal, and the others' senders connect there once they read it."""
        if addr != self.membership.peer_addr:
            if self.membership.announced.is_set():
                log.warning("peer listener now on %s (was %s): the node record announces it at its next renewal",
                            addr, self.membership.peer_addr)
            self.membership.peer_addr = addr

    async def _reconcile(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Taken over while away (at start) or while paused (fenced later): set the journal right, then rejoin."""
        task_status.started()
        while True:
            if self.membership.must_reconcile:
                self._reconciling = True
                try:
                    await self.reconcile.run()
                finally:
                    self._reconciling = False
            await trio.sleep(max(0.2, self.cfg.peer_lease_ttl / 6))

    async def leave(self) -> None:
        """At a clean stop, once the drain is done: leave the cluster (departure.py) if nothing is left undrained;
        otherwise the lease runs out and a holder takes over what the bucket lacks, unless the node is back first."""
        s = self.ns.stats()
        if s["dirty_files"] or s["pending_deletes"] or s.get("pending_markers"):
            log.info("node %s: %d files not in the bucket yet: it does not leave the cluster; a holder of their copies "
                     "takes it over if it is not mounted again within peer_lease_ttl", self.me, s["dirty_files"])
            return
        bound = max(self.cfg.peer_timeout, 1.0)
        try:
            with trio.move_on_after(bound) as waited:  # a store that hangs at unmount must not hold the unmount
                await leave(self.membership)
        except StoreError as e:
            log.warning("node %s: could not write its record `left` (%s): its lease runs out instead, and a holder "
                        "finds nothing to take over", self.me, e)
            return
        if waited.cancelled_caught:
            log.warning("node %s: the store did not answer the write of its record `left` within %.0fs: its lease runs "
                        "out instead, and a holder finds nothing to take over", self.me, bound)

    async def remove_node(self, node: str, force: bool) -> dict[str, Any]:
        """`ckptfs remove-node`: a node that will not come back marked `left`; the control socket's answer."""
        try:
            return {"ok": True, "message": await remove_node(self.membership, node, force)}
        except RemoveRefused as e:
            return {"ok": False, "error": str(e)}
        except StoreError as e:
            return {"ok": False, "error": f"the node records cannot be read or written now ({e}): try again"}

    async def gate(self) -> None:
        """The drain's fence: at once while this node's lease is valid; a fenced node waits for its reconcile."""
        await self.membership.admit()

    async def replicated(self, ino: int) -> None:
        await self.sender.replicated(ino)

    async def names_replicated(self) -> None:
        await self.sender.names.replicated()

    def is_replicated(self, ino: int) -> bool:
        return self.sender.is_replicated(ino)

    def unreplicated_under(self, path: str) -> tuple[int, int]:
        return self.sender.unreplicated_under(path)

    async def wait_replicated_under(self, path: str) -> None:
        await self.sender.wait_replicated_under(path)

    def status(self) -> dict[str, Any]:
        """This node, its peers and the single-copy window (`ckptfs status --json`'s `peers` is the list here)."""
        own = self.membership.status()
        channels = self.sender.channel_status()
        peers = []
        for p in own.get("peers", []):
            ch = channels.get(p["node"], {})
            why, refused = self.sender.failures.get(p["node"], (None, False))
            # live by its record, but it closes our handshake (another peer_secret): as good as down for this node
            state = REFUSING if refused and p["state"] == LIVE and not ch.get("connected") else p["state"]
            peers.append({**p, "state": state, "error": why, "lag_seconds": ch.get("lag_seconds", 0.0),
                          "replicated_bytes": ch.get("replicated_bytes", 0), "connected": ch.get("connected", False)})
        single_bytes, single_age = self.sender.single_copy()
        return {
            "node": self.me,
            "incarnation": self.membership.incarnation,
            "state": "reconciling" if self._reconciling else own.get("state"),
            "failure_domain": self.cfg.failure_domain,
            "peer_addr": self.listener.addr,
            "peers": peers,
            "single_copy_bytes": single_bytes,
            "single_copy_oldest_age_seconds": round(single_age, 3),
            "replicated_bytes": self.sender.replicated_bytes,
            "replica_bytes_held": self.replicas.held_bytes(),
            "takeovers": self.takeover.takeovers_total,
            "takeover_conflicts": self.takeover.conflicts_total,
            "conditional_writes": self.conditional_writes,
            "conditional_deletes": self.conditional_deletes,
            "degraded_writes": self.sender.degraded_writes,
            "refused_writes": self.sender.refused_writes,
            "last_error": self.sender.last_error,
            "last_error_at": self.sender.last_error_at,
            "journal_id": self.journal_id,
            # why this node's writes count no peer copies now (no record of its own in the bucket...): None when they do
            "copies_uncounted": self.membership.copies_uncounted(),
            "holders": sorted(self.membership.listing.listed()),  # the nodes our record lists: only they may claim this one
            "membership": {"backend": self.cfg.peer_membership, "stale_seconds": _rounded(stale_seconds(self.membership)),
                           "error": membership_error(self.membership),
                           "requests": dict(self.requests.counts)},
            "replicas_refused_owners": self.listener.refused_owners,
            "replicas_refused": self.listener.full_answers,  # others' files refused here: peer_capacity or the disk full
            "handshake_refused": self.listener.refused_connections,  # connections closed unauthenticated: a flood, a wrong secret
            "owners_redirected": self.listener.owners_redirected,  # sent to their next candidate: this node's share taken
            "unclaimed_nodes": self.unclaimed_nodes(),
            "keys_refused": self.listener.keys_refused,  # frames naming keys outside the prefix: connection dropped
        }

    def unclaimed_nodes(self) -> list[str]:
        """Nodes dead for 2 x peer_lease_ttl that no holder claimed (or whose taker died unfinished that long): a
        takeover that cannot happen. No live node holds their copies: they had nothing undrained (then they can be
        removed), or their holders are down too (what only those held is lost until one comes back)."""
        now = self.membership.clock()
        return [n for n in self.membership.dead() if not self.membership.assumed(n)  # read in full: by its holders, at least
                and (rec := self.membership.record_of(n)) is not None and unclaimed_for(rec, now) >= 2 * self.cfg.peer_lease_ttl]
