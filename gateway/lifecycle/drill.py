"""Recovery drills: restore a checkpoint as a job on a fresh node would, verify it deep, time it.

How: the daemon downloads every file of the checkpoint's manifest straight from
the bucket into a fresh temporary directory (`<cache_dir>/drills/<id>/`, or
under the `--dir` given), with parallel ranged GETs pinned to the manifest's
ETags (`read_range_size` each, `read_concurrency` in flight per file, four
files at once; each range streamed into the file through a 1 MiB buffer, so
memory stays small whatever the sizes), hashing each file in order as its ranges arrive and comparing
its xxh3-128 with the manifest's. Nothing comes from, or goes into, the mount's
cache: what is measured is the bucket-to-node path a fresh node restoring
would see. (A second, temporary read-only mount would measure FUSE on top; a
job restoring reads from the mount, but its cold reads are these same ranged
GETs, and a drill should not need a second FUSE mount, root, or a cache of its
own to clean up.)

The user's command (`--exec "COMMAND {path}"`) runs in the CLI's process, with
its environment and user, on the restored directory; the CLI then reports
back (`drill_done`) and the daemon records the outcome and removes the
directory. The last drill and the last successful one are kept in the bucket
(`.ckptfs/drills/last.json`), so every node's metrics show them and an alert
can fire when no drill succeeded for a week. A restored directory left behind
by a CLI that died is removed at the next drill or daemon start.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable

import trio
import xxhash

from ..peering import node_name_of
from ..objects import NETWORK, PRECONDITION, StoreError, json_document
from . import codec, coldcopy, place, ranges
from .manifest import LifecycleError, Manifest, files_of, now_iso, read_json
from ..patterns import Checkpoint
from .context import Bucket, Context

log = logging.getLogger(__name__)

RECORD = ".ckptfs/drills/last.json"
FILES_AT_ONCE = 4
HASH_CHUNK = 1 << 20
LIST_LIMIT = 100


def drills_root(lc: Context) -> Path:
    return Path(lc.cfg.cache_dir) / "drills"


def clean_leftovers(lc: Context, keep: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Remove restored directories no running drill owns (a CLI that died before `drill_done`)."""
    root = drills_root(lc)
    if not root.is_dir():
        return
    for child in root.iterdir():
        if str(child) not in keep:
            shutil.rmtree(child, ignore_errors=True)


async def choose(lc: Context, path: str) -> tuple[Checkpoint, Manifest]:
    """The checkpoint `path` is, or the newest committed one at or below it."""
    ck = lc.patterns.checkpoint_of(path)
    if ck is not None and ck.path != path:
        raise LifecycleError(f"{path} is inside checkpoint {ck.path}: give the checkpoint's directory, or a directory above it")
    if ck is None:
        entries = [e for e in await lc.scan(path) if e["committed"]]
        if not entries:
            raise LifecycleError(f"no committed checkpoint under {path or '/'}: nothing to drill (commit one first)")
        newest = max(entries, key=lambda e: (e["committed_at"] or 0, e["step"]))
        ck = Checkpoint(newest["path"], newest["step"], newest.get("kind") == "file")
    manifest = await lc.catalogue.manifest(ck)
    if manifest is None:
        raise LifecycleError(f"{ck.path} is not committed (no manifest): a drill restores committed checkpoints only")
    return ck, manifest


