"""Copy one committed checkpoint to one replica target, checked against its manifest.

Order, so that a checkpoint on a target is either complete or visibly incomplete:

1. a target manifest of an earlier generation is deleted first (the target's
   copy is then visibly incomplete until step 5);
2. multipart uploads left under the checkpoint on the target (a copy killed
   mid-way) are aborted;
3. every file of the manifest is copied, unless the target already has it:
   a HEAD showing the manifest's size, its xxh3-128 (`x-amz-meta-xxh3`) and the
   source ETag (`x-amz-meta-ckptfs-source-etag`) means a finished copy, so a
   restart never copies a finished object again;
   - same endpoint (and credentials): CopyObject / UploadPartCopy inside the
     store, pinned to the manifest's ETag (CopySourceIfMatch);
   - otherwise streamed: ranged GETs of `replication_part_size` pinned to the
     ETag (If-Match), read into part buffers, hashed in order (xxh3-128) while
     the parts go up as a multipart upload in parallel; the upload completes
     only if the hash is the manifest's. A part holds one of the target's
     `replication_parts_in_flight` slots and one part buffer (PartBuffers:
     anonymous mmaps, reused, unmapped after each pass) from its GET until it
     is uploaded and hashed, so a target's copy holds at most
     `replication_parts_in_flight` x `replication_part_size` bytes of data;
   - either way, a file that would need more than S3's 10,000 parts gets larger
     parts (config.part_size_for, as the drain); a streamed part of k times
     `replication_part_size` holds k slots (all of them if k is more), so such
     a file has fewer parts in flight and the bound above holds, except for a
     part larger than the whole bound, which is copied alone;
4. objects under the checkpoint on the target that the manifest does not name
   (an earlier generation's) are deleted, and the protection object is copied
   (with legal holds where the target has Object Lock) or removed;
5. last, the target's manifest: the primary's, with each file's key and ETag
   as the target has them (so `ckptfs verify` on a mount of the target checks
   it like any other) and `replicated_from` naming the primary manifest's ETag
   and generation.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import mmap
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import trio
import xxhash

from .. import config
from ..config import Config, Replica
from ..namespace.keys import Keys
from ..objects import AUTH, NO_OBJECT, StoreError, crc32 as crc32_of, crc32_b64, json_document
from ..store import Store
from ..storeapi import LifecycleStore
from .manifest import MANIFEST, PROTECTED, Manifest, files_of, leaf_errors, now_iso
from . import place
from ..patterns import Checkpoint

log = logging.getLogger(__name__)

XXH3_META = "xxh3"
SOURCE_ETAG_META = "ckptfs-source-etag"
FILES_AT_ONCE = 4
ABORT_SECONDS = 30.0  # bound on aborting a failed multipart upload on the target


class CopyError(Exception):
    """The checkpoint could not be copied as its manifest says (source changed, digest mismatch)."""


@dataclass
class Counters:
    copied_objects: int = 0
    copied_bytes: int = 0
    skipped_objects: int = 0  # already on the target (a resumed copy)
    server_side: int = 0


def part_slots(part_size: int, unit: int, slots: int) -> int:
    """How many of a target's `slots` (each worth `unit` bytes of part buffer: replication_part_size) a streamed part of
    `part_size` bytes holds: enough to cover its buffer, so that the parts in flight stay within `slots` x `unit` bytes;
    all of them when one part alone is larger than that (it is then copied alone, the one case above the bound)."""
    return max(1, min(slots, -(-part_size // unit)))


class Slots:
    """A target's parts in flight (`replication_parts_in_flight`): a part holds `part_slots` of them, a server-side copy
    one. Several are taken together under a lock, so two large parts never each hold some and wait for the rest."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._free = trio.Semaphore(total)
        self._lock = trio.Lock()

    @property
    def free(self) -> int:
        return self._free.value

    async def acquire(self, n: int = 1) -> None:
        """Take `n` slots (1 <= n <= total) once they are all free."""
        assert 1 <= n <= self.total, n
        async with self._lock:
            got = 0
            try:
                while got < n:
                    await self._free.acquire()
                    got += 1
            except BaseException:
                self.release(got)
                raise

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._free.release()

    async def __aenter__(self) -> None:
        await self.acquire(1)

    async def __aexit__(self, *exc: object) -> None:
        self.release(1)


