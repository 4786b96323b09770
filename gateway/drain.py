"""The drainer: uploads finished files to the object store in the background.

Scheduling: files become eligible `upload_delay` seconds after their last
close (so `write tmp, close, rename` renames first), oldest close first;
commit markers wait for every other file under their directory. The upload
queue keeps them in memory (namespace/backlog.py): a wake costs what changed
since the last one, not the files waiting. Global `CapacityLimiter`s bound
the requests in flight: `max_parts_in_flight` parts (and copies), and
`small_objects_in_flight` PutObjects of whole small files (latency-bound, so
more of them; deletes and `dir/` markers count among them); at most
`max_parts_in_flight` multipart files at once.

Correctness rests on one check: while an upload runs (before each part, and
before CompleteMultipartUpload) the file's version must still be the one the
upload started from. Otherwise the upload is abandoned (aborted) and the file
re-queued, so a reader of the bucket never sees bytes the file no longer has.
A file only renamed meanwhile keeps its upload, under the key it started with
(a multipart upload cannot change its key; one interrupted is resumed under
it too); once complete, the namespace has it copied inside the store to the
new key and the old one deleted (`UploadQueue.finish_upload`): no byte
already sent is sent again.

Failed requests are retried forever for acknowledged data, with exponential
backoff and jitter per file, capped at `retry_max_backoff`.

A `gate` (with `durability = peer`: peers.Membership.admit, the fence) is awaited
before every request that writes to the bucket: a small file's PutObject, the
start of a multipart upload, each part, its completion, a copy, a delete, a
`dir/` marker. A node that lost its lease (paused past it, or taken over by
another node that uploaded its files) so sends nothing new; the requests already
past the gate when it closed are the most it sends. No gate: no cost.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import trio
from . import threads
from .cache import Cache
from .drainfence import DrainFence
from .config import Config, part_size_for, small_objects_in_flight
from .journal import DiskFull, JournalIOError, UploadRecord
from .metrics import Metrics
from .namespace import Namespace, Pending, UploadTicket
from .objects import AUTH, NO_BUCKET, NO_OBJECT, NO_UPLOAD, PRECONDITION, StoreError
from .storeapi import ObjectStore
from .peering import node_name_of
from .publishing import Provenance
from .upload import XXH3_META, Abandoned, file_digests, put_whole

log = logging.getLogger(__name__)

@dataclass
class Backoff:
    attempts: int = 0
    next_at: float = 0.0

    def fail(self, cap: float, floor: float = 0.0) -> float:
        """Exponential backoff with jitter; `floor` for errors only an operator can fix."""
        self.attempts += 1
        delay = max(floor, min(cap, 0.5 * 2 ** min(self.attempts, 20)) * random.uniform(0.5, 1.0))
        self.next_at = time.monotonic() + delay
        return delay


class Throughput:
    """Upload throughput now: bytes that reached the bucket in the last `window` seconds, per second spent sending.

    Bytes count when a part or a single object completes; the time counted is
    the time within the window during which at least one upload was in flight,
    so a burst after an idle spell is not averaged with the idle time, and a
    drain that is sending but completes nothing (a stuck store) reads 0.
    """

    def __init__(self, window: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self.completed: deque[tuple[float, int]] = deque()
        self.spells: deque[list[float]] = deque()  # [start, end] of spells with something in flight; end = inf while one runs
        self.in_flight = 0

    def started(self) -> None:
        if self.in_flight == 0:
            self.spells.append([self.clock(), math.inf])
        self.in_flight += 1

    def stopped(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.spells[-1][1] = self.clock()

    def add(self, nbytes: int) -> None:
        self.completed.append((self.clock(), nbytes))

    def rate(self) -> float:
        """Bytes per second over the window; 0 when nothing completed in it."""
        now = self.clock()
        cut = now - self.window
        while self.completed and self.completed[0][0] < cut:
            self.completed.popleft()
        while self.spells and self.spells[0][1] < cut:
            self.spells.popleft()
        sent = sum(n for _, n in self.completed)
        busy = sum(max(0.0, min(end, now) - max(start, cut)) for start, end in self.spells)
        return sent / busy if sent and busy > 0 else 0.0


class Drainer:
    def __init__(self, cfg: Config, ns: Namespace, cache: Cache, store: ObjectStore, metrics: Metrics,
                 gate: Callable[[], Awaitable[None]] | None = None) -> None:
        self.cfg, self.ns, self.cache, self.store, self.metrics = cfg, ns, cache, store, metrics
        self.gate = gate  # awaited before each request that writes to the bucket (the fence); None: none
        self.fence = DrainFence(store, ns.journal, node_name_of(cfg), key_of=ns.keys.of)  # and the store's: conditional writes (peers)
        self.parts = trio.CapacityLimiter(cfg.max_parts_in_flight)
        self.hashing = trio.CapacityLimiter(2)
        self.multipart_files = trio.CapacityLimiter(max(2, cfg.max_parts_in_flight))
        small = small_objects_in_flight(cfg.max_parts_in_flight)
        self.small = trio.CapacityLimiter(small)  # small requests: PutObjects of small files, deletes, `dir/` markers
        # their worker threads: a limiter of their own, so they never take trio's default threads from parts and the rest
        self.small_threads = trio.CapacityLimiter(small)
        # twice the small slots: the next small file is ready (ticket taken, cache file open) when a slot frees
        self.max_files = max(2, cfg.max_parts_in_flight) + 2 * small
        self.max_object_ops = small  # deletes and `dir/` markers at once (each a small request)
        self.busy: set[int] = set()
        self.busy_keys: set[str] = set()
        self.deleting: set[int] = set()
        self.backoff: dict[int, Backoff] = {}
        self.delete_backoff: dict[int, Backoff] = {}
        self.deletes_not_permitted_total = 0  # deletes the store refused with AccessDenied (not retried)
        self.last_error: str = ""
        self.last_error_at: float | None = None  # time.time() of last_error
        self.throughput = Throughput()
        # ino -> bytes of its running upload already in the bucket (finished parts): flush and status progress
        self.sent: dict[int, int] = {}
        self._wake = trio.Event()
        ns.on_change = self.wake

    def _error(self, message: str) -> None:
        self.last_error = message
        self.last_error_at = time.time()

    def _floor(self, e: StoreError) -> float:
        return self.cfg.retry_auth_backoff if e.kind in (AUTH, NO_BUCKET) else 0.0

    def wake(self) -> None:
        self._wake.set()

    def idle(self) -> bool:
        return not self.busy and not self.deleting

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            nursery.start_soon(abort_leaked_uploads, self.cfg, self.ns, self.store, self.busy_keys)
            while True:
                self._wake = trio.Event()
                next_at = self._schedule(nursery)
                timeout = 5.0 if next_at is None else max(0.01, next_at - time.time())
                with trio.move_on_after(timeout):
                    await self._wake.wait()

    def _schedule(self, nursery: trio.Nursery) -> float | None:
        now_mono = time.monotonic()
        ready, next_at = self.ns.uploads.take(time.time(), self.max_files - len(self.busy), self.busy_keys)
        for p in ready:
            self.busy.add(p.ino)
            self.busy_keys.add(p.key)
            nursery.start_soon(self._upload_file, p)
        markers, marker_at = self.ns.uploads.ready_markers(time.time(), self.busy_keys)
        if marker_at is not None:
            next_at = marker_at if next_at is None else min(next_at, marker_at)
        for marker_id, key in markers:
            b = self.delete_backoff.get(marker_id)
            if marker_id in self.deleting or (b and b.next_at > now_mono):
                continue
            self.deleting.add(marker_id)
            self.busy_keys.add(key)
            nursery.start_soon(self._put_marker, marker_id, key)
        held = {i for i, b in self.delete_backoff.items() if b.next_at > now_mono}
        for delete_id, key in self.ns.uploads.ready_deletes(self.busy_keys, self.max_object_ops - len(self.deleting),
                                                             self.deleting | held):
            self.deleting.add(delete_id)
            self.busy_keys.add(key)
            nursery.start_soon(self._delete, delete_id, key)
        # a file's retry time is in the upload queue (`upload_ended`); the deletes' are here
        pending_retry = [b.next_at for b in self.delete_backoff.values() if b.next_at > now_mono]
        if pending_retry:
            retry_at = time.time() + (min(pending_retry) - now_mono)
            next_at = retry_at if next_at is None else min(next_at, retry_at)
        return next_at

    # ----------------------------------------------------------------- upload
    async def _upload_file(self, p: Pending) -> None:
        """Upload `p` (taken from the queue), then hand it back: durable, or queued again (after a backoff if it failed)."""
        try:
            if p.size < self.cfg.multipart_threshold:
                await self._send_file(p)
            else:
                async with self.multipart_files:
                    await self._send_file(p)
        except (DiskFull, JournalIOError) as e:  # not even the upload's start could be recorded
            self._journal_failed(p, e)
        finally:
            self.sent.pop(p.ino, None)
            self.busy.discard(p.ino)
            self.busy_keys.discard(p.key)
            b = self.backoff.get(p.ino)
            wait = b.next_at - time.monotonic() if b is not None else 0.0
            self.ns.uploads.upload_ended(p.ino, time.time() + wait if wait > 0 else 0.0)
            self.wake()

    async def _send_file(self, p: Pending) -> None:
        ticket = self.ns.uploads.begin_upload(p.ino)
        try:
            if ticket is None:
                return
            if ticket.copy_from:
                await self._copy_file(ticket)
                return
            try:
                fd = self.cache.open(p.ino)
            except FileNotFoundError:
                return
            key = ticket.key
            try:
                etag, xxh3 = await self._upload(ticket, fd)
            finally:
                os.close(fd)
                if ticket.key != key:  # resumed under the key it had before a rename (_multipart)
                    self.busy_keys.discard(ticket.key)
            if self.ns.uploads.finish_upload(ticket, etag, xxh3):
                self.backoff.pop(p.ino, None)
                self.metrics.uploaded_files.inc()
                log.info("durable: %s (%d bytes, etag %s)", ticket.key, ticket.size, etag)
            elif self.ns.uploads.bytes_current(ticket):
                self.backoff.pop(p.ino, None)
                log.info("uploaded %s, renamed meanwhile: copied to its new key inside the store next", ticket.key)
            else:
                self.metrics.abandoned_uploads.inc()
        except Abandoned as e:
            self._abandoned(p, str(e))
        except (DiskFull, JournalIOError) as e:
            self._journal_failed(p, e)
        except (StoreError, OSError) as e:
            if ticket is not None and not self.ns.uploads.bytes_current(ticket):
                # the file was rewritten, truncated or removed under the upload (a part whose
                # CRC32 no longer matches, a cache file that shrank): not the store's fault, and the
                # new version goes out at once, without the error backoff
                self._abandoned(p, f"file changed while it uploaded ({e})")
            elif isinstance(e, StoreError):
                self._store_failed(p, e)
            else:
                self._read_failed(p, e)
        except Exception as e:  # noqa: BLE001 - a bug must not stop the drain of everything else
            self.metrics.upload_errors.labels("other").inc()
            delay = self.backoff.setdefault(p.ino, Backoff()).fail(self.cfg.retry_max_backoff)
            self._error(f"internal error uploading {p.key}: {e!r}")
            log.exception("upload of %s failed (retry in %.1fs)", p.key, delay)
            self._mark_failed(p.ino)

    def _abandoned(self, p: Pending, why: str) -> None:
        log.info("upload of %s abandoned: %s", p.key, why)
        self.metrics.abandoned_uploads.inc()
        self.backoff.pop(p.ino, None)  # a stale version's failures say nothing about the new one
        self._mark_failed(p.ino)

    def _mark_failed(self, ino: int) -> None:
        """Queue a file whose upload did not finish again; the journal may refuse even that (a full or failing
        cache disk): the row then stays `uploading`, which the drain takes up again just the same."""
        try:
            self.ns.uploads.upload_failed(ino)
        except OSError as e:
            log.warning("could not record a failed upload of inode %d in the journal (%s): it is retried all the same", ino, e)

    def _retry_later(self, p: Pending, kind: str, error: str, level: int, what: str, floor: float = 0.0) -> None:
        """A failed upload: counted, kept queued with the file's backoff (never drop acknowledged data), said why."""
        self.metrics.upload_errors.labels(kind).inc()
        delay = self.backoff.setdefault(p.ino, Backoff()).fail(self.cfg.retry_max_backoff, floor)
        self._error(error)
        log.log(level, "upload of %s %s (retry in %.1fs)", p.key, what, delay)
        self._mark_failed(p.ino)

    def _journal_failed(self, p: Pending, e: OSError) -> None:
        # the store has the bytes (or not), but the journal cannot say so now: upload again once it can
        self._retry_later(p, "other", f"the journal cannot record the upload of {p.key}: {e}", logging.WARNING,
                          f"cannot be recorded in the journal: {e}")

    def _store_failed(self, p: Pending, e: StoreError) -> None:
        level = logging.ERROR if e.kind in ("auth", "no-bucket") else logging.WARNING
        self._retry_later(p, e.kind, str(e), level, f"failed: {e}", self._floor(e))

    def _read_failed(self, p: Pending, e: OSError) -> None:
        # the cache file could not be read: keep it queued
        self._retry_later(p, "other", f"reading cache file for {p.key}: {e}", logging.ERROR, f"failed reading the cache: {e}")

    async def _copy_file(self, ticket: UploadTicket) -> None:
        """A renamed durable file: copy its object inside the store (the old one is deleted after)."""
        assert ticket.copy_from is not None
        try:
            async with self.parts:
                if self.gate is not None:
                    await self.gate()
                self.metrics.parts_in_flight.inc()
                try:
                    etag = await threads.call(functools.partial(
                        self.store.copy, ticket.copy_from, ticket.key, ticket.size,
                        part_size_for(ticket.size, self.cfg.part_size), self.cfg.copy_multipart_threshold,
                    ))
                finally:
                    self.metrics.parts_in_flight.dec()
        except StoreError as e:
            if e.kind != NO_OBJECT:
                raise
            self.ns.tree.copy_source_gone(ticket.ino)
            self._mark_failed(ticket.ino)
            return
        if self.ns.uploads.finish_upload(ticket, etag, ticket.xxh3 or ""):
            self.backoff.pop(ticket.ino, None)
            self.metrics.copied_objects.inc()
            log.info("durable: %s (copied from %s, %d bytes)", ticket.key, ticket.copy_from, ticket.size)

    def _check(self, ticket: UploadTicket) -> None:
        """Raise Abandoned if the file's bytes are no longer the ticket's, or its old name another file's (a rename alone does not)."""
        if not self.ns.uploads.publishable(ticket):
            raise Abandoned("file changed or was removed, or another file took the name it uploads under")

    async def _upload(self, ticket: UploadTicket, fd: int) -> tuple[str, str]:
        """Upload the ticket's bytes, conditional on what this node last saw at the key (drainfence.py); a refusal
        judged once, then written again under the condition judged, or found durable already."""
        try:
            return await self._upload_as(ticket, fd, None)
        except StoreError as e:
            if e.kind != PRECONDITION or not self.fence.enabled():
                raise
        condition, there = await self.fence.rejudge(ticket, fd)
        return there if there is not None else await self._upload_as(ticket, fd, condition)

    async def _upload_as(self, ticket: UploadTicket, fd: int, condition: dict[str, Any] | None) -> tuple[str, str]:
        size = ticket.size
        if size < self.cfg.multipart_threshold:
            return await self._put(ticket, fd, condition)
        part_size = part_size_for(size, self.cfg.part_size)
        async with self.hashing:
            xxh3, crcs = await trio.to_thread.run_sync(file_digests, fd, size, part_size)
        self._check(ticket)
        return await self._multipart(ticket, fd, part_size, xxh3, crcs, {**self._provenance(ticket), XXH3_META: xxh3},
                                     condition), xxh3

    def _provenance(self, ticket: UploadTicket) -> dict[str, str]:
        """Whose file the object is (publishing.py): this node, its journal, the file's inode and version. A takeover
        of this node, its reconcile and other nodes judge by it whether they may replace the object, never by time."""
        return Provenance(node_name_of(self.cfg), self.ns.journal.journal_id, ticket.ino, ticket.version).meta()

    async def _put(self, ticket: UploadTicket, fd: int, condition: dict[str, Any] | None) -> tuple[str, str]:
        """A file below `multipart_threshold`: one PutObject, its digests computed in the same worker thread.

        One thread hop per file instead of two, and `small_objects_in_flight` of them at once: enough
        requests to keep the store busy, as a small request waits on its latency, not on the bandwidth.
        A change after the check below is caught as with every upload: the bytes no longer match the
        CRC32 sent (the store refuses them), or `finish_upload` finds the version moved on.
        """
        size = ticket.size

        async with self.small:
            if self.gate is not None:
                await self.gate()
            self._check(ticket)
            self.metrics.parts_in_flight.inc()
            self.throughput.started()
            try:
                cond = self.fence.condition(ticket.ino, ticket.key) if condition is None else condition
                etag, xxh3 = await threads.call_with_fd(fd, functools.partial(put_whole, self.store, ticket.key, size=size,
                                                                              metadata=self._provenance(ticket), **cond),
                                                         limiter=self.small_threads)
            finally:
                self.metrics.parts_in_flight.dec()
                self.throughput.stopped()
        self.metrics.uploaded_bytes.inc(size)
        self.throughput.add(size)
        return etag, xxh3

    async def _multipart(self, ticket: UploadTicket, fd: int, part_size: int, xxh3: str, crcs: list[str], metadata: dict[str, str],
                         condition: dict[str, Any] | None) -> str:
        journal = self.ns.journal
        count = len(crcs)
        done: dict[int, str] = {}
        rec = journal.upload_of(ticket.ino)
        taken = rec is not None and rec.key != ticket.key and (
            rec.key in self.busy_keys or journal.resolve(self.ns.keys.path(rec.key)) is not None)  # another file's name now
        if rec and not taken and (rec.size, rec.xxh3, rec.part_size) == (ticket.size, xxh3, part_size):
            try:
                remote = await threads.call(functools.partial(self.store.list_parts, rec.key, rec.upload_id))
                # the same bytes, perhaps under a name the file had before a rename: resumed under that key
                # (finish_upload then has the object copied to the file's key), which is busy meanwhile
                if rec.key != ticket.key:
                    ticket.key = rec.key
                    self.busy_keys.add(rec.key)  # _send_file lets it go
                for n, (etag, crc) in rec.parts.items():
                    r = remote.get(n)
                    if r is not None and r.etag == etag and n <= count and crc == crcs[n - 1]:
                        done[n] = etag
                upload_id = rec.upload_id
                log.info("resuming upload of %s: %d of %d parts already in the bucket", ticket.key, len(done), count)
            except StoreError as e:
                if e.kind != NO_UPLOAD:
                    raise
                rec = None
        elif rec:
            await threads.call(functools.partial(self.store.abort, rec.key, rec.upload_id))
            journal.forget_upload(ticket.ino)
            rec = None
        if rec is None:
            if self.gate is not None:
                await self.gate()
            upload_id = await threads.call(functools.partial(self.store.create_multipart, ticket.key, metadata))
            journal.start_upload(UploadRecord(ticket.ino, ticket.key, upload_id, part_size, ticket.size, xxh3, time.time(), {}))
        self.sent[ticket.ino] = sum(min(part_size, ticket.size - (n - 1) * part_size) for n in done)

        async def send(n: int) -> None:
            async with self.parts:
                if self.gate is not None:
                    await self.gate()
                self._check(ticket)
                offset = (n - 1) * part_size
                length = min(part_size, ticket.size - offset)
                self.metrics.parts_in_flight.inc()
                self.throughput.started()
                try:
                    etag = await threads.call_with_fd(
                        fd, lambda own: self.store.upload_part(ticket.key, upload_id, n, own, offset, length, crcs[n - 1])
                    )
                finally:
                    self.metrics.parts_in_flight.dec()
                    self.throughput.stopped()
                journal.record_part(ticket.ino, n, etag, crcs[n - 1])
                done[n] = etag
                self.sent[ticket.ino] = self.sent.get(ticket.ino, 0) + length
                self.metrics.uploaded_bytes.inc(length)
                self.throughput.add(length)

        try:
            async with trio.open_nursery() as parts:
                for n in range(1, count + 1):
                    if n not in done:
                        parts.start_soon(send, n)
            if self.gate is not None:  # before CompleteMultipartUpload
                await self.gate()
            self._check(ticket)
        except Abandoned:
            await threads.call(functools.partial(self.store.abort, ticket.key, upload_id))
            journal.forget_upload(ticket.ino)
            raise
        except BaseException as e:
            if isinstance(e, BaseExceptionGroup):
                # a part failed: report the first store error, keep the upload for resuming
                store_errors = e.subgroup(StoreError)
                abandoned = e.subgroup(Abandoned)
                if abandoned is not None:
                    await threads.call(functools.partial(self.store.abort, ticket.key, upload_id))
                    journal.forget_upload(ticket.ino)
                    raise abandoned.exceptions[0] from None
                if store_errors is not None:
                    raise _first(store_errors) from None
            raise
        try:
            parts = [(n, done[n], crcs[n - 1]) for n in range(1, count + 1)]
            cond = self.fence.condition(ticket.ino, ticket.key) if condition is None else condition
            return await threads.call(functools.partial(self.store.complete, ticket.key, upload_id, parts, **cond))
        except StoreError as e:
            if e.kind == NO_UPLOAD:
                journal.forget_upload(ticket.ino)
            raise

    # ------------------------------------------------------ object operations
    async def _put_marker(self, marker_id: int, key: str) -> None:
        if await self._object_op(marker_id, key, "put of directory marker", self.store.put_marker):
            if self._recorded(marker_id, key, lambda: self.ns.uploads.marker_done(marker_id, key)):
                log.info("put directory marker %s", key)

    async def _delete(self, delete_id: int, key: str) -> None:
        if await self._object_op(delete_id, key, "delete of", self.fence.deleter(delete_id)):
            if self._recorded(delete_id, key, lambda: self.ns.uploads.delete_done(delete_id, key)):
                self.metrics.deleted_objects.inc()
                log.info("deleted object %s", key)

    def _recorded(self, op_id: int, key: str, record: Callable[[], None]) -> bool:
        """Record a done delete or marker put; if the journal cannot (a full or failing cache disk) it stays
        queued and is done again after a backoff (both are idempotent in the store)."""
        try:
            record()
            return True
        except OSError as e:
            delay = self.delete_backoff.setdefault(op_id, Backoff()).fail(self.cfg.retry_max_backoff)
            self._error(f"the journal cannot record the operation on {key}: {e}")
            log.warning("%s done in the store, but the journal cannot record it (%s): again in %.1fs", key, e, delay)
            return False

    async def _object_op(self, op_id: int, key: str, what: str, call: Callable[[str], None]) -> bool:
        """One queued delete or marker put, with the drain's backoff; True once it succeeded.

        A small request like a small file's PutObject: they share `small_objects_in_flight` (and so the
        store's connection pool, sized for them)."""
        try:
            async with self.small:
                if self.gate is not None:
                    await self.gate()
                await threads.call(functools.partial(call, key), limiter=self.small_threads)
            self.delete_backoff.pop(op_id, None)
            return True
        except StoreError as e:
            self.metrics.upload_errors.labels(e.kind).inc()
            if e.denied and what == "delete of":
                # valid credentials without the permission to delete (a writer role, docs/security.md): retrying cannot
                # help, so the delete is dropped and reported; the object stays in the bucket and shows again
                if not self._recorded(op_id, key, lambda: self.ns.uploads.drop_delete(op_id)):
                    return False
                self.delete_backoff.pop(op_id, None)
                self.deletes_not_permitted_total += 1
                self.last_error = f"delete of {key} not permitted by the store (AccessDenied): the object stays in the bucket"
                log.warning("%s; this node's credentials cannot delete, which is the retention role's job (docs/security.md)",
                            self.last_error)
                return False
            delay = self.delete_backoff.setdefault(op_id, Backoff()).fail(self.cfg.retry_max_backoff, self._floor(e))
            self._error(str(e))
            log.warning("%s %s failed: %s (retry in %.1fs)", what, key, e, delay)
            return False
        finally:
            self.deleting.discard(op_id)
            self.busy_keys.discard(key)
            self.wake()