async def restore(lc: Bucket, ck: Checkpoint, manifest: Manifest, target: Path,
                  progress: Callable[[dict[str, Any]], Awaitable[None]]) -> dict[str, Any]:
    """Download the manifest's files into `target` and check each one's xxh3-128; the result (not recorded yet)."""
    started = time.time()
    t0 = time.monotonic()
    base = place.files_base(lc.keys.prefix, ck)
    missing: list[str] = []
    changed: list[str] = []
    unchecked: list[str] = []
    done = {"bytes": 0}
    total = manifest.bytes
    limit = trio.CapacityLimiter(FILES_AT_ONCE)

    async def one(f: dict[str, Any]) -> None:
        async with limit:
            dest = target / f["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if codec.is_compressed(f):
                    digest = await _expand(lc, f, fd, done)
                else:
                    digest = await _download(lc, f["key"], f["etag"], int(f["size"]), fd, done)
            except codec.CodecError as e:
                log.warning("drill %s: %s does not decode: %s", ck.path, f["path"], e)
                changed.append(f["path"])
                return
            except StoreError as e:
                ranges.sort_read_error(e, f["path"], missing, changed)
                return
            finally:
                os.close(fd)
            if not f.get("xxh3"):
                unchecked.append(f["path"])
            elif digest != f["xxh3"]:
                log.warning("drill %s: %s has xxh3 %s, the manifest says %s", ck.path, f["path"], digest, f["xxh3"])
                changed.append(f["path"])

    async with trio.open_nursery() as nursery:
        for f in manifest.files:
            nursery.start_soon(one, f)
        while True:
            await progress({"files": len(manifest.files), "bytes": total, "done_bytes": min(total, done["bytes"])})
            if not nursery.child_tasks:
                break
            with trio.move_on_after(0.2):
                await trio.sleep_forever()
    seconds = time.monotonic() - t0
    listing = await lc.io(place.listing, lc.store, lc.keys.prefix, ck)
    expected = {codec.stored_path(f) for f in manifest.files}
    unexpected = sorted(f.path for f in files_of(listing, base) if f.path not in expected)
    whole = not (missing or changed or unexpected)
    return {
        "path": ck.path, "step": ck.step, "generation": manifest.generation, "dir": str(target), "node": node_name_of(lc.cfg),
        "pid": os.getpid(), "at": started, "at_iso": now_iso(started), "files": len(manifest.files), "bytes": total,
        "restore_seconds": round(seconds, 3), "bytes_per_second": round(total / seconds, 1) if seconds > 0 else 0.0,
        "verify": "whole" if whole else "broken",
        "missing": sorted(missing)[:LIST_LIMIT], "changed": sorted(set(changed))[:LIST_LIMIT], "unexpected": unexpected[:LIST_LIMIT],
        "unchecked": sorted(unchecked)[:LIST_LIMIT],
    }


async def _download(lc: Bucket, key: str, etag: str, size: int, fd: int, done: dict[str, int]) -> str:
    """Ranged GETs of the object (pinned to `etag`) written into `fd`; its xxh3-128, hashed in order.

    Each range goes from the response straight into the file (store.read_range, one 1 MiB buffer per
    range in flight); the hash reads each range back from the page cache once the ones before it are in.
    """
    h = xxhash.xxh3_128()

    def hash_range(start: int, length: int) -> None:
        end = start + length
        while start < end:
            chunk = os.pread(fd, min(HASH_CHUNK, end - start), start)
            if not chunk:
                raise StoreError(NETWORK, f"short read of {key} from the restored file")
            h.update(chunk)
            start += len(chunk)

    async def fetch(start: int, length: int) -> None:
        await lc.io(lc.store.read_range, key, etag, start, length, fd)

    async def consume(start: int, length: int, _: None) -> None:
        await trio.to_thread.run_sync(hash_range, start, length)
        done["bytes"] += length

    await ranges.in_order(lc.io, lc.store, key, etag, size, fetch, consume, lc.cfg.read_range_size, lc.cfg.read_concurrency)
    return h.hexdigest()


async def _expand(lc: Bucket, f: dict[str, Any], fd: int, done: dict[str, int]) -> str:
    """A compressed file (a moved checkpoint's on its cold target) decoded into `fd`; the xxh3-128 of what was written."""
    at = 0

    async def write(chunk: Any) -> None:
        nonlocal at
        await trio.to_thread.run_sync(_pwrite_all, fd, chunk, at)
        at += len(chunk)

    return await coldcopy.expand(lc.io, lc.store, f, write, done)


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def finish(result: dict[str, Any], exec_result: dict[str, Any] | None) -> dict[str, Any]:
    """The drill's outcome: ok only when the checkpoint came back whole and the user's command (if any) exited 0."""
    result = dict(result)
    result["exec"] = exec_result
    ok = result["verify"] == "whole" and (exec_result is None or exec_result.get("exit_code") == 0)
    result["outcome"] = "ok" if ok else "failed"
    result["seconds"] = round(result["restore_seconds"] + (exec_result or {}).get("seconds", 0.0), 3)
    return result


async def record(lc: Context, result: dict[str, Any]) -> None:
    """Keep the drill (and, if it succeeded, as the last success) in the bucket, for every node's metrics."""
    key = lc.keys.of(RECORD)
    for _ in range(5):
        doc, etag = await read_record(lc, with_etag=True)
        doc["last"] = result
        if result["outcome"] == "ok":
            doc["last_success"] = result
        body = json_document(doc, indent=1)
        try:
            if etag is None:
                await lc.io(lambda: lc.store.put_bytes(key, body, if_none_match=True))
            else:
                await lc.io(lambda: lc.store.put_bytes(key, body, if_match=etag))
        except StoreError as e:
            if e.kind == PRECONDITION:
                continue  # another node recorded a drill meanwhile: add ours to theirs
            raise
        lc.drill_record = doc
        return
    raise LifecycleError("the drill finished but other nodes kept rewriting its record: its outcome is not recorded")


async def read_record(lc: Context, with_etag: bool = False) -> Any:
    doc, etag = await lc.io(read_json, lc.store, lc.keys.of(RECORD))
    doc = doc or {}
    return (doc, etag) if with_etag else doc


def new_target(lc: Context, parent: str) -> Path:
    root = Path(parent) if parent else drills_root(lc)
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"drill-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    target.mkdir(mode=0o755)
    return target