class PartBuffers:
    """The part buffers of a streamed copy: at most `limit` x `size` bytes (`size` is replication_part_size, `limit`
    replication_parts_in_flight), taken and given back, reused.

    Each is an anonymous mmap, so its pages go back to the system when it is
    dropped (`release`), and reuse leaves nothing for the allocator to
    fragment. A buffer is reused for a part of its own size; a file with
    larger parts (past S3's 10,000 parts) takes buffers of that size, and
    free buffers of another size are dropped to make room for them. A part
    takes one only while it holds its slots of the target (`Job.slots`,
    `part_slots`), so the bound is never passed by a correct caller but by
    a single part larger than the whole bound, taken while no other is in
    use; `take` beyond it otherwise is a bug and raises. A buffer whose
    request was abandoned (cancelled while its worker thread still runs) is
    forgotten (`lose`), never reused: it is unmapped when that thread lets
    go of it.
    """

    def __init__(self, size: int, limit: int | None = None) -> None:
        self.size, self.limit = size, limit
        self.free: list[mmap.mmap] = []
        self.in_use = 0
        self.in_use_bytes = 0
        self.peak = 0  # most buffers held at once (taken or free) since made
        self.peak_bytes = 0  # most bytes held at once (taken or free) since made

    @property
    def held(self) -> int:
        return self.in_use + len(self.free)

    @property
    def held_bytes(self) -> int:
        return self.in_use_bytes + sum(len(b) for b in self.free)

    def take(self, size: int | None = None) -> mmap.mmap:
        """A buffer of `size` bytes (default: `self.size`)."""
        size = self.size if size is None else size
        buf = next((b for b in reversed(self.free) if len(b) == size), None)  # the last given back (as before)
        if buf is not None:
            self.free.remove(buf)
        else:
            if self.limit is not None:
                bound = self.limit * self.size
                while self.free and self.held_bytes + size > bound:
                    self.free.pop(0)  # another size: dropped (unmapped) to make room
                if self.in_use and self.in_use_bytes + size > bound:
                    raise RuntimeError(f"{self.in_use_bytes + size} bytes of part buffers in use, the limit is {bound}: "
                                       "a part took one without its slots")
            buf = mmap.mmap(-1, size)
        self.in_use += 1
        self.in_use_bytes += len(buf)
        self.peak = max(self.peak, self.held)
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        return buf

    def give(self, buf: mmap.mmap) -> None:
        self.in_use -= 1
        self.in_use_bytes -= len(buf)
        self.free.append(buf)

    def lose(self, buf: mmap.mmap) -> None:
        self.in_use -= 1
        self.in_use_bytes -= len(buf)

    def release(self) -> None:
        """Unmap the free buffers (between passes: an idle replicator holds none)."""
        self.free.clear()


@dataclass
class Job:
    """What copy_checkpoint needs: the two stores, the keys on each side, and the limits."""

    src: LifecycleStore
    dst: LifecycleStore
    src_bucket: str
    dst_base: str  # target key prefix of the checkpoint's files, ends in '/' (place.files_base)
    same_endpoint: bool
    part_size: int
    copy_multipart_threshold: int
    slots: Slots  # parts in flight (memory bound) for this target
    io: Callable[..., Awaitable[Any]]  # runs a blocking store call in a worker thread
    counters: Counters = field(default_factory=Counters)
    check: Callable[[], None] = lambda: None  # raises if the copy must stop (lease lost)
    buffers: PartBuffers | None = None  # streamed copies' part buffers (the target's); None: made for this copy
    ck: Checkpoint | None = None  # the checkpoint copied; None: a directory (its own objects inside dst_base)

    def own(self, name: str) -> str:
        """The target key of ckptfs's object `name` (the manifest, the protection) for this checkpoint."""
        return self.dst_base + (place.own_name(self.ck, name) if self.ck is not None else name)

    def __post_init__(self) -> None:
        if self.buffers is None:
            self.buffers = PartBuffers(self.part_size)


