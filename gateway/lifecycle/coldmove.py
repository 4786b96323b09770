"""Moving old checkpoints to a colder store by the daemon itself (stores without lifecycle transitions).

SeaweedFS and other stores answer bucket lifecycle transitions with 501: no storage class to move
checkpoints into. With `tier_move_target = "NAME"` (a `[replica.NAME]` table: a second bucket or
endpoint) the node holding the `tier-move` lease moves them there itself, every `tier_move_interval`:

* which: committed, not protected, not expiring checkpoints committed (or restored) more than
  `tier_move_after` ago, with no local work on this node (writing, draining, or any file of it open,
  for reading too), no multipart upload in progress under it and nothing in it newer than its
  manifest (`plan`, pure). Files open on *other* nodes are not visible from here: the age is the rule
  that keeps them safe (docs/lifecycle.md);
* how (`Mover.move`), so that a move killed at any point leaves the checkpoint whole on the primary:
  1. the record `<checkpoint>/.ckptfs-moved.json` is written `moving` (conditionally);
  2. every file is copied with the copy code replication uses too (lifecycle/copier.py: server-side on the
     same endpoint, else streamed, skipped when the target already has it), compressed on the way as
     `cold_compression` says (coldcopy.py: FILE.ckptfs-z), the target's manifest last;
  3. the copy is verified on the target against the manifest: listing (size, ETag) and every byte
     read back, decoded, against its xxh3-128; a compressed copy that does not give its file back is
     copied again as it is;
  4. the record becomes `moved` (If-Match on the `moving` one: a restore or retention in between wins);
  5. only then are the checkpoint's files deleted from the primary. Its manifest and record stay:
     `ckptfs checkpoints` shows it `moved:NAME`, `usage` counts it under that class, retention judges
     it as before and deletes the cold copy when it lets it go.
  The next pass resumes a `moving` record (copies already there are skipped) and finishes a `moved`
  one whose hot files were not all deleted.
* back (`Mover.restore`, `ckptfs restore PATH`): record `restoring`, every file copied back from the
  target (decoded), the hot copy verified deep, the primary manifest rewritten with the new ETags (same
  generation), record `restored` (the age counts again from then), and the cold copy deleted.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Awaitable, Callable

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..peering import node_name_of
from ..objects import NO_OBJECT, PRECONDITION, StoreError, json_document
from . import audit, tiers
from .catalogue import LOCAL_STATES
from .lease import Lease, kept
from .manifest import MANIFEST, MOVED_FORMAT, MOVED, MOVED_STATE, MOVING, RESTORED, RESTORING, LifecycleError, Manifest, files_of, now_iso, read_json, read_manifest
from ..patterns import Checkpoint
from .verify import verify
from .context import Bucket, Context
from .copier import CopyError, Destination, Job, TargetView, copy_checkpoint, copy_file, one_error
from . import codec, coldcopy

log = logging.getLogger(__name__)

LEASE_NAME = "tier-move"
WHO = {"user": "ckptfs tier move", "uid": None}


class MoveError(Exception):
    """A checkpoint could not be moved (or brought back) now; one line, retried at the next pass."""


class Skip(Exception):
    """The checkpoint must not be moved now (someone is using it); not an error."""


# ---------------------------------------------------------------------- choice
def plan(entries: list[dict[str, Any]], cfg: Any, now: float, busy: dict[str, str]) -> list[tuple[str, str, str]]:
    """(path, action, reason) for each catalogue entry; action is move | resume | finish | cancel | keep.

    `busy`: checkpoint path -> why it is in use on this node (open, writing, draining).
    """
    after = cfg.tier_move_after
    out: list[tuple[str, str, str]] = []
    for e in entries:
        path = e["path"]
        rec = e.get("moved") or {}
        state = rec.get("state")
        if e.get("kind") == "file":
            out.append((path, "keep", "a checkpoint saved as one file stays in this bucket (moves are of directories)"))
        elif state == MOVED_STATE:
            if e.get("hot_files"):
                out.append((path, "finish", f"moved to {rec.get('target')}; its hot files left by an interrupted move are deleted"))
            else:
                out.append((path, "keep", f"moved to {rec.get('target')}"))
        elif state == RESTORING:
            out.append((path, "keep", "being restored (`ckptfs restore`; run it again if it was interrupted)"))
        elif not e.get("committed"):
            out.append((path, "keep", "not committed"))
        elif e.get("protected"):
            out.append((path, "cancel" if state == MOVING else "keep", "protected"))
        elif e.get("state") == "expiring" and state != MOVING:
            out.append((path, "keep", "expiring (retention deletes it after its grace period)"))
        elif e.get("state") in LOCAL_STATES or path in busy:
            out.append((path, "keep", f"in use on this node ({busy.get(path) or e.get('state')})"))
        elif state == MOVING:
            out.append((path, "resume", "a move was interrupted: finished now"))
        else:
            since = float(rec.get("at") or 0) if state == RESTORED else float(e.get("committed_at") or 0)
            if now - since < after:
                what = "restored" if state == RESTORED else "committed"
                out.append((path, "keep", f"{what} less than tier_move_after ({after:g} s) ago"))
            else:
                out.append((path, "move", f"committed {now - float(e.get('committed_at') or 0):.0f} s ago, older than tier_move_after"))
    return out


# ----------------------------------------------------------------------- mover
class Mover:
    def __init__(self, lc: Context) -> None:
        self.lc = lc
        cfg = lc.cfg
        self.name = cfg.tier_move_target
        self.targets: dict[str, Destination] = {}
        self.lease = Lease.for_mount(lc.store, lc.keys.of, LEASE_NAME, cfg.replication_lease_ttl,
                                     node=node_name_of(cfg)) if self.name else None
        self.moved_total = self.moved_bytes_total = self.moved_stored_bytes_total = self.restored_total = self.errors_total = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.moving: str | None = None
        self.last_run = 0.0
        self.last_plan: list[tuple[str, str, str]] = []
        self.failed: dict[str, str] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.name) and self.lc.patterns.enabled and not self.lc.cfg.read_only

    def target(self, name: str | None = None) -> Destination:
        """The cold target `name` (default: tier_move_target) as a replication Target (its own store client)."""

        name = name or self.name
        replica = self.lc.cfg.replica.get(name) if name else None
        if replica is None:
            raise LifecycleError(f"cold target {name!r} is not configured here: add its [replica.{name}] table and "
                                 f"tier_move_target = \"{name}\" to the config file (docs/lifecycle.md)")
        if name not in self.targets:
            self.targets[name] = Destination(replica, self.lc.cfg)
        return self.targets[name]

    async def io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.lc.io(fn, *args)

    def _fail(self, path: str, e: BaseException) -> None:
        self.errors_total += 1
        self.last_error, self.last_error_at = f"{path}: {e}", time.time()
        self.failed[path] = str(e)
        log.warning("tier move: %s: %s (retried at the next pass)", path, e)

    # ------------------------------------------------------------------- loop
    async def run(self) -> None:
        if not self.enabled:
            return
        t = self.target()
        log.info("moving checkpoints committed more than %g s ago to %s (%s) every %g s", self.lc.cfg.tier_move_after,
                 t.replica.name, t.replica.url, self.lc.cfg.tier_move_interval)
        while True:
            try:
                await self.pass_once()
            except Exception:  # noqa: BLE001 - moves must never take the mount down with them
                log.exception("tier move pass failed unexpectedly; the next pass retries")
            await trio.sleep(self.lc.cfg.tier_move_interval)

    async def pass_once(self) -> None:
        assert self.lease is not None
        try:
            held = await self.io(self.lease.acquire)
        except StoreError as e:
            self._fail("lease", e)
            return
        if not held:
            return  # another node moves
        async with kept(self.lease, self.io):
            await self._work()
        self.last_run = time.time()

    def busy(self) -> dict[str, str]:
        """Checkpoints in use on this node: open (reading or writing), or with work not yet in the bucket."""
        lc = self.lc
        out = dict(lc.tracker.work)
        for ino, live in lc.ns.files.live.items():
            if live.handles or live.writers:
                path = lc.ns.journal.path_of(ino)
                ck = lc.patterns.checkpoint_of(path) if path is not None else None
                if ck is not None:
                    out.setdefault(ck.path, "a file of it is open")
        return out

    async def _work(self) -> None:
        entries = await self.lc.scan("")
        decisions = plan(entries, self.lc.cfg, time.time(), self.busy())
        self.last_plan = decisions
        by_path = {e["path"]: e for e in entries}
        for path, action, reason in decisions:
            if action == "keep":
                continue
            assert self.lease is not None
            if not self.lease.valid():
                return
            ck = Checkpoint(path, by_path[path]["step"])
            self.moving = path
            try:
                if action == "cancel":
                    await self._cancel(ck)
                else:
                    await self.move(ck, finish_only=action == "finish")
                self.failed.pop(path, None)
            except Skip as e:
                log.info("tier move: %s not moved now: %s", path, e)
            except (StoreError, LifecycleError, MoveError, CopyError) as e:
                self._fail(path, e)
            except BaseExceptionGroup as group:
                err = one_error(group)
                if err is group:
                    raise
                self._fail(path, err)
            finally:
                self.moving = None

    def _check(self) -> None:
        if self.lease is not None and not self.lease.valid():
            raise MoveError("the tier-move lease was lost: another node carries on")

    # ----------------------------------------------------------------- record
    async def record(self, path: str) -> tuple[dict[str, Any] | None, str | None]:
        """The move record of checkpoint `path` and its ETag; (None, None) if it has none."""
        return await self.io(read_json, self.lc.store, self.lc.keys.of(f"{path}/{MOVED}"))  # type: ignore[no-any-return]

    async def _write_record(self, path: str, doc: dict[str, Any], etag: str | None) -> str:
        """Write the record: If-Match `etag`, or If-None-Match when there was none. MoveError if it changed meanwhile."""
        key = self.lc.keys.of(f"{path}/{MOVED}")
        body = json_document({"format": MOVED_FORMAT, **doc}, indent=1)
        try:
            return await self.io(lambda: self.lc.store.put_bytes(key, body, if_none_match=etag is None, if_match=etag))
        except StoreError as e:
            if e.kind in (PRECONDITION, NO_OBJECT):
                raise MoveError("its move record changed meanwhile (a restore, retention or another node): left as it is") from None
            raise

    def _doc(self, state: str, t: Destination, manifest: Manifest, **extra: Any) -> dict[str, Any]:
        now = time.time()
        return {"state": state, "target": t.replica.name, "target_url": t.replica.url,
                "endpoint_url": t.replica.endpoint_url, "manifest_etag": manifest.etag, "generation": manifest.generation,
                "files": len(manifest.files), "bytes": manifest.bytes, "at": now, "at_iso": now_iso(now), "node": node_name_of(self.lc.cfg),
                **extra}

    # ------------------------------------------------------------------- move
    async def move(self, ck: Checkpoint, finish_only: bool = False) -> None:
        lc, cfg = self.lc, self.lc.cfg
        base = lc.keys.of(ck.path + "/")
        rec, rec_etag = await self.record(ck.path)
        if finish_only:
            if not rec or rec.get("state") != MOVED_STATE:
                return
            manifest = await lc.catalogue.manifest(ck)
            if manifest is None or manifest.etag != rec.get("manifest_etag"):
                raise MoveError(f"moved to {rec.get('target')}, but its manifest here changed since: files written into it "
                                f"after the move are left as they are; restore it (`ckptfs restore {ck.path}`) to use it")
            await self._delete_hot(ck, manifest)
            return
        t = self.target()
        store = t.open()
        if await self.io(lc.store.list_uploads, base):
            raise Skip("a multipart upload into it is in progress (another node is writing it)")
        body, metag = await self.io(lc.store.get_bytes, base + MANIFEST)
        manifest = Manifest.from_json(body, metag)
        listing = await self.io(lambda: lc.store.list(base, recursive=True))
        hot = {f.path: f for f in files_of(listing, base)}
        extra = sorted(p for p in hot if p not in {f["path"] for f in manifest.files})
        if extra:
            raise Skip(f"{extra[0]} is not in its manifest (written after its commit): committed again first")
        unchecked = [f["path"] for f in manifest.files if not f.get("xxh3")]
        if unchecked:
            # a copy of a file without a digest could not be checked byte for byte: the hot copy is the only sure one
            raise Skip(f"{len(unchecked)} of its files carry no xxh3-128 (written by another tool, e.g. {unchecked[0]}): "
                       "a copy could not be verified, so it stays here")
        for f in manifest.files:
            h = hot.get(f["path"])
            if h is None or h.size != int(f["size"]) or h.etag != f["etag"]:
                raise MoveError(f"{f['path']} is not in the bucket as its manifest says: not moved; run `ckptfs verify {ck.path}`")
        # 1. the record says `moving` (a resumed move keeps its record)
        if not (rec and rec.get("state") == MOVING and rec.get("manifest_etag") == metag and rec.get("target") == t.replica.name):
            self._check()
            rec_etag = await self._write_record(ck.path, self._doc(MOVING, t, manifest), rec_etag)
        # 2. every file (compressed as cold_compression says: coldcopy.py), the target's manifest last (copier.py)
        job = Job(lc.store, store, cfg.bucket, t.replica.key_prefix + ck.path + "/", t.same_endpoint, cfg.replication_part_size,
                  cfg.copy_multipart_threshold, t.slots, self.io, t.counters, self._check)
        before = t.counters.copied_objects, t.counters.skipped_objects

        async def copy(job: Job, f: dict[str, Any]) -> dict[str, Any]:
            return await coldcopy.compress(job, f, cfg.cold_compression, cfg.cold_compression_threshold)

        doc = await copy_checkpoint(job, manifest, body, None, False, copy)
        # 3. verified on the target: listing (size, ETag), every byte read back (and decoded) against its xxh3-128; a file
        # whose compressed copy does not give its bytes back is copied again as it is (a codec bug costs ratio, not data)
        view = TargetView(cfg, store, t.replica.key_prefix, self.io)
        result = await verify(view, ck, Manifest.from_json(json.dumps(doc).encode()), True, _no_progress)
        bad = [p for p in result["changed"] if any(e["path"] == p and codec.is_compressed(e) for e in doc["files"])]
        if bad and result["outcome"] != "whole":
            doc = await coldcopy.as_is_instead(job, doc, {f["path"]: f for f in manifest.files}, bad)
            result = await verify(view, ck, Manifest.from_json(json.dumps(doc).encode()), True, _no_progress)
        if result["outcome"] != "whole" or result["counts"]["unchecked"]:
            raise MoveError(f"its copy on {t.replica.name} did not verify ({result['counts']}): the hot copy is kept")
        stored = sum(codec.stored_size(f) for f in doc["files"])
        # 4. the record says `moved`: from here on the cold copy is the checkpoint's
        self._check()
        await self._write_record(ck.path, self._doc(MOVED_STATE, t, manifest, stored_bytes=stored, compression=cfg.cold_compression),
                                 rec_etag)
        # 5. the hot files go
        await self._delete_hot(ck, manifest)
        self.moved_total += 1
        self.moved_bytes_total += manifest.bytes
        self.moved_stored_bytes_total += stored
        await audit.record(lc, "move", ck.path, WHO, f"committed more than tier_move_after ({cfg.tier_move_after:g} s) ago",
                           step=ck.step, target=t.replica.name, target_url=t.replica.url, files=len(manifest.files), bytes=manifest.bytes,
                           stored_bytes=stored)
        log.info("tier move: %s moved to %s (%d files, %d bytes stored in %d; %d copied, %d already there; verified deep)", ck.path,
                 t.replica.url, len(manifest.files), manifest.bytes, stored, t.counters.copied_objects - before[0],
                 t.counters.skipped_objects - before[1])

    async def _delete_hot(self, ck: Checkpoint, manifest: Manifest) -> None:
        """Delete the checkpoint's files that are as its manifest says, then its emptied sub-directory keys."""
        lc = self.lc
        base = lc.keys.of(ck.path + "/")
        listing = await self.io(lambda: lc.store.list(base, recursive=True))
        want = {(f["path"], f["etag"]) for f in manifest.files}
        for f in files_of(listing, base):
            if (f.path, f.etag) in want:
                self._check()
                await self.io(lc.store.delete, f.key)
        left = await self.io(lambda: lc.store.list(base, recursive=True))
        names = [o.name for o in left.objects if "/" in o.name.rstrip("/") and not o.name.endswith("/")]
        dirs = {"/".join(o.name.split("/")[:i]) + "/" for o in listing.objects for i in range(1, o.name.count("/") + 1)}
        for sub in sorted(dirs, key=lambda k: -k.count("/")):
            if not any(n.startswith(sub) for n in names):
                await self.io(lc.store.delete, base + sub)

    async def _cancel(self, ck: Checkpoint) -> None:
        """A checkpoint protected while being moved: its hot copy is whole; the move is given up."""
        rec, etag = await self.record(ck.path)
        if rec and rec.get("state") == MOVING:
            await self.io(self.lc.store.delete, self.lc.keys.of(f"{ck.path}/{MOVED}"))
            log.info("tier move: %s was protected while being moved: move given up, it stays here", ck.path)

    # ------------------------------------------------------- on the cold target
    async def verify(self, ck: Checkpoint, deep: bool, progress: Callable[[dict[str, Any]], Awaitable[None]],
                     name: str | None = None) -> dict[str, Any]:
        """`ckptfs verify PATH --target NAME` for the cold target."""
        t = self.target(name)
        store = t.open()
        manifest = await self.io(read_manifest, store, t.replica.key_prefix + ck.path + "/" + MANIFEST)
        if manifest is None:
            raise LifecycleError(f"{ck.path} has no manifest on cold target {t.replica.name} ({t.replica.url}): it was not moved there")
        view = TargetView(self.lc.cfg, store, t.replica.key_prefix, self.io)
        result = await verify(view, ck, manifest, deep, progress)
        return {**result, "target": t.replica.name}

    async def source(self, ck: Checkpoint, manifest: Manifest) -> tuple[Bucket | None, Manifest]:
        """Where a drill reads checkpoint `ck` from: (None, its manifest) if its files are here, else (the cold target, the
        manifest there: compressed files are decoded on the way)."""
        rec, _ = await self.record(ck.path)
        if not rec or rec.get("state") not in (MOVED_STATE, RESTORING):
            return None, manifest
        t = self.target(str(rec.get("target") or ""))
        store = t.open()
        tman = await self.io(read_manifest, store, t.replica.key_prefix + ck.path + "/" + MANIFEST)
        if tman is None:
            raise LifecycleError(f"{ck.path} was moved to {t.replica.name} ({t.replica.url}), but the copy there has no manifest: "
                                 f"`ckptfs verify {ck.path} --target {t.replica.name}` says what it holds")
        return TargetView(self.lc.cfg, store, t.replica.key_prefix, self.io), tman

    async def delete_cold(self, path: str, rec: dict[str, Any]) -> int:
        """Delete the cold copy of `path` (retention let it go): its manifest first, then the rest; returns objects deleted."""
        t = self.target(str(rec.get("target") or ""))
        store = t.open()
        tbase = t.replica.key_prefix + path + "/"
        listing = await self.io(lambda: store.list(tbase, recursive=True))
        names = [o.name for o in listing.objects]
        if MANIFEST in names:
            await self.io(store.delete, tbase + MANIFEST)  # first: visibly incomplete from here on
        for n in names:
            if n != MANIFEST:
                await self.io(store.delete, tbase + n)
        dirs = {"/".join(n.split("/")[:i]) + "/" for n in names for i in range(1, n.count("/") + 1)}
        for sub in sorted(dirs, key=lambda k: -k.count("/")):
            await self.io(store.delete, tbase + sub)
        await self.io(store.delete, tbase)
        return len(names)

    # ----------------------------------------------------------------- restore
    async def restore(self, ck: Checkpoint, send: Callable[[Any], Awaitable[None]]) -> dict[str, Any] | None:
        """Bring a moved checkpoint back to the primary (None: it has no move record to act on)."""
        lc, cfg = self.lc, self.lc.cfg
        rec, rec_etag = await self.record(ck.path)
        if not rec or rec.get("state") not in (MOVING, MOVED_STATE, RESTORING):
            return None
        t = self.target(str(rec.get("target") or ""))
        base = lc.keys.of(ck.path + "/")
        body, metag = await self.io(lc.store.get_bytes, base + MANIFEST)
        manifest = Manifest.from_json(body, metag)
        out = {"moved": True, "target": t.replica.name, "target_url": t.replica.url, "files": len(manifest.files),
               "bytes": manifest.bytes}
        if rec.get("state") == MOVING:  # its files are all still here: give the move up
            await self._write_record(ck.path, self._doc(RESTORED, t, manifest, was=MOVING), rec_etag)
            return {**out, "state": RESTORED, "copied": 0, "message": "was being moved: the move is given up, its files never left"}
        store = t.open()
        tman = await self.io(read_manifest, store, t.replica.key_prefix + ck.path + "/" + MANIFEST)
        if tman is None:
            raise LifecycleError(f"{ck.path} was moved to {t.replica.name} ({t.replica.url}), but the copy there has no manifest: "
                                 f"check the target; `ckptfs verify {ck.path} --target {t.replica.name}` says what it holds")
        if rec.get("state") != RESTORING:
            rec_etag = await self._write_record(ck.path, {**rec, "state": RESTORING, "restoring_since": time.time()}, rec_etag)
        job = Job(store, lc.store, t.replica.bucket, base, t.same_endpoint, cfg.replication_part_size,
                  cfg.copy_multipart_threshold, t.slots, self.io)
        done = {"files": 0, "bytes": 0}
        etags: dict[str, str] = {}
        limit = trio.CapacityLimiter(4)
        sending = trio.Lock()  # files finishing together: one progress line at a time on the control socket

        async def one(f: dict[str, Any]) -> None:
            async with limit:
                etags[f["path"]] = await (coldcopy.copy_back if codec.is_compressed(f) else copy_file)(job, f)
                done["files"] += 1
                done["bytes"] += int(f["size"])
                async with sending:
                    await send({"ok": True, **out, "state": RESTORING, "done_files": done["files"], "done_bytes": done["bytes"]})

        await send({"ok": True, **out, "state": RESTORING, "done_files": 0, "done_bytes": 0})
        started = time.monotonic()
        try:
            async with trio.open_nursery() as nursery:
                for f in tman.files:
                    nursery.start_soon(one, f)
        except BaseExceptionGroup as group:
            err = one_error(group)
            if err is group:
                raise
            raise LifecycleError(f"{ck.path}: copying back from {t.replica.name} failed ({err}): it stays moved; "
                                 f"run `ckptfs restore {ck.path}` again (files already back are not copied again)") from None
        except CopyError as e:
            raise LifecycleError(f"{ck.path}: copying back from {t.replica.name} failed ({e}): run `ckptfs restore {ck.path}` again") from None
        log.info("restore: %s: %d files (%d bytes, %d stored) copied back from %s in %.1f s; verifying them", ck.path, done["files"],
                 done["bytes"], sum(codec.stored_size(f) for f in tman.files), t.replica.url, time.monotonic() - started)
        files = [{**f, "key": base + f["path"], "etag": etags[f["path"]]} for f in manifest.files]
        hot = Manifest(**{**manifest.__dict__, "files": files})
        result = await verify(lc, ck, hot, True, _no_progress)
        if result["outcome"] != "whole" or result["counts"]["unchecked"]:
            raise LifecycleError(f"{ck.path}: the files copied back from {t.replica.name} did not verify ({result['counts']}): "
                                 f"it stays moved; run `ckptfs restore {ck.path}` again")
        doc = json.loads(body)
        doc["files"] = files
        doc["restored_from"] = {"target": t.replica.name, "target_url": t.replica.url, "at": time.time(), "at_iso": now_iso()}
        try:
            new_etag = await self.io(lambda: lc.store.put_bytes(base + MANIFEST, json_document(doc, indent=1),
                                                                 if_match=metag))
        except StoreError as e:
            if e.kind != PRECONDITION:
                raise
            raise LifecycleError(f"{ck.path}: its manifest changed meanwhile: run `ckptfs restore {ck.path}` again") from None
        hot.etag = new_etag
        await self._write_record(ck.path, self._doc(RESTORED, t, hot, restored_from=t.replica.name), rec_etag)
        await tiers.tag(lc, ck, hot, "committed", False)
        try:
            await self.delete_cold(ck.path, rec)
        except StoreError as e:
            log.warning("restore of %s: the cold copy on %s could not be deleted (%s): delete it there, or it is replaced at the next move",
                        ck.path, t.replica.url, e)
        self.restored_total += 1
        await audit.record(lc, "restore-from-cold", ck.path, WHO, f"ckptfs restore: copied back from {t.replica.name}",
                           step=ck.step, target=t.replica.name, files=len(files), bytes=manifest.bytes)
        log.info("restore: %s copied back from %s and verified deep: hot again", ck.path, t.replica.url)
        return {**out, "state": RESTORED, "copied": done["files"]}

    # ---------------------------------------------------------------- status
    def stats(self) -> dict[str, Any]:
        return {
            "target": self.name or None,
            "after_seconds": self.lc.cfg.tier_move_after if self.name else None,
            "moved_total": self.moved_total,
            "moved_bytes_total": self.moved_bytes_total,
            "moved_stored_bytes_total": self.moved_stored_bytes_total,
            "restored_total": self.restored_total,
            "errors_total": self.errors_total,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "failures": dict(self.failed),
            "moving": self.moving,
            "lease_held": self.lease is not None and self.lease.valid(),
            "last_run": self.last_run,
        }


