"""The cold tier's compressed copies: a file compressed on its way to the cold target, and decoded on its way back.

`compress` is the cold mover's copy of one file (copier.copy_checkpoint calls it per file): it
reads the file from the primary in chunks (`codec.CHUNK`, ranged GETs pinned to the manifest's
ETag, `READS` in flight), cuts each into segments (layout.Planner, in order) and encodes the chunks
in worker threads, several at once (`cpu()`: one per core, shared by every file; zstandard and
numpy release the GIL; `files()`: `FILES_CODED` files at once, so memory stays bounded whatever
the checkpoint: about 70 MiB per file on 2 cores, besides the part buffers); the frames go up in order as a multipart upload (`write_object`: the
target's part buffers and slots bound the memory, as for a plain copy) to the file's key +
`codec.SUFFIX`, with metadata naming the codec, the source ETag and the original size and
xxh3-128. The original's xxh3-128 is computed on the way and must be the manifest's before the
upload completes. A file that compresses by less than the threshold (decided after `EARLY` bytes,
and again at the end) is copied as it is instead (copier.copy_file: server-side where it can), as
is a file smaller than `MIN_SIZE`; its name then stays its own.

`expand` reads a compressed object back (ranges pinned to its ETag), decodes the frames in worker
threads and hands the chunks in order to a sink, returning the xxh3-128 of what it decoded: verify
(no sink), drills (into a file) and `copy_back` (a restore: into a multipart upload to the
primary) use it. Nothing relies on a compressed copy before `expand` has given back every byte of
it: the mover verifies its copy deep before the hot one goes, and `as_is_instead` copies a file
whose compressed copy did not verify again as it is.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import trio
import xxhash

from .. import config
from ..objects import NO_OBJECT, StoreError, json_document
from ..storeapi import LifecycleStore
from . import codec, ranges
from .copier import ABORT_SECONDS, SOURCE_ETAG_META, XXH3_META, CopyError, Job, already_there, copy_entry, crc32, part_slots
from .layout import Planner
from .manifest import MANIFEST, leaf_errors

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

CODEC_META = "ckptfs-codec"
ORIGINAL_SIZE_META = "ckptfs-original-size"
ORIGINAL_XXH3_META = "ckptfs-original-xxh3"
MIN_SIZE = 4 << 10  # smaller files are copied as they are: too little to save
EARLY = 4 * codec.CHUNK  # after this much of a file, one that saves too little is copied as it is instead
AHEAD = (os.cpu_count() or 1) + 1  # chunks of a file being coded or waiting to be written
READS = 4  # ranges of a file read at once (of the original to compress: `codec.CHUNK` each; of an object to decode: READ_RANGE)
READ_RANGE = 2 * codec.CHUNK  # ranges of a compressed object read back (a frame is at most ~CHUNK: often two in one)
# files compressed or decoded at once in this process; each holds at most ~(READS + AHEAD) x READ_RANGE + AHEAD x CHUNK
# (ranges read, frames being decoded keep theirs, and their output): ~70 MiB on 2 cores, besides the part buffers
FILES_CODED = 2
_CPU: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("ckptfs_codec_cpu")
_FILES: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("ckptfs_codec_files")

Write = Callable[[Any], Awaitable[None]]


class NotWorth(Exception):
    """The file compresses by less than the threshold: it is copied as it is."""


def cpu() -> trio.CapacityLimiter:
    """The worker threads coding chunks, one per core, shared by every file being coded in this process."""
    try:
        return _CPU.get()
    except LookupError:
        limiter = trio.CapacityLimiter(os.cpu_count() or 1)
        _CPU.set(limiter)
        return limiter


def files() -> trio.CapacityLimiter:
    """The files being compressed or decoded at once in this process (the rest wait: the cores are busy anyway)."""
    try:
        return _FILES.get()
    except LookupError:
        limiter = trio.CapacityLimiter(FILES_CODED)
        _FILES.set(limiter)
        return limiter


def _unwrap(e: BaseException) -> BaseException:
    """A nursery's group as its one meaningful failure: NotWorth, or the first store, copy or codec error."""
    if not isinstance(e, BaseExceptionGroup):
        return e
    leaves = leaf_errors(e)
    for leaf in leaves:
        if isinstance(leaf, NotWorth):
            return leaf
    if leaves and all(isinstance(x, (StoreError, CopyError, codec.CodecError)) for x in leaves):
        return leaves[0]
    return e