class Destination:
    """A bucket that checkpoints are copied to ([replica.NAME]): its store client, made once, and the copy's bounds.

    The replicator's targets and the cold mover's target are both one (replication/service.Target adds
    what its surveys learn)."""

    def __init__(self, replica: Replica, cfg: Config) -> None:
        self.replica = replica
        self.cfg = cfg
        self.store: LifecycleStore | None = None
        self.same_endpoint = (replica.endpoint_url or "") == (cfg.endpoint_url or "") and replica.profile == cfg.profile
        self.counters = Counters()
        self.object_lock: bool | None = None
        self.slots = Slots(cfg.replication_parts_in_flight)
        self.buffers = PartBuffers(cfg.replication_part_size, cfg.replication_parts_in_flight)  # streamed copies' memory

    def open(self) -> LifecycleStore:
        """The target's store client (made once; a bad profile is a target error, not a crash)."""
        if self.store is None:
            r = self.replica
            tcfg = dataclasses.replace(self.cfg, bucket=r.bucket, prefix=r.prefix, endpoint_url=r.endpoint_url, region=r.region,
                                       profile=r.profile, read_timeout=self.cfg.replication_read_timeout,
                                       max_parts_in_flight=self.cfg.replication_parts_in_flight, replica={})
            try:
                self.store = Store(tcfg)
            except Exception as e:  # noqa: BLE001 - botocore's ProfileNotFound and kin: one line, no secrets in them
                raise StoreError(AUTH, f"cannot set up a client for {r.url} ({type(e).__name__}: {e}): check profile and region") from None
        return self.store


class TargetView:
    """The lifecycle seen through a target: what verify.verify needs (keys, store, io, cfg)."""

    def __init__(self, cfg: Config, store: LifecycleStore, prefix: str, io: Callable[..., Awaitable[Any]]) -> None:
        self.cfg, self.store, self.keys, self.io = cfg, store, Keys(prefix), io
        self.last_verify: dict[str, Any] | None = None
        self.drill_record: dict[str, Any] = {}


def one_error(group: BaseExceptionGroup) -> BaseException:  # type: ignore[type-arg]
    """A nursery's group of copy failures as its first StoreError or CopyError (the caller reports one line);
    the group itself if anything else is in it (a bug, or a cancellation)."""
    leaves = leaf_errors(group)
    if leaves and all(isinstance(e, (StoreError, CopyError)) for e in leaves):
        return leaves[0]
    return group


def crc32(data: bytes | memoryview) -> str:
    """A part's CRC32 as S3's checksum header wants it."""
    return crc32_b64(crc32_of(data))