async def _no_progress(_: dict[str, Any]) -> None:
    return None


class MoveCollector(Collector):
    """The mover's metrics (docs/metrics.md); 0 when no cold target is configured."""

    def __init__(self, mover: Mover) -> None:
        self.m = mover

    def collect(self):  # type: ignore[no-untyped-def]
        m = self.m
        for name, value, text in (
            ("ckptfs_tier_moved_checkpoints", m.moved_total, "Checkpoints this node moved to the cold target (tier_move_target)."),
            ("ckptfs_tier_moved_bytes", m.moved_bytes_total, "Bytes of the checkpoints this node moved to the cold target."),
            ("ckptfs_tier_moved_stored_bytes", m.moved_stored_bytes_total,
             "Bytes those checkpoints take on the cold target (compressed: cold_compression)."),
            ("ckptfs_tier_move_errors", m.errors_total, "Moves to the cold target that failed on this node (each is retried at the next pass)."),
            ("ckptfs_tier_restored_checkpoints", m.restored_total, "Moved checkpoints this node brought back with `ckptfs restore`."),
        ):
            c = CounterMetricFamily(name, text)
            c.add_metric([], float(value))
            yield c
        g = GaugeMetricFamily("ckptfs_tier_move_lease_held", "1 while this node holds the tier-move lease (it does the moving).")
        g.add_metric([], 1.0 if m.lease is not None and m.lease.valid() else 0.0)
        yield g