class _Slot:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: Any = None


async def ordered(produce: Callable[[Callable[..., Awaitable[None]]], Awaitable[None]], emit: Callable[[Any], Awaitable[None]],
                  ahead: int = AHEAD) -> None:
    """`produce(submit)` calls `submit(fn, *args)` in order; each `fn` runs in a worker thread (`cpu()`), several at
    once, and `emit` is given the results in the order they were submitted; at most `ahead` wait for it."""
    send, recv = trio.open_memory_channel[_Slot](ahead)
    try:
        async with trio.open_nursery() as nursery:

            async def run(slot: _Slot, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
                slot.value = await trio.to_thread.run_sync(fn, *args, limiter=cpu())
                slot.done.set()

            async def submit(fn: Callable[..., Any], *args: Any) -> None:
                slot = _Slot()
                await send.send(slot)
                nursery.start_soon(run, slot, fn, args)

            async def emitter() -> None:
                async for slot in recv:
                    await slot.done.wait()
                    await emit(slot.value)

            nursery.start_soon(emitter)
            async with send:
                await produce(submit)
    except BaseExceptionGroup as group:
        raise _unwrap(group) from None


# ------------------------------------------------------------------ writing
class _Parts:
    """The object being written: the part being filled, and the parts going up (each holds its slots and buffer)."""

    def __init__(self, job: Job, key: str, metadata: dict[str, str], part_size: int) -> None:
        self.job, self.key, self.metadata, self.part_size = job, key, metadata, part_size
        self.weight = part_slots(part_size, job.part_size, job.slots.total)
        self.buf: Any = None  # an mmap from the target's PartBuffers, while it is filled
        self.fill = self.size = self.number = 0
        self.upload_id: str | None = None
        self.parts: dict[int, tuple[str, str]] = {}
        self.nursery: trio.Nursery | None = None

    async def write(self, data: Any) -> None:
        mv = memoryview(data).cast("B")
        while len(mv):
            if self.buf is None:
                await self.job.slots.acquire(self.weight)
                assert self.job.buffers is not None
                self.buf, self.fill = self.job.buffers.take(self.part_size), 0
            n = min(len(mv), self.part_size - self.fill)
            self.buf[self.fill:self.fill + n] = mv[:n]
            self.fill += n
            self.size += n
            mv = mv[n:]
            if self.fill == self.part_size:
                await self.send()

    async def send(self) -> None:
        """Upload the part filled so far, beside what comes next."""
        if self.upload_id is None:
            self.upload_id = await self.job.io(self.job.dst.create_multipart, self.key, self.metadata)
        self.number += 1
        buf, length, self.buf, self.fill = self.buf, self.fill, None, 0
        assert self.nursery is not None
        self.nursery.start_soon(self._part, self.number, buf, length)

    async def _part(self, number: int, buf: Any, length: int) -> None:
        bufs = self.job.buffers
        assert bufs is not None
        try:
            view = memoryview(buf)[:length]
            crc = crc32(view)
            self.parts[number] = (await self.job.io(self.job.dst.upload_part_from, self.key, self.upload_id, number, view, crc), crc)
        except trio.Cancelled:
            bufs.lose(buf)  # its thread may still read it
            raise
        except BaseException:
            bufs.give(buf)
            raise
        else:
            bufs.give(buf)
        finally:
            self.job.slots.release(self.weight)

    def drop(self, lost: bool) -> None:
        """Give back the buffer being filled (lost: a cancelled thread may still read it)."""
        if self.buf is not None:
            assert self.job.buffers is not None
            (self.job.buffers.lose if lost else self.job.buffers.give)(self.buf)
            self.job.slots.release(self.weight)
            self.buf = None


async def write_object(job: Job, key: str, metadata: dict[str, str], part_size: int,
                       produce: Callable[[Write], Awaitable[None]]) -> tuple[str, int]:
    """Upload what `produce(write)` writes, in order, to `key` on the target: one PutObject if it fits in one part, else
    a multipart upload whose parts go up while `produce` goes on. (ETag, size). A failure leaves no object nor upload."""
    st = _Parts(job, key, metadata, part_size)
    try:
        async with trio.open_nursery() as nursery:
            st.nursery = nursery
            await produce(st.write)
            if st.upload_id is not None and st.fill:
                await st.send()
        if st.upload_id is None:
            view = memoryview(st.buf)[:st.fill] if st.buf is not None else memoryview(b"")
            etag = await job.io(job.dst.put_object_from, key, view, crc32(view), metadata)
            st.drop(False)
            return etag, st.size
        parts = [(n, etag, crc) for n, (etag, crc) in sorted(st.parts.items())]
        return await job.io(job.dst.complete, key, st.upload_id, parts), st.size
    except BaseException as e:
        st.drop(True)  # not reused: a cancelled PutObject's thread may still read it
        if st.upload_id is not None:
            with trio.CancelScope(shield=True) as scope:
                scope.relative_deadline = ABORT_SECONDS  # a hung target: the next copy of the checkpoint aborts it
                try:
                    await job.io(job.dst.abort, key, st.upload_id)
                except StoreError:
                    pass
        err = _unwrap(e)
        if err is e:
            raise
        raise err from None


# --------------------------------------------------------------- compress
async def compress(job: Job, f: dict[str, Any], policy: str, threshold: float) -> dict[str, Any]:
    """Copy file `f` of the manifest to the cold target: compressed (policy auto or zstd) when that saves at least
    `threshold` of it, else as it is; its entry in the target's manifest."""
    size = int(f["size"])
    # a name another file's compressed object could take (x.ckptfs-z): always in the format, so names never collide
    forced = f["path"].endswith(codec.SUFFIX)
    if policy == "none" or (size < MIN_SIZE and not forced):
        return await copy_entry(job, f)
    key = job.dst_base + f["path"] + codec.SUFFIX
    try:
        info = await job.io(job.dst.head_object, key)
        m = info.metadata
        if (m.get(CODEC_META) == codec.FORMAT and m.get(SOURCE_ETAG_META) == f["etag"] and m.get(ORIGINAL_XXH3_META) == (f.get("xxh3") or "")
                and m.get(ORIGINAL_SIZE_META) == str(size)):
            job.counters.skipped_objects += 1  # finished by an earlier, interrupted move
            return _entry(f, key, info.etag, info.size, {})
    except StoreError as e:
        if e.kind != NO_OBJECT:
            raise
    try:
        async with files():
            return await _compress(job, f, key, policy, None if forced else threshold)
    except NotWorth:
        return await copy_entry(job, f)


def _entry(f: dict[str, Any], key: str, etag: str, stored: int, used: dict[str, int]) -> dict[str, Any]:
    return {**f, "key": key, "etag": etag, "codec": codec.FORMAT, "stored_path": f["path"] + codec.SUFFIX, "stored_size": stored,
            **({"encodings": used} if used else {})}


async def _compress(job: Job, f: dict[str, Any], key: str, policy: str, threshold: float | None) -> dict[str, Any]:
    """The compressed copy (NotWorth if it saves less than `threshold`: None, kept whatever it saves)."""
    size = int(f["size"])
    planner = Planner(policy)
    h = xxhash.xxh3_128()
    used: dict[str, int] = {}
    seen = {"in": 0, "out": len(codec.MAGIC)}

    def plan(start: int, data: bytes) -> list[tuple[int, str]]:  # in order, in a worker thread
        h.update(data)
        return planner.plan(start, data)

    async def produce(write: Write) -> None:
        await write(codec.MAGIC)

        async def read(submit: Callable[..., Awaitable[None]]) -> None:
            async def fetch(start: int, length: int) -> bytes:
                return await job.io(job.src.get_range, f["key"], f["etag"], start, length)  # type: ignore[no-any-return]

            async def consume(start: int, length: int, data: bytes) -> None:
                job.check()
                segments = await trio.to_thread.run_sync(plan, start, data, limiter=cpu())
                await submit(codec.encode, data, segments)

            await ranges.in_order(job.io, job.src, f["key"], f["etag"], size, fetch, consume, codec.CHUNK, READS)

        async def emit(result: tuple[list[Any], dict[str, int]]) -> None:
            frame, counts = result
            for piece in frame:
                await write(piece)
                seen["out"] += len(piece)
            seen["in"] += sum(counts.values())
            for k, v in counts.items():
                used[k] = used.get(k, 0) + v
            if threshold is not None and seen["in"] >= EARLY and seen["out"] > (1 - threshold) * seen["in"]:
                raise NotWorth()

        await ordered(read, emit)
        if threshold is not None and seen["out"] > (1 - threshold) * size:
            raise NotWorth()
        digest = h.hexdigest()
        if f.get("xxh3") and digest != f["xxh3"]:
            raise CopyError(f"{f['key']}: its bytes have xxh3 {digest}, the manifest says {f['xxh3']}: not copied "
                            "(the primary's object does not match its manifest: run ckptfs verify --deep on it)")

    metadata = {CODEC_META: codec.FORMAT, SOURCE_ETAG_META: f["etag"], ORIGINAL_XXH3_META: f.get("xxh3") or "",
                ORIGINAL_SIZE_META: str(size)}
    part_size = config.part_size_for(size + size // 64 + (1 << 20), job.part_size)  # frames add a little to what does not pack
    etag, stored = await write_object(job, key, metadata, part_size, produce)
    job.counters.copied_objects += 1
    job.counters.copied_bytes += stored
    return _entry(f, key, etag, stored, used)


async def as_is_instead(job: Job, doc: dict[str, Any], originals: dict[str, dict[str, Any]], paths: list[str]) -> dict[str, Any]:
    """Copy the files `paths` (compressed copies that did not give their bytes back) again as they are, delete their
    compressed objects, and write the target's manifest `doc` again with their new entries."""
    files = []
    for e in doc["files"]:
        if e["path"] in paths and codec.is_compressed(e):
            log.error("cold tier: the compressed copy of %s did not decode to its bytes: copied again as it is", e["path"])
            await job.io(job.dst.delete, e["key"])
            e = await copy_entry(job, originals[e["path"]])
        files.append(e)
    doc = {**doc, "files": files}
    await job.io(job.dst.put_bytes, job.dst_base + MANIFEST, json_document(doc, indent=1))
    return doc


# ------------------------------------------------------------------ expand
async def expand(io: Callable[..., Awaitable[Any]], store: LifecycleStore, f: dict[str, Any], sink: Write | None = None,
                 done: dict[str, int] | None = None) -> str:
    """Decode file `f`'s compressed object (`f["key"]` in `store`, pinned to `f["etag"]`), handing its chunks in order to
    `sink`; the xxh3-128 of the bytes decoded. CodecError if the object is damaged; StoreError as a read's."""
    reader = codec.FrameReader()
    h = xxhash.xxh3_128()

    def frames(data: bytes) -> list[tuple[memoryview, int, int, int]]:  # in order, in a worker thread
        return list(reader.feed(data))

    async def read(submit: Callable[..., Awaitable[None]]) -> None:
        async def fetch(start: int, length: int) -> bytes:
            return await io(store.get_range, f["key"], f["etag"], start, length)  # type: ignore[no-any-return]

        async def consume(start: int, length: int, data: bytes) -> None:
            for body, n, digest, offset in await trio.to_thread.run_sync(frames, data, limiter=cpu()):
                await submit(codec.decode_body, body, n, digest, offset)

        await ranges.in_order(io, store, f["key"], f["etag"], codec.stored_size(f), fetch, consume, READ_RANGE, READS)
        reader.close()

    async def emit(chunk: np.ndarray) -> None:
        h.update(chunk)
        if done is not None:
            done["bytes"] += len(chunk)
        if sink is not None:
            await sink(chunk)

    async with files():
        await ordered(read, emit)
    if reader.offset != int(f["size"]):
        raise codec.CodecError(f"it decodes to {reader.offset} bytes, the manifest says {f['size']}")
    return h.hexdigest()


async def copy_back(job: Job, f: dict[str, Any]) -> str:
    """Restore file `f` of a cold target's manifest (compressed, on job.src) to the primary (job.dst) as it was, unless
    an interrupted restore finished it already; the primary object's ETag."""
    key = job.dst_base + f["path"]
    size = int(f["size"])
    done = await already_there(job, key, size, f["etag"], f.get("xxh3") or "")
    if done is not None:
        return done

    async def produce(write: Write) -> None:
        try:
            digest = await expand(job.io, job.src, f, write)
        except codec.CodecError as e:
            raise CopyError(f"{f['key']}: {e}") from None
        if f.get("xxh3") and digest != f["xxh3"]:
            raise CopyError(f"{f['key']} decodes to bytes with xxh3 {digest}, the manifest says {f['xxh3']}")

    etag, _ = await write_object(job, key, {XXH3_META: f.get("xxh3") or "", SOURCE_ETAG_META: f["etag"]},
                                 config.part_size_for(size, job.part_size), produce)
    job.counters.copied_objects += 1
    job.counters.copied_bytes += size
    return etag