async def copy_checkpoint(job: Job, manifest: Manifest, manifest_body: bytes, protection: bytes | None,
                          object_lock: bool, copy: Callable[[Job, dict[str, Any]], Awaitable[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Copy the checkpoint `manifest` describes; returns the manifest written on the target (as a dict).

    `copy(job, file)` copies one file and returns its entry in the target's manifest (default
    `copy_entry`: as it is; the cold mover's compresses, coldcopy.py, under another key)."""
    copy = copy or copy_entry
    dst = job.dst
    base = job.dst_base
    # 1. an older generation's manifest goes first: visibly incomplete from here until the new one is written
    try:
        body, _ = await job.io(dst.get_bytes, job.own(MANIFEST))
        old = json.loads(body)
        if old.get("replicated_from", {}).get("etag") != manifest.etag:
            await job.io(dst.delete, job.own(MANIFEST))
    except StoreError as e:
        if e.kind != NO_OBJECT:
            raise
    except ValueError:
        await job.io(dst.delete, job.own(MANIFEST))
    # 2. uploads a killed copy left behind
    uploads_under = base + job.ck.name if job.ck is not None and job.ck.file else base  # not a sibling checkpoint's
    for key, upload_id, _ in await job.io(dst.list_uploads, uploads_under):
        await job.io(dst.abort, key, upload_id)
    # 3. the files
    entries: dict[str, dict[str, Any]] = {}
    limit = trio.CapacityLimiter(FILES_AT_ONCE)

    async def one(f: dict[str, Any]) -> None:
        async with limit:
            job.check()
            entries[f["path"]] = await copy(job, f)

    try:
        async with trio.open_nursery() as nursery:
            for f in manifest.files:
                nursery.start_soon(one, f)
    except BaseExceptionGroup as group:
        raise one_error(group) from None
    # 4. leftovers of an earlier generation, and protection
    listing = await job.io(place.listing_at, dst, base, job.ck) if job.ck is not None else await job.io(lambda: dst.list(base, recursive=True))
    wanted = {e["key"] for e in entries.values()}
    for f in files_of(listing, base):
        if f.key not in wanted:
            job.check()
            await job.io(dst.delete, f.key)
    job.check()
    if protection is not None:
        await job.io(dst.put_bytes, job.own(PROTECTED), protection)
        if object_lock:
            for e in entries.values():
                await job.io(dst.set_legal_hold, e["key"], True)
                if not await job.io(dst.legal_hold, e["key"]):
                    raise CopyError(f"{e['key']}: the target did not keep the legal hold")
    elif any(o.name == PROTECTED for o in listing.objects):
        if object_lock:  # unprotected on the primary: lift the holds placed with the protection
            for e in entries.values():
                await job.io(dst.set_legal_hold, e["key"], False)
        await job.io(dst.delete, job.own(PROTECTED))
    # 5. the manifest, last
    doc = json.loads(manifest_body)
    doc["files"] = [entries[f["path"]] for f in manifest.files]
    doc["replicated_from"] = {"bucket": job.src_bucket, "path": manifest.path, "etag": manifest.etag, "generation": manifest.generation, "at": time.time(), "at_iso": now_iso()}
    job.check()
    await job.io(dst.put_bytes, job.own(MANIFEST), json_document(doc, indent=1))
    return doc


async def copy_entry(job: Job, f: dict[str, Any]) -> dict[str, Any]:
    """Copy one file of the manifest as it is (copy_file); its entry in the target's manifest."""
    return {**f, "key": job.dst_base + f["path"], "etag": await copy_file(job, f)}


async def already_there(job: Job, key: str, size: int, source_etag: str, xxh3: str) -> str | None:
    """The ETag of `key` on the target if a copy of the source (`source_etag`) finished there: the size, the source's
    ETag and the xxh3-128 in its metadata (a resumed copy skips it); None if not."""
    try:
        info = await job.io(job.dst.head_object, key)
    except StoreError as e:
        if e.kind != NO_OBJECT:
            raise
        return None
    if info.size == size and info.metadata.get(SOURCE_ETAG_META) == source_etag and (not xxh3 or info.metadata.get(XXH3_META) == xxh3):
        job.counters.skipped_objects += 1
        return info.etag
    return None


async def copy_file(job: Job, f: dict[str, Any]) -> str:
    """Copy one file of the manifest unless the target has it already; the target's ETag."""
    key = job.dst_base + f["path"]
    size = int(f["size"])
    want_xxh3 = f.get("xxh3") or ""
    done = await already_there(job, key, size, f["etag"], want_xxh3)
    if done is not None:
        return done
    if job.same_endpoint and want_xxh3:
        metadata = {XXH3_META: want_xxh3, SOURCE_ETAG_META: f["etag"]}
        async with job.slots:
            etag = await job.io(job.dst.copy_from, job.src_bucket, f["key"], f["etag"], key, size, metadata,
                                config.part_size_for(size, job.part_size), job.copy_multipart_threshold)
        job.counters.server_side += 1
    else:
        etag = await _stream(job, f, key, size, want_xxh3)
    job.counters.copied_objects += 1
    job.counters.copied_bytes += size
    return etag


async def _held(bufs: PartBuffers, size: int, fn: Callable[[mmap.mmap], Awaitable[Any]]) -> Any:
    """Run `fn` with a part buffer of `size` bytes, given back after (lost if cancelled: its thread may still use it)."""
    buf = bufs.take(size)
    try:
        result = await fn(buf)
    except trio.Cancelled:
        bufs.lose(buf)
        raise
    except BaseException:
        bufs.give(buf)
        raise
    bufs.give(buf)
    return result


async def _stream(job: Job, f: dict[str, Any], key: str, size: int, want_xxh3: str) -> str:
    """GET (ranged, pinned to the manifest's ETag, into part buffers) -> PUT, hashing in order; the upload completes
    only if the hash matches."""
    src, dst = job.src, job.dst
    bufs = job.buffers
    assert bufs is not None
    h = xxhash.xxh3_128()

    def check_digest() -> str:
        digest = h.hexdigest()
        if want_xxh3 and digest != want_xxh3:
            raise CopyError(f"{f['key']}: its bytes have xxh3 {digest}, the manifest says {want_xxh3}: not copied "
                            "(the primary's object does not match its manifest: run ckptfs verify --deep on it)")
        return digest

    part_size = config.part_size_for(size, job.part_size)  # past 10,000 parts: larger
    weight = part_slots(part_size, job.part_size, job.slots.total)  # a larger part holds more slots: fewer in flight
    if size < part_size:
        async def small(buf: mmap.mmap) -> str:
            view = memoryview(buf)[:size]
            await job.io(src.get_range_into, f["key"], f["etag"], 0, view)
            h.update(view)
            digest = check_digest()
            return await job.io(dst.put_object_from, key, view, crc32(view), {XXH3_META: digest, SOURCE_ETAG_META: f["etag"]})

        await job.slots.acquire(weight)
        try:
            return await _held(bufs, part_size, small)
        finally:
            job.slots.release(weight)
    n = -(-size // part_size)
    # the digest is only known at the end: the metadata is set at CreateMultipartUpload, so it is the manifest's;
    # a file without one in the manifest gets it after the fact by a copy-in-place (rare: written without ckptfs)
    upload_id = await job.io(dst.create_multipart, key, {XXH3_META: want_xxh3 or "", SOURCE_ETAG_META: f["etag"]})
    fetched = [trio.Event() for _ in range(n)]
    hashed = [trio.Event() for _ in range(n)]
    held: dict[int, memoryview] = {}
    parts: dict[int, tuple[str, str]] = {}
    try:
        async with trio.open_nursery() as nursery:

            async def one_part(i: int, buf: mmap.mmap) -> None:
                try:
                    start = i * part_size
                    view = memoryview(buf)[:min(part_size, size - start)]
                    await job.io(src.get_range_into, f["key"], f["etag"], start, view)
                    held[i] = view
                    fetched[i].set()
                    crc = crc32(view)
                    etag = await job.io(dst.upload_part_from, key, upload_id, i + 1, view, crc)
                    parts[i] = (etag, crc)
                    await hashed[i].wait()  # the buffer is reused only once the in-order hash has read it
                finally:
                    held.pop(i, None)

            async def part(i: int) -> None:
                try:
                    await _held(bufs, part_size, lambda buf: one_part(i, buf))
                finally:
                    job.slots.release(weight)

            async def producer() -> None:
                for i in range(n):
                    job.check()
                    await job.slots.acquire(weight)
                    nursery.start_soon(part, i)

            nursery.start_soon(producer)
            for i in range(n):
                await fetched[i].wait()
                h.update(held[i])
                hashed[i].set()
        digest = check_digest()
        etag = await job.io(dst.complete, key, upload_id, [(i + 1, parts[i][0], parts[i][1]) for i in range(n)])
    except BaseException as e:
        with trio.CancelScope(shield=True) as scope:
            scope.relative_deadline = ABORT_SECONDS  # a hung target: the next copy of this checkpoint aborts it
            try:
                await job.io(dst.abort, key, upload_id)
            except StoreError:
                pass  # aborted when the next copy of this checkpoint starts
        if isinstance(e, BaseExceptionGroup):
            raise one_error(e) from None
        raise
    if not want_xxh3:
        await job.io(dst.copy_from, dst.bucket, key, etag, key, size, {XXH3_META: digest, SOURCE_ETAG_META: f["etag"]},
                     part_size, job.copy_multipart_threshold)
        etag = (await job.io(dst.head_object, key)).etag
    return etag
