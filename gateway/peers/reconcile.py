"""A node back after it was taken over: its journal set right against what the taker did, before it uploads again.

A node restarted with its cache intact, or one that was only paused past its lease, finds its record
`taken_over` (it is fenced: the drain's gate stays shut). Its journal still calls dirty the files the
taker uploaded from their replicas. Uploading them again would send every byte twice and could replace
objects other nodes wrote since, so, once the taker is done (`takeover_done`, or the taker is dead too):

* a file whose key holds an object with the file's own xxh3 becomes durable without an upload (and a
  multipart upload of it this node had in flight is aborted);
* a file whose key holds nothing is left to the drain: nobody uploaded it;
* a file whose key holds other bytes is judged by publishing.py's one rule, the takeover's and the drain's:
  the object this node last saw there, or one of its own (its drain's, or the taker's upload of an older
  version, by their provenance), is replaced by the drain as usual; anything else is another node's write
  since and wins: the row then describes the object (read from the bucket from now on), the local copy
  goes; logged and counted. A file changed here after the takeover is this node's new work, left to the drain;
* a queued delete whose key is gone was done (by the taker); one whose object another node wrote (its
  provenance) would delete another node's file: dropped.
Then the node rejoins (a new incarnation, its record live, the gate open).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from dataclasses import dataclass, field

import trio

from .. import threads
from ..config import Config
from ..journal import DURABLE, Row
from ..namespace import Namespace
from ..objects import ObjectInfo, StoreError
from ..sizes import small_objects_in_flight
from ..peering import node_name_of
from ..publishing import CONFLICT, Provenance, judge, written_by
from ..upload import XXH3_META, head_or_none, file_digests
from .membership import Membership
from .takeover import TakeoverStore

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    taken_over_by: str
    durable: list[str] = field(default_factory=list)  # keys made durable without an upload
    left_to_drain: list[str] = field(default_factory=list)
    bucket_won: list[str] = field(default_factory=list)
    changed_since: list[str] = field(default_factory=list)  # written here after the takeover: this node's new work
    deletes_dropped: list[str] = field(default_factory=list)
    aborted_uploads: int = 0


class Reconcile:
    def __init__(self, cfg: Config, ns: Namespace, store: TakeoverStore, membership: Membership) -> None:
        self.cfg, self.ns, self.store, self.membership = cfg, ns, store, membership
        self.me = node_name_of(cfg)
        self.hashing = trio.CapacityLimiter(2)
        self.requests = trio.CapacityLimiter(small_objects_in_flight(cfg.max_parts_in_flight))
        self.reconciles_total = 0
        self.bucket_won_total = 0

    async def run(self) -> ReconcileReport | None:
        """Reconcile if membership says this node was taken over (at start, or fenced while it ran); then rejoin.
        None when it was not: nothing to do."""
        m = self.membership
        if not m.must_reconcile:
            return None
        first = m.record_of(m.me) or m.record_at_start
        log.warning("this node (%s) was taken over by %s while it was away: waiting for that takeover to finish, then "
                    "reconciling what it uploaded with this node's journal before uploading anything", m.me,
                    first.taken_over_by if first is not None else "another node")
        while True:
            await m.wait_settled()
            now = m.record_of(m.me)
            # the first takeover's time: a later claim of our own record (its taker died) must not make files
            # written before the takeover look like new work
            times = [r.taken_over_at for r in (first, now) if r is not None and r.taken_over_at is not None]
            known = first or now
            report = ReconcileReport((known.taken_over_by or "") if known is not None else "")
            taken_at = min(times) if times else time.time()
            await self._files(report, taken_at)
            await self._deletes(report, taken_at)
            if await m.rejoin():
                break
            log.warning("node %s: a takeover of it is still running: reconciling again once it is done", m.me)
        self.reconciles_total += 1
        self.bucket_won_total += len(report.bucket_won)
        log.warning("reconciled after the takeover by %s: %d files durable without an upload, %d left to upload, %d replaced "
                    "in the bucket by another node (read from the bucket now), %d queued deletes dropped", report.taken_over_by,
                    len(report.durable), len(report.left_to_drain) + len(report.changed_since), len(report.bucket_won),
                    len(report.deletes_dropped))
        return report

    async def _head(self, key: str) -> ObjectInfo | None:
        return await head_or_none(self.store, key)

    async def _local_xxh3(self, ino: int, size: int, known: str | None, cached: bool) -> str | None:
        """The xxh3-128 of the file's bytes here: hashed from the cache file, or the digest a renamed remote file keeps."""
        if not cached:
            return known
        try:
            fd = self.ns.cache.open(ino)
        except FileNotFoundError:
            return known
        try:
            async with self.hashing:
                xxh3, _ = await threads.call_with_fd(fd, lambda own: file_digests(own, size, max(size, 1)))
            return xxh3
        finally:
            os.close(fd)

    async def _files(self, report: ReconcileReport, taken_at: float) -> None:
        """Every file this node had not uploaded, judged against the bucket (HEADs in parallel: a node back with
        thousands of files waiting must not take a request's latency per file in turn)."""
        j = self.ns.journal
        async with trio.open_nursery() as nursery:
            for row in j.pending_files():
                path = j.path_of(row.ino) if row.parent is not None else None
                if path is None:
                    continue  # unlinked while open: nothing of it goes to the bucket
                key = self.ns.keys.of(path)
                if changed_at(row) > taken_at or self.ns.files.in_use(row.ino):
                    report.changed_since.append(key)  # written here after the takeover: this node's new work
                    continue
                nursery.start_soon(self._file, row, key, report)

    async def _file(self, row: Row, key: str, report: ReconcileReport) -> None:
        j = self.ns.journal
        async with self.requests:
            info = await self._head(key)
        if info is None:
            report.left_to_drain.append(key)
            return
        mine = await self._local_xxh3(row.ino, row.size, row.xxh3, bool(row.cached))
        current = j.get(row.ino)
        if current is None or current.version != row.version or current.state == DURABLE:
            return  # changed meanwhile (a write, the drain): judged as any other change
        upload = j.upload_of(row.ino)
        theirs = info.metadata.get(XXH3_META)
        if info.size == row.size and mine is not None and theirs == mine:
            self.ns.uploads.durable_elsewhere(row.ino, key, info.etag, mine)
            report.durable.append(key)
        elif judge(Provenance(self.me, j.journal_id, row.ino, row.version), row.size, mine, info,
                   row.etag if row.etag and row.remote_key == key else "", legacy_mtime=changed_at(row)).action == CONFLICT:
            self.ns.uploads.replaced_elsewhere(row.ino, key, info.size, info.etag, theirs, info.modified)
            report.bucket_won.append(key)
            log.warning("%s was written by another node after this node's last change to it; the bucket's object wins: "
                        "this node's unuploaded version is dropped and the file is read from the bucket", key)
        else:
            # an older object (the file's previous version): nobody uploaded this node's change, the drain does,
            # as it would have without the takeover. One the takeover made for this node is the object the file's
            # upload replaces and its rename or removal deletes: the journal knows it from now
            if written_by(self.me, j.journal_id, info) and (row.remote_key != key or not row.etag):
                j.update(row.ino, remote_key=key, etag=info.etag)
            report.left_to_drain.append(key)
            return
        if upload is not None:
            await self._abort(upload.key, upload.upload_id, report)

    async def _abort(self, key: str, upload_id: str, report: ReconcileReport) -> None:
        try:
            await threads.call(functools.partial(self.store.abort, key, upload_id))
            report.aborted_uploads += 1
        except StoreError as e:  # gone already, or the store refuses: left to the drain's sweep of leaked uploads
            log.info("could not abort the multipart upload %s of %s: %s", upload_id, key, e)

    async def _deletes(self, report: ReconcileReport, taken_at: float) -> None:
        for delete_id, key, _ in self.ns.journal.pending_deletes():
            info = await self._head(key)
            ours = None if info is None else written_by(self.me, self.ns.journal.journal_id, info)
            # an object without provenance says nothing of its writer: then only its time can (LastModified has
            # whole seconds: the same one counts as after the takeover)
            if info is None or ours is False or ours is None and info.modified >= math.floor(taken_at):
                self.ns.uploads.drop_delete(delete_id)
                report.deletes_dropped.append(key)
                if info is not None:
                    log.warning("queued delete of %s dropped: another node wrote that key after this one was taken over", key)


def changed_at(row: Row) -> float:
    """When this node last changed the file (wall clock): its last close, which a `touch -d` cannot move; its mtime
    for a file never closed here."""
    return row.closed_at if row.closed_at else row.mtime_ns / 1e9