def _first(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def abort_leaked_uploads(cfg: Config, ns: Namespace, store: ObjectStore, busy_keys: set[str]) -> None:
    """Multipart uploads no journal will finish cost storage forever: abort them.

    Ours: an upload of a key this journal owns but does not record (a crash
    between CreateMultipartUpload and the journal commit). Anyone's: uploads
    older than `abort_stale_uploads_after`, left by a node that never came back.
    """
    if not cfg.abort_stale_uploads_after or cfg.read_only:
        return
    try:
        uploads = await threads.call(functools.partial(store.list_uploads, cfg.key_prefix))
    except StoreError as e:
        log.warning("could not list multipart uploads to clean up: %s", e)
        return
    known = {u.upload_id for u in ns.journal.all_uploads()}
    now = time.time()
    for key, upload_id, started in uploads:
        if upload_id in known:
            continue
        owner = ns.journal.resolve(ns.keys.path(key))
        ours = owner is not None and owner.kind == "file"
        stale = now - started >= cfg.abort_stale_uploads_after
        if not (ours and key not in busy_keys) and not stale:
            continue
        try:
            await threads.call(functools.partial(store.abort, key, upload_id))
            log.info("aborted leaked multipart upload %s of %s", upload_id, key)
        except StoreError as e:
            log.warning("could not abort leaked multipart upload %s of %s: %s", upload_id, key, e)
