"""A cache file's bytes into one object, as the bucket must hold them: the pieces every uploader shares.

The drain uploads the files written here; a peer that takes over a dead node (peers/takeover.py)
uploads that node's replicas. Both must write the same object for the same bytes (the whole file's
xxh3-128 in `XXH3_META`, each part's CRC32 checked by the store), or a HEAD could not tell a file
already durable from one that is not. So the hashing and the single-request upload live here, below
both, rather than twice.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Awaitable, Callable

import trio
import xxhash

from . import threads
from .objects import NO_OBJECT, ObjectInfo, StoreError, crc32, crc32_b64
from .sizes import MiB
from .storeapi import ObjectStore

log = logging.getLogger(__name__)

XXH3_META = "xxh3"  # user metadata key: x-amz-meta-xxh3 holds the whole file's xxh3-128 (hex)
# A file up to this size is read whole into memory and sent as bytes: boto3 sends a file-like body
# with `Expect: 100-continue`, a round trip to the store before the body for every small object.
# Memory: at most this much per small PutObject in flight (`small_objects_in_flight`).
BODY_IN_MEMORY = 1 * MiB


class Abandoned(Exception):
    """The file changed, moved or vanished while it was uploading."""


def read_whole(fd: int, size: int) -> bytes:
    """The `size` bytes of a small cache file (the bytes sent are the bytes hashed)."""
    data = os.pread(fd, size, 0)
    while len(data) < size:
        more = os.pread(fd, size - len(data), len(data))
        if not more:
            raise Abandoned("cache file is shorter than its size: it was truncated meanwhile")
        data += more
    return data


HASH_BUFFER = 1 << 20  # small enough that the bytes are still in the CPU's cache when the hash reads them


def hash_range(h: "xxhash.xxh3_128", fd: int, start: int, end: int) -> int:
    """Feed bytes [start, end) of the open file to `h`; returns how many there were (fewer: the file is shorter
    now). Through one reused buffer: a fresh bytes per read costs ~15% more CPU, a 16 MiB one sends every byte
    through memory twice (0.22 against 0.17 s per GiB); not mmap: a truncate meanwhile is SIGBUS."""
    view = memoryview(bytearray(min(HASH_BUFFER, max(end - start, 1))))
    offset = start
    while offset < end:
        n = os.preadv(fd, [view[:min(len(view), end - offset)]], offset)
        if not n:
            break
        h.update(view[:n])
        offset += n
    return offset - start


def file_digests(fd: int, size: int, part_size: int, chunk: int = 4 * MiB) -> tuple[str, list[str]]:
    """One pass over the cached bytes: the whole file's xxh3-128 and each part's CRC32."""
    h = xxhash.xxh3_128()
    crcs: list[str] = []
    offset = 0
    while True:
        part_end = min(size, offset + part_size)
        crc = 0
        while offset < part_end:
            data = os.pread(fd, min(chunk, part_end - offset), offset)
            if not data:
                raise Abandoned("cache file is shorter than its size: it was truncated meanwhile")
            h.update(data)
            crc = crc32(data, crc)
            offset += len(data)
        crcs.append(crc32_b64(crc))
        if offset >= size:
            return h.hexdigest(), crcs


def put_whole(store: ObjectStore, key: str, fd: int, size: int, expect: str | None = None, metadata: dict[str, str] | None = None,
              if_match: str | None = None, if_none_match: bool = False) -> tuple[str, str]:
    """One PutObject of the file's `size` bytes at `key`, hashed in the same pass: (etag, xxh3). Blocking.

    A change of the bytes between the hash and the send is refused by the store (the CRC32 sent no
    longer matches), never published. `expect`: the xxh3 the bytes must have (a replica checked before):
    other bytes raise Abandoned and are not sent. `metadata`: beside the xxh3, the object's provenance (publishing.py);
    `if_match` / `if_none_match`: the write's condition (the store answers PRECONDITION when it is not met)."""
    if size <= BODY_IN_MEMORY:
        body = read_whole(fd, size)
        xxh3 = xxhash.xxh3_128_hexdigest(body)
        crc = crc32_b64(crc32(body))
    else:
        xxh3, crcs = file_digests(fd, size, max(size, 1))
        crc = crcs[0]
    if expect is not None and xxh3 != expect:
        raise Abandoned(f"the bytes for {key} no longer have the xxh3 they were checked with ({xxh3}, not {expect})")
    meta = {**(metadata or {}), XXH3_META: xxh3}
    cond: dict[str, Any] = {}
    if if_match is not None or if_none_match:  # only when asked: a store (or a test's) without conditions still takes the rest
        cond = {"if_match": if_match, "if_none_match": if_none_match}
    if size <= BODY_IN_MEMORY:
        return store.put_object_body(key, body, crc, meta, **cond), xxh3
    return store.put_object(key, fd, size, crc, meta, **cond), xxh3


async def put_multipart(store: ObjectStore, key: str, fd: int, size: int, part_size: int, crcs: list[str],
                        metadata: dict[str, str], parts: trio.CapacityLimiter,
                        gate: Callable[[], Awaitable[None]] | None = None, if_match: str | None = None,
                        if_none_match: bool = False) -> str:
    """A whole file as one multipart upload, its parts sent in parallel (`parts` bounds them), from scratch: for an
    uploader without a journal to resume from (a takeover, peers/takeover.py). On any failure the upload is aborted,
    so nothing of it is left to cost storage. `gate` (the fence) is awaited before each part and the completion, as
    the drain does: a node paused past its lease sends at most the parts already in flight. `if_match` / `if_none_match`
    condition the completion (the object appears only then). Returns the object's etag."""
    upload_id = await threads.call(functools.partial(store.create_multipart, key, metadata))
    etags: dict[int, str] = {}

    async def send(n: int) -> None:
        offset = (n - 1) * part_size
        length = min(part_size, size - offset)
        async with parts:
            if gate is not None:
                await gate()
            etags[n] = await threads.call_with_fd(
                fd, lambda own: store.upload_part(key, upload_id, n, own, offset, length, crcs[n - 1]))

    try:
        async with trio.open_nursery() as nursery:
            for n in range(1, len(crcs) + 1):
                nursery.start_soon(send, n)
        if gate is not None:
            await gate()
        cond: dict[str, Any] = {}
        if if_match is not None or if_none_match:
            cond = {"if_match": if_match, "if_none_match": if_none_match}
        return await threads.call(functools.partial(
            store.complete, key, upload_id, [(n, etags[n], crcs[n - 1]) for n in range(1, len(crcs) + 1)], **cond))
    except BaseException:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            try:
                await threads.call(functools.partial(store.abort, key, upload_id))
            except Exception as e:  # noqa: BLE001 - the first error is the one to report; a leaked upload is aborted later
                log.warning("could not abort the multipart upload %s of %s: %s (aborted once stale)", upload_id, key, e)
        raise


async def head_or_none(store: ObjectStore, key: str) -> ObjectInfo | None:
    """What the bucket holds at `key` (HeadObject in a worker thread); None when nothing. Other errors raise."""
    try:
        return await threads.call(functools.partial(store.head_object, key))
    except StoreError as e:
        if e.kind == NO_OBJECT:
            return None
        raise
