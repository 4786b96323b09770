"""Verify a committed checkpoint against its manifest.

Shallow: one recursive listing of the checkpoint; every file of the manifest
must be there with its size and ETag, and nothing else (ckptfs's own objects
aside). Deep: also read every file back (ranged GETs, `read_concurrency` in
flight per file, two files at once, each range pinned to the manifest's ETag
with If-Match) and compare its xxh3-128 with the manifest's. Memory is bounded
by ranges in flight x range size; the hash is computed in order as ranges
arrive. A file stored compressed (a cold target's copy, coldcopy.py) is checked
under its object's name and size, and read back decoded: a damaged chunk is
found by its xxh3-64 (or a frame that does not decode), the file by its
xxh3-128, and it counts as changed.

The outcome ("whole" or "broken", with the lists) is written next to the
manifest as `.ckptfs-verify.json` (place.py: for a file checkpoint, a sibling named after it), so `ckptfs checkpoints` on any node shows
it, and kept for the metrics.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Awaitable, Callable

import trio
import xxhash

from ..storageclass import may_need_restore
from ..peering import node_name_of
from ..objects import ARCHIVED, StoreError, json_document
from . import codec, coldcopy, place, ranges
from .manifest import VERIFY, LifecycleError, Manifest, files_of, now_iso
from ..patterns import Checkpoint
from .context import Bucket

log = logging.getLogger(__name__)

FILES_AT_ONCE = 2
LIST_LIMIT = 100  # names listed per kind in the recorded result


async def verify(lc: Bucket, ck: Checkpoint, manifest: Manifest, deep: bool,
                 progress: Callable[[dict[str, Any]], Awaitable[None]]) -> dict[str, Any]:
    base = place.files_base(lc.keys.prefix, ck)
    started = time.time()
    listing = await lc.io(place.listing, lc.store, lc.keys.prefix, ck)
    present = {f.path: f for f in files_of(listing, base)}
    expected = {f["path"]: f for f in manifest.files}
    stored = {codec.stored_path(f): p for p, f in expected.items()}  # a compressed copy's object has its own name
    missing = sorted(p for p, f in expected.items() if codec.stored_path(f) not in present)
    unexpected = sorted(p for p in present if p not in stored)
    changed: list[str] = []
    for p, f in expected.items():
        got = present.get(codec.stored_path(f))
        if got is not None and (got.size != codec.stored_size(f) or got.etag != f["etag"]):
            changed.append(p)
    unchecked: list[str] = []
    checked_bytes = 0
    if deep:
        todo = [f for p, f in sorted(expected.items()) if p not in missing and p not in changed]
        await _refuse_archived(lc, ck, listing, base, todo)
        archived: list[str] = []
        total = sum(int(f["size"]) for f in todo)
        done = {"bytes": 0}
        limit = trio.CapacityLimiter(FILES_AT_ONCE)

        async def one(f: dict[str, Any]) -> None:
            async with limit:
                if not f.get("xxh3"):
                    unchecked.append(f["path"])
                try:
                    if codec.is_compressed(f):
                        digest = await coldcopy.expand(lc.io, lc.store, f, None, done)
                    else:
                        digest = await _xxh3(lc, f["key"], f["etag"], int(f["size"]), done)
                except codec.CodecError as e:
                    log.warning("verify %s: %s does not decode: %s", ck.path, f["path"], e)
                    changed.append(f["path"])
                    return
                except StoreError as e:
                    if e.kind == ARCHIVED:
                        archived.append(f["path"])  # archived after the listing (or in a tier only a GET tells)
                        return
                    ranges.sort_read_error(e, f["path"], missing, changed)
                    return
                if f.get("xxh3") and digest != f["xxh3"]:
                    log.warning("verify %s: %s has xxh3 %s, the manifest says %s", ck.path, f["path"], digest, f["xxh3"])
                    changed.append(f["path"])

        async with trio.open_nursery() as nursery:
            for f in todo:
                nursery.start_soon(one, f)
            while True:
                await progress({"files": len(todo), "bytes": total, "done_bytes": min(total, done["bytes"])})
                if not nursery.child_tasks:
                    break
                with trio.move_on_after(0.2):
                    await trio.sleep_forever()
        if archived:
            raise LifecycleError(restore_message(lc, ck, len(archived), "an archive storage class"))
        checked_bytes = done["bytes"]
    outcome = "whole" if not (missing or changed or unexpected) else "broken"
    result = {
        "path": ck.path, "step": ck.step, "outcome": outcome, "deep": deep, "at": time.time(), "at_iso": now_iso(),
        "seconds": round(time.time() - started, 3), "node": node_name_of(lc.cfg), "generation": manifest.generation,
        "files": len(expected), "bytes": manifest.bytes, "checked_bytes": checked_bytes,
        "missing": sorted(missing)[:LIST_LIMIT], "changed": sorted(set(changed))[:LIST_LIMIT],
        "unexpected": unexpected[:LIST_LIMIT], "unchecked": sorted(unchecked)[:LIST_LIMIT],
        "counts": {"missing": len(missing), "changed": len(set(changed)), "unexpected": len(unexpected), "unchecked": len(unchecked)},
    }
    try:
        await lc.io(lc.store.put_bytes, place.own_key(lc.keys.prefix, ck, VERIFY), json_document(result, indent=1))
    except StoreError as e:
        raise LifecycleError(f"verify of {ck.path} finished ({outcome}) but its result could not be recorded in the bucket: {e}") from None
    lc.last_verify = result
    return result


def restore_message(lc: Bucket, ck: Checkpoint, count: int, where: str) -> str:
    path = os.path.join(os.path.abspath(lc.cfg.mountpoint), ck.path)
    return (f"{ck.path}: {count} of its files {'is' if count == 1 else 'are'} archived in {where} and not restored, so a deep verify "
            f"cannot read {'it' if count == 1 else 'them'}: run ckptfs restore {path}, and verify again once it reports them restored "
            "(a shallow verify needs no restore)")


async def _refuse_archived(lc: Bucket, ck: Checkpoint, listing: Any, base: str, todo: list[dict[str, Any]]) -> None:
    """Before reading anything: files the listing shows in an archive class and HeadObject says are not restored."""
    classes = {base + o.name: o.storage_class for o in listing.objects}
    keys = [f["key"] for f in todo if may_need_restore(classes.get(f["key"]))]
    where: list[str] = []
    for key in keys:
        st = await lc.io(lc.store.archive_state, key)
        if st.needs_restore:
            where.append(st.where)
    if where:
        raise LifecycleError(restore_message(lc, ck, len(where), "/".join(sorted(set(where)))))


async def _xxh3(lc: Bucket, key: str, etag: str, size: int, done: dict[str, int]) -> str:
    """xxh3-128 of the object read back with parallel ranged GETs, at most `read_concurrency` ranges held at once."""
    h = xxhash.xxh3_128()

    async def fetch(start: int, length: int) -> bytes:
        return await lc.io(lc.store.get_range, key, etag, start, length)

    async def consume(start: int, length: int, data: bytes) -> None:
        h.update(data)
        done["bytes"] += len(data)

    await ranges.in_order(lc.io, lc.store, key, etag, size, fetch, consume, lc.cfg.read_range_size, lc.cfg.read_concurrency)
    return h.hexdigest()
