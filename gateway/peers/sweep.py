"""Replicas that outlived their file's durability, dropped: no replica stays more than `peer_drop_grace` after it.

The owner tells its peers as soon as a file is durable (`forget`); that message can be lost (a broken
connection, the owner killed right after its upload), and an owner can be gone for good, taken over by
another holder. So every half of `peer_drop_grace` the sweep asks the bucket:

* an owner whose record is gone, whose takeover another node finished, or that left the cluster (departure.py):
  all its replicas go (the bucket has what could be made durable);
* an entry older than half the grace whose key holds an object with the entry's xxh3: durable, dropped;
* a queued delete whose key holds nothing: done, dropped;
* a checkpoint noted for an owner (its files durable, its commit not seen: ReplicaStore.forget) is forgotten once
  the owner stayed live long enough after the note to have committed it (quiet period, two leases and the grace);
  one of an owner another node took over is handed to `on_checkpoints` (the lifecycle tracker) before its
  replicas go: the winner of the claim commits the checkpoints it noted, this node those it did (a manifest that
  already describes the files is left as it is, so a checkpoint noted by both commits once).

And the node records of nodes taken over long ago (takeover finished, nothing written for
`peer_record_expiry`) are deleted, If-Match, so `.ckptfs/nodes/` does not list every node that ever was.
An owner taken over by another node that has not finished keeps its replicas here: that takeover may
have to be taken over.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import trio

from ..config import Config
from .. import threads
from ..objects import NO_OBJECT, PRECONDITION, ObjectInfo, StoreError
from ..upload import XXH3_META, head_or_none
from .membership import Membership
from .records import LEFT, LIVE, TAKEN_OVER, is_expired, record_path, same_journal
from .replicas import ReplicaStore

log = logging.getLogger(__name__)


class SweepStore(Protocol):
    """What the sweep asks of the object store."""

    def head_object(self, key: str) -> ObjectInfo: ...


@dataclass
class SweepReport:
    owners_dropped: list[str] = field(default_factory=list)
    entries_dropped: list[str] = field(default_factory=list)  # keys
    deletes_dropped: list[str] = field(default_factory=list)
    records_pruned: list[str] = field(default_factory=list)  # nodes whose records were deleted (peer_record_expiry)


class Sweep:
    def __init__(self, cfg: Config, store: SweepStore, replicas: ReplicaStore, membership: Membership,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.store, self.replicas, self.membership, self.clock = cfg, store, replicas, membership, clock
        self.dropped_total = 0
        # mount-relative checkpoint paths to commit (the daemon: the lifecycle tracker's `taken_over`)
        self.on_checkpoints: list[Callable[[list[str]], None]] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.cfg.peer_drop_grace / 2)
            try:
                await self.once()
            except (StoreError, OSError) as e:  # the next sweep asks again; replicas are kept meanwhile, never lost
                log.warning("sweep of replicas held for other nodes stopped short: %s", e)

    async def _head(self, key: str) -> ObjectInfo | None:
        return await head_or_none(self.store, key)

    async def once(self) -> SweepReport:
        report = SweepReport()
        old = self.clock() - self.cfg.peer_drop_grace / 2
        for owner in self.replicas.owners():
            record = self.membership.record_of(owner)
            if record is None and await self._head(self.membership.key_of(record_path(owner))) is not None:
                continue  # not in the records last read, but there (a read that failed, a node just back): next time
            if record is None or record.state == LEFT or (
                    record.state == TAKEN_OVER and record.takeover_done and record.taken_over_by != self.membership.me):
                why = ("its record is gone" if record is None else "it left the cluster" if record.state == LEFT
                       else f"{record.taken_over_by} took it over")
                log.info("replicas of %s dropped (%d bytes): %s", owner, self.replicas.held_bytes(owner), why)
                noted = self.replicas.checkpoints(owner)
                if record is not None and noted:
                    for hook in self.on_checkpoints:
                        try:
                            hook(noted)
                        except Exception:  # noqa: BLE001 - a hook's bug must not keep replicas forever
                            log.exception("a hook on the checkpoints of %s failed", owner)
                if record is None:
                    self.replicas.drop_owner(owner)
                else:  # only what the claimed incarnation's journal sent: not what one that rejoined since sent here
                    admitted = self.membership.admitted.get(owner)
                    self.replicas.drop_owner(owner, record.journal_id or None,
                                             admitted if admitted != record.incarnation else None)
                report.owners_dropped.append(owner)
                continue
            if record.state == LIVE and record.journal_id:
                # a predecessor's under this name (another journal): taken over before this journal could announce
                for e in self.replicas.entries(owner):
                    if not same_journal(e.journal, record.journal_id):
                        self.replicas.drop(owner, e.ino)
                        report.entries_dropped.append(e.key)
            for e in self.replicas.entries(owner):
                if e.mtime > old or not e.sealed or not e.xxh3:
                    continue
                info = await self._head(e.key)
                if info is not None and info.size == e.size and info.metadata.get(XXH3_META) == e.xxh3:
                    if e.checkpoint:  # as a forget would: the owner may still have to commit it
                        self.replicas.note_checkpoint(owner, e.checkpoint, self.clock())
                    self.replicas.drop(owner, e.ino)
                    report.entries_dropped.append(e.key)
            if record.state != TAKEN_OVER and owner not in self.membership.dead():
                quiet = getattr(self.cfg, "checkpoint_quiet_seconds", 0.0)
                self.replicas.forget_checkpoints(self.clock() - quiet - 2 * self.cfg.peer_lease_ttl - self.cfg.peer_drop_grace, owner)
            for d in self.replicas.deletes(owner):
                if await self._head(d.key) is None:
                    self.replicas.drop_delete(owner, d.op_id)
                    report.deletes_dropped.append(d.key)
        report.records_pruned = await prune_expired(self.membership, self.cfg.peer_record_expiry)
        dropped = len(report.entries_dropped) + len(report.deletes_dropped)
        self.dropped_total += dropped
        if dropped:
            log.info("sweep: %d replicas of durable files and %d done deletes dropped (their owners' word was lost)",
                     len(report.entries_dropped), len(report.deletes_dropped))
        return report


async def prune_expired(m: Membership, expiry: float) -> list[str]:
    """Delete the records of nodes taken over or left long ago (`records.is_expired`, by the records last read), each If-Match
    on the ETag it was judged by: a node that came back and wrote its record since is never removed, and of nodes
    pruning at once one deletes, the others find it gone. The nodes whose records this call deleted."""
    now = m.clock()
    pruned = []
    for node, rec in list(m._records.items()):
        etag = rec.etag
        if etag is None or not is_expired(rec, now, expiry):
            continue
        key = m.key_of(record_path(node))
        try:
            await threads.call(lambda: m.store.delete_if_match(key, etag))
        except StoreError as e:
            if e.kind in (PRECONDITION, NO_OBJECT):
                continue  # written again (the node is back) or pruned by another node: the next read says which
            raise
        m._records.pop(node, None)
        pruned.append(node)
        log.info("node record of %s deleted: %s, nothing written to it for %.0f s (peer_record_expiry)", node,
                 "it left the cluster" if rec.state == LEFT else f"taken over by {rec.taken_over_by}",
                 now - max(rec.renewed_at, rec.taken_over_at or 0.0))
    return pruned
