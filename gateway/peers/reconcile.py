"""A node back after it was taken over: its journal set right against what the taker did, before it uploads again.

A node restarted with its cache intact, or one that was only paused past its lease, finds its record
`taken_over` (it is fenced: the drain's gate stays shut). Its journal still calls dirty the files the
taker uploaded from their replicas. Uploading them again would send every byte twice and could replace
objects other nodes wrote since, so, once the taker is done (`takeover_done`, or the taker is dead too):

* a file whose key holds an object with the file's own xxh3 becomes durable without an upload (and a
  multipart upload of it this node had in flight is aborted);
* a file whose key holds nothing is left to the drain: nobody uploaded it;
* a file whose key holds other bytes lost to the bucket: another node wrote that key while this one was
  away. The row then describes the object (read from the bucket from now on), the local copy goes; logged
  and counted. A file changed here after the takeover is this node's new work, and is left to the drain;
* a queued delete whose key is gone was done (by the taker); one whose object was written after the
  takeover would delete another node's file: dropped.
Then the node rejoins (a new incarnation, its record live, the gate open).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from .. import threads
from ..config import Config
from ..journal import DURABLE
from ..namespace import Namespace
from ..objects import NO_OBJECT, ObjectInfo, StoreError
from ..upload import XXH3_META, file_digests
from .takeover import TakeoverStore

log = logging.getLogger(__name__)

WAIT_POLL_SECONDS = 1.0


class ReconcileMembership(Protocol):
    """What a returning owner asks of membership (peers/membership.py)."""

    me: str
    record_at_start: dict[str, Any] | None  # this node's record as the daemon found it at start

    def dead(self) -> Any: ...

    async def record(self, node: str) -> dict[str, Any] | None: ...  # a node's record as the bucket has it now

    async def rejoin(self) -> None: ...


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
    def __init__(self, cfg: Config, ns: Namespace, store: TakeoverStore, membership: ReconcileMembership,
                 poll: float = WAIT_POLL_SECONDS) -> None:
        self.cfg, self.ns, self.store, self.membership, self.poll = cfg, ns, store, membership, poll
        self.hashing = trio.CapacityLimiter(2)
        self.reconciles_total = 0
        self.bucket_won_total = 0

    async def run(self, record: dict[str, Any] | None = None) -> ReconcileReport | None:
        """Reconcile if `record` (this node's; default: as found at start) says it was taken over; then rejoin.
        None when it was not: nothing to do, and membership goes on as usual."""
        record = record if record is not None else self.membership.record_at_start
        if not record or record.get("state") != "taken_over":
            return None
        taker = str(record.get("taken_over_by") or "")
        log.warning("this node (%s) was taken over by %s while it was away: waiting for that takeover to finish, then "
                    "reconciling what it uploaded with this node's journal before uploading anything", self.membership.me, taker)
        record = await self._wait_for_taker(record)
        report = ReconcileReport(str(record.get("taken_over_by") or taker))
        taken_at = float(record.get("taken_over_at") or time.time())
        await self._files(report, taken_at)
        await self._deletes(report, taken_at)
        self.reconciles_total += 1
        self.bucket_won_total += len(report.bucket_won)
        log.warning("reconciled after the takeover by %s: %d files durable without an upload, %d left to upload, %d replaced "
                    "in the bucket by another node (read from the bucket now), %d queued deletes dropped", report.taken_over_by,
                    len(report.durable), len(report.left_to_drain) + len(report.changed_since), len(report.bucket_won),
                    len(report.deletes_dropped))
        await self.membership.rejoin()
        return report

    async def _wait_for_taker(self, record: dict[str, Any]) -> dict[str, Any]:
        """This node's record once its takeover is done, or its taker is dead (nobody finishes it then but us)."""
        while True:
            now = await self.membership.record(self.membership.me)
            if now is None or now.get("state") != "taken_over" or now.get("takeover_done"):
                return now if now is not None else record
            dead = self.membership.dead()
            if inspect.isawaitable(dead):
                dead = await dead
            if now.get("taken_over_by") in set(dead):
                log.warning("%s, which took this node over, is dead before it finished: reconciling with what it did", now.get("taken_over_by"))
                return now
            await trio.sleep(self.poll)

    async def _head(self, key: str) -> ObjectInfo | None:
        try:
            return await threads.call(functools.partial(self.store.head_object, key))
        except StoreError as e:
            if e.kind == NO_OBJECT:
                return None
            raise

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
        j = self.ns.journal
        for row in j.pending_files():
            path = j.path_of(row.ino) if row.parent is not None else None
            if path is None:
                continue  # unlinked while open: nothing of it goes to the bucket
            key = self.ns.keys.of(path)
            if row.mtime_ns / 1e9 > taken_at or self.ns.files.in_use(row.ino):
                report.changed_since.append(key)  # written here after the takeover: this node's new work
                continue
            info = await self._head(key)
            if info is None:
                report.left_to_drain.append(key)
                continue
            mine = await self._local_xxh3(row.ino, row.size, row.xxh3, bool(row.cached))
            current = j.get(row.ino)
            if current is None or current.version != row.version or current.state == DURABLE:
                continue  # changed meanwhile (a write, the drain): judged as any other change
            upload = j.upload_of(row.ino)
            theirs = info.metadata.get(XXH3_META)
            if info.size == row.size and mine is not None and theirs == mine:
                self.ns.uploads.durable_elsewhere(row.ino, key, info.etag, mine)
                report.durable.append(key)
            else:
                self.ns.uploads.replaced_elsewhere(row.ino, key, info.size, info.etag, theirs, info.modified)
                report.bucket_won.append(key)
                log.warning("%s was written by another node while this one was taken over; the bucket's object wins: this "
                            "node's unuploaded version is dropped and the file is read from the bucket", key)
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
            if info is None or info.modified > taken_at:
                self.ns.uploads.drop_delete(delete_id)
                report.deletes_dropped.append(key)
                if info is not None:
                    log.warning("queued delete of %s dropped: another node wrote that key after this one was taken over", key)
