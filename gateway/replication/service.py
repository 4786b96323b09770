"""The replicator: survey every target, copy what is missing while holding the `replication` lease.

Every `replication_interval` each node

1. surveys the primary: the committed checkpoints under the mount (the
   catalogue's walk, each checkpoint's manifest read once per ETag) and which
   are protected;
2. surveys each target: for every checkpoint the target should have
   (`select`, and every protected one), whether the target's manifest names
   the primary manifest's ETag (and carries its protection). What a target
   was seen to hold is remembered, so a target that stops answering keeps its
   last known state and its lag grows;
3. if anything is pending, tries to take the `replication` lease
   (lifecycle/lease.py). The holder copies the pending checkpoints to each
   target, oldest commit first, targets in parallel (copy.py), renewing the
   lease meanwhile; a lost lease cancels the copy at once. It records each
   target's failures in the primary bucket (`.ckptfs/replication/NAME.json`),
   so `ckptfs replicate status` on any node shows them.

A target that is unreachable or refuses (credentials, bucket missing,
quota) is one line in its entry (`error`) and in the metrics; the work runs in
tasks and threads of its own (`replication_read_timeout` bounds each request),
so it never holds up the mount, the drain or the lifecycle on the primary.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..peering import node_name_of
from ..config import Config, Replica
from ..lifecycle import audit, drill, place
from ..lifecycle.catalogue import walk
from ..lifecycle.lease import Lease, kept
from ..lifecycle.manifest import MANIFEST, MOVED, PROTECTED, LifecycleError, Manifest, is_own, moved_away, read_json, read_manifest
from ..patterns import Checkpoint
from ..lifecycle.retention import keep_rules
from ..lifecycle.verify import verify
from ..objects import AUTH, NETWORK, NO_BUCKET, NO_OBJECT, SERVER, StoreError, json_document
from ..store import Store
from ..lifecycle.copier import CopyError, Destination, Job, TargetView, copy_checkpoint, one_error
from ..lifecycle.context import Context

log = logging.getLogger(__name__)

LEASE_NAME = "replication"
STATUS_DIR = ".ckptfs/replication/"
TARGET_WIDE = (NETWORK, AUTH, NO_BUCKET, SERVER)  # failures that stop the whole target's pass, not one checkpoint
FIRST_SURVEY_WAIT = 10.0
COMMIT_SURVEY_WAIT = 2.0  # a survey runs at once after a commit, unless a long copy holds the pass
RETENTION_EVERY_PASSES = 5  # a target is walked for checkpoints the primary's retention deleted every this many passes  # seconds `replicate status` waits for a daemon's first survey before answering anyway


@dataclass
class Primary:
    """A committed checkpoint on the primary, as the last survey saw it."""

    ck: Checkpoint
    manifest: Manifest
    body: bytes  # the manifest object as stored
    protection: bytes | None  # the protection object, if protected

    @property
    def signature(self) -> str:
        """What a target must hold for this checkpoint to count as replicated."""
        return self.manifest.etag + (":protected" if self.protection is not None else "")


class Target(Destination):
    """A replica target: where copies go (Destination) and what the surveys learnt of it."""

    def __init__(self, replica: Replica, cfg: Config) -> None:
        super().__init__(replica, cfg)
        self.known: dict[str, str] = {}  # checkpoint path -> signature the target was seen (or made) to hold
        self.selected: dict[str, Primary] = {}
        self.failed: dict[str, str] = {}  # checkpoint path -> why its last copy failed
        self.error: str | None = None  # the target as a whole: unreachable, refused...
        self.error_kind: str | None = None
        self.surveyed_at = 0.0
        self.reached_at = 0.0
        self.copying: str | None = None
        self.errors_total = 0
        self.deleted_total = 0  # checkpoints deleted on the target after retention deleted them on the primary
        self.kept_by_policy: dict[str, list[str]] = {}  # deleted on the primary, kept by the replica's own retention: rules

    def pending(self) -> dict[str, Primary]:
        return {p: v for p, v in self.selected.items() if self.known.get(p) != v.signature}

    def state_of(self, path: str) -> str:
        """One checkpoint on this target, as of the last survey: replicated, pending, failed (why), not selected."""
        if path not in self.selected:
            return "not selected (not committed, or outside `select`)" if self.surveyed_at else "not surveyed yet"
        if self.known.get(path) == self.selected[path].signature:
            return "replicated"
        return f"failed: {self.failed[path]}" if path in self.failed else "pending"

    def fail(self, e: Exception) -> None:
        self.errors_total += 1
        if isinstance(e, StoreError) and e.kind in TARGET_WIDE:
            self.error, self.error_kind = str(e), e.kind

    def entry(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        pending = self.pending()
        oldest = min(pending.values(), key=lambda p: p.manifest.committed_at, default=None)
        return {
            "name": self.replica.name,
            "target": self.replica.url,
            "endpoint_url": self.replica.endpoint_url,
            "select": self.replica.select,
            "server_side_copy": self.same_endpoint,
            "replicated": len(self.selected) - len(pending),
            "pending": len(pending),
            "failed": sum(1 for p in pending if p in self.failed),
            "failures": {p: why for p, why in self.failed.items() if p in pending},
            "bytes_behind": sum(p.manifest.bytes for p in pending.values()),
            "lag_seconds": round(max(0.0, now - oldest.manifest.committed_at), 1) if oldest else 0.0,
            "oldest_pending": oldest.ck.path if oldest else None,
            "reachable": self.error is None and self.reached_at > 0,
            "error": self.error,
            "error_kind": self.error_kind,
            "surveyed_at": self.surveyed_at or None,
            "copying": self.copying,
            "copied_objects_total": self.counters.copied_objects,
            "copied_bytes_total": self.counters.copied_bytes,
            "skipped_objects_total": self.counters.skipped_objects,
            "server_side_objects_total": self.counters.server_side,
            "errors_total": self.errors_total,
            "deleted_total": self.deleted_total,
            "buffer_bytes_peak": self.buffers.peak_bytes,
            "own_policy": self.replica.own_policy,
            "kept_by_own_policy": len(self.kept_by_policy),
        }


class Replicator:
    def __init__(self, cfg: Config, lc: Context) -> None:
        self.cfg, self.lc = cfg, lc
        # the cold target of tier_move_target is the mover's (lifecycle/coldmove.py), not a replica
        self.targets = {name: Target(r, cfg) for name, r in cfg.replica.items() if name != cfg.tier_move_target}
        self.limiter = trio.CapacityLimiter(cfg.replication_parts_in_flight * max(1, len(self.targets)) + 8)
        self.lease = Lease.for_mount(lc.store, lc.keys.of, LEASE_NAME, cfg.replication_lease_ttl,
                                     node=node_name_of(cfg)) if self.targets else None
        self.primary: dict[str, Primary] = {}
        self.primary_paths: set[str] | None = None  # every checkpoint on the primary, committed or not (None: not surveyed)
        self.primary_error: str | None = None
        self.drills: dict[str, tuple[str, dict[str, Any], bool]] = {}  # drill id -> (target, restore result, keep dir)
        self._bodies: dict[str, tuple[str, bytes]] = {}  # object key -> (etag, body) of manifests and protection objects
        self._kick = trio.Event()
        # a manifest written on this node: copy it now, not at the next interval; `status` waits a little for a
        # survey that saw it, and otherwise says how many commits it has not seen (`unsurveyed_commits`), so that it
        # never reports a target caught up with a commit without saying so
        self.commits_seen = 0
        self.commits_surveyed = 0
        self._survey_done = trio.Event()
        lc.on_commit.append(self._committed)
        self.surveyed = trio.Event()
        self.passes_total = 0

    async def io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking store call in a worker thread; abandoned on cancel, so a hung target never holds up a stop."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=self.limiter, abandon_on_cancel=True)

    @property
    def enabled(self) -> bool:
        return bool(self.targets) and self.lc.patterns.enabled and not self.cfg.read_only

    # -------------------------------------------------------------------- loop
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self.enabled:
            return
        for t in self.targets.values():
            log.info("replicating checkpoints (%s) to %s%s", t.replica.select, t.replica.url,
                     f" at {t.replica.endpoint_url}" if t.replica.endpoint_url else "")
        while True:
            try:
                await self.pass_once()
            except Exception:  # noqa: BLE001 - replication must never take the mount down with it
                log.exception("replication pass failed unexpectedly; the next pass retries")
            with trio.move_on_after(self.cfg.replication_interval):
                await self._kick.wait()
            self._kick = trio.Event()

    def kick(self) -> None:
        self._kick.set()

    def _committed(self, path: str) -> None:
        self.commits_seen += 1
        self.kick()

    async def pass_once(self) -> None:
        seen = self.commits_seen
        try:
            await self._survey_primary()
            self.primary_error = None
            self.commits_surveyed = seen
        except (StoreError, LifecycleError) as e:
            self.primary_error = str(e)
            log.warning("replication: cannot survey the primary, will retry: %s", e)
        held = self.lease is not None and self.lease.valid()
        async with trio.open_nursery() as nursery:
            for t in self.targets.values():
                nursery.start_soon(self._survey_target, t, held)
        self.surveyed.set()
        self._survey_done.set()
        self._survey_done = trio.Event()
        self.passes_total += 1
        if not any(t.pending() for t in self.targets.values()) and self.passes_total % RETENTION_EVERY_PASSES != 1:
            return  # nothing to copy; the targets' retention is looked at every few passes
        assert self.lease is not None
        try:
            held = await self.io(self.lease.acquire)
        except StoreError as e:
            log.warning("replication: cannot take the lease, will retry: %s", e)
            return
        if not held:
            return  # another node copies
        async with kept(self.lease, self.io), trio.open_nursery() as work:
            for t in self.targets.values():
                if t.pending():
                    work.start_soon(self._copy_target, t)
                elif t.error_kind not in TARGET_WIDE:
                    work.start_soon(self._follow_retention, t)

    # ------------------------------------------------------------------ survey
    async def _body(self, store: Store, key: str, etag: str) -> bytes:
        cached = self._bodies.get(key)
        if cached and cached[0] == etag:
            return cached[1]
        body, got = await self.io(store.get_bytes, key)
        self._bodies[key] = (got, body)
        return body

    async def _survey_primary(self) -> None:
        lc = self.lc
        found: dict[str, Primary] = {}
        paths = []
        for ck in await lc.catalogue.find(""):
            paths.append(ck.path)
            own_key = functools.partial(place.own_key, lc.keys.prefix, ck)
            top = await self.io(place.top, lc.store, lc.keys.prefix, ck)
            own = {o.name: o for o in top.objects}
            if MANIFEST not in own:
                continue  # not committed
            if MOVED in own and moved_away(await self._body(lc.store, own_key(MOVED), own[MOVED].etag)):
                continue  # its files are (going) on the cold target: lifecycle/coldmove.py
            try:
                body = await self._body(lc.store, own_key(MANIFEST), own[MANIFEST].etag)
                protection = await self._body(lc.store, own_key(PROTECTED), own[PROTECTED].etag) if PROTECTED in own else None
            except StoreError as e:
                if e.kind == NO_OBJECT:
                    continue  # deleted meanwhile
                raise
            etag = self._bodies[own_key(MANIFEST)][0]
            try:
                manifest = Manifest.from_json(body, etag)
            except LifecycleError as e:
                log.warning("replication: %s: %s", ck.path, e)
                continue
            found[ck.path] = Primary(ck, manifest, body, protection)
        self.primary = found
        self.primary_paths = set(paths)

    async def _survey_target(self, t: Target, holder: bool) -> None:
        t.selected = {p: v for p, v in self.primary.items() if t.replica.wants(v.ck.step, v.protection is not None)}
        for p in list(t.known):
            if p not in self.primary:
                del t.known[p]
        try:
            store = t.open()
            for path, v in sorted(t.selected.items()):
                if t.known.get(path) == v.signature:
                    continue
                top = await self.io(place.top, store, t.replica.key_prefix, v.ck)
                own = {o.name for o in top.objects}
                if MANIFEST not in own:
                    continue
                doc, _ = await self.io(read_json, store, place.own_key(t.replica.key_prefix, v.ck, MANIFEST))
                if not doc:
                    continue
                if doc.get("replicated_from", {}).get("etag") == v.manifest.etag and (PROTECTED in own) == (v.protection is not None):
                    t.known[path] = v.signature
            if not holder:
                await self._read_failures(t)
            t.error = t.error_kind = None
            t.reached_at = time.time()
        except StoreError as e:
            if t.error != str(e):
                log.warning("replica %s (%s): %s", t.replica.name, t.replica.url, e)
            t.fail(e)
            if e.kind not in TARGET_WIDE:
                t.error, t.error_kind = str(e), e.kind
        t.surveyed_at = time.time()

    def _status_key(self, t: Target) -> str:
        return self.lc.keys.of(f"{STATUS_DIR}{t.replica.name}.json")

    async def _read_failures(self, t: Target) -> None:
        """Failures the lease holder recorded in the primary bucket (this node does not copy)."""
        try:
            doc, _ = await self.io(read_json, self.lc.store, self._status_key(t))
            if doc:
                t.failed = {str(k): str(v) for k, v in dict(doc.get("failures") or {}).items()}
        except (StoreError, ValueError, TypeError, AttributeError):
            pass

    async def _write_failures(self, t: Target) -> None:
        doc = {"target": t.replica.url, "node": node_name_of(self.cfg), "at": time.time(), "failures": t.failed, "error": t.error}
        try:
            await self.io(self.lc.store.put_bytes, self._status_key(t), json_document(doc, indent=1))
        except StoreError as e:
            log.info("replication: could not record %s's status in the primary bucket: %s", t.replica.name, e)

    # -------------------------------------------------------------------- copy
    async def _copy_target(self, t: Target) -> None:
        if t.error_kind in TARGET_WIDE:
            await self._write_failures(t)
            return  # not reached in this pass's survey: try again next pass
        lease = self.lease
        assert lease is not None

        def check() -> None:
            if not lease.valid():
                raise CopyError("the replication lease was lost: another node carries on")

        for path, v in sorted(t.pending().items(), key=lambda kv: kv[1].manifest.committed_at):
            try:
                check()
                store = t.open()
                if t.object_lock is None:  # legal holds placed with protection, lifted with it
                    t.object_lock = await self.io(store.object_lock_enabled)
                job = Job(self.lc.store, store, self.cfg.bucket, place.files_base(t.replica.key_prefix, v.ck), t.same_endpoint,
                          self.cfg.replication_part_size, self.cfg.copy_multipart_threshold, t.slots, self.io, t.counters, check,
                          t.buffers, v.ck)
                t.copying = path
                before = (t.counters.copied_objects, t.counters.skipped_objects)
                await copy_checkpoint(job, v.manifest, v.body, v.protection, bool(t.object_lock))
                t.known[path] = v.signature
                t.failed.pop(path, None)
                log.info("replica %s: %s replicated (%d objects copied, %d already there)", t.replica.name, path,
                         t.counters.copied_objects - before[0], t.counters.skipped_objects - before[1])
            except (StoreError, CopyError) as e:
                t.failed[path] = str(e)
                t.fail(e)
                log.warning("replica %s: copy of %s failed, will retry: %s", t.replica.name, path, e)
                if isinstance(e, StoreError) and e.kind in TARGET_WIDE:
                    break
                if not lease.valid():
                    break
            finally:
                t.copying = None
        t.buffers.release()  # unmapped: an idle replicator holds no part buffers (a cancelled pass: the next one's)
        await self._write_failures(t)

    # --------------------------------------------------------------- retention
    async def _own_policy_keeps(self, store: Store, t: Target, on_target: dict[str, Checkpoint], series: set[str]) -> dict[str, list[str]]:
        """The replica's own retention (`[replica.NAME] keep_*`) over the committed checkpoints on it, in `series`:
        path -> the rules that keep it."""
        r = t.replica
        groups: dict[str, list[dict[str, Any]]] = {}
        for path, ck in sorted(on_target.items()):
            parent, step = ck.parent, ck.step
            if parent not in series:
                continue
            manifest = await self.io(read_manifest, store, place.own_key(r.key_prefix, ck, MANIFEST))
            if manifest is None:
                continue  # not committed on the replica: no rule counts it
            groups.setdefault(parent, []).append({"path": path, "step": step, "committed_at": manifest.committed_at,
                                                  "first_committed_at": manifest.first_committed_at})
        out: dict[str, list[str]] = {}
        for group in groups.values():
            group.sort(key=lambda e: (e["step"], e["path"]))
            out.update(keep_rules(group, r.keep_last, r.keep_every_steps, r.keep_every_seconds))
        return out

    async def _follow_retention(self, t: Target) -> None:
        """Delete a target's copy of a checkpoint once retention on the primary deleted it (after its grace period).

        Only a deletion the primary's audit log records as retention's counts: a checkpoint that is
        merely missing from the primary (removed by hand, or the primary bucket lost) is kept on the
        replica. A copy protected on the target is kept whatever happened on the primary, and so is
        one the replica's own retention (`keep_*`, only ever longer than the primary's) keeps.
        """
        if self.primary_paths is None or self.primary_error:
            return
        try:
            store = t.open()
            on_target = await walk(store, t.replica.key_prefix, self.lc.patterns, self.io)
            gone = sorted(set(on_target) - self.primary_paths)
            if not gone:
                t.kept_by_policy = {}
                return
            deleted = {e["path"]: e for e in await audit.read(self.lc, "") if e.get("action") == "delete"}  # type: ignore[arg-type]
            keeps: dict[str, list[str]] = {}
            if t.replica.own_policy:
                keeps = await self._own_policy_keeps(store, t, on_target, {p.rpartition("/")[0] for p in gone if p in deleted})
            kept: dict[str, list[str]] = {}
            for path in gone:
                event = deleted.get(path)
                if event is None:
                    continue
                ck = on_target[path]
                base = place.files_base(t.replica.key_prefix, ck)
                own_key = functools.partial(place.own_key, t.replica.key_prefix, ck)
                listing = await self.io(place.listing_at, store, base, ck)
                if not listing.objects and not listing.marker:
                    continue  # nothing left (some stores list an emptied directory for a while)
                if any(o.name == PROTECTED for o in listing.objects):
                    log.warning("replica %s: %s was deleted on the primary by retention but is protected on the replica: kept",
                                t.replica.name, path)
                    continue
                if keeps.get(path):
                    kept[path] = keeps[path]
                    if path not in t.kept_by_policy:
                        log.info("replica %s: %s was deleted on the primary by retention; the replica's own retention keeps it (%s)",
                                 t.replica.name, path, ", ".join(keeps[path]))
                    continue
                if not self.lease or not self.lease.valid():
                    return
                if any(o.name == MANIFEST for o in listing.objects):
                    await self.io(store.delete, own_key(MANIFEST))  # first: visibly incomplete from here on
                for o in listing.objects:
                    if o.name != MANIFEST:
                        await self.io(store.delete, own_key(o.name) if is_own(o.name) else base + o.name)
                if listing.marker and not ck.file:
                    await self.io(store.delete, base)
                t.known.pop(path, None)
                t.deleted_total += 1
                await audit.record(self.lc, "replica-delete", path, {"user": "ckptfs", "uid": -1},  # type: ignore[arg-type]
                                   f"retention deleted it on the primary ({event.get('at_iso')}): replica {t.replica.name} follows"
                                   + (f" (its own retention, {t.replica.own_policy}, does not keep it)" if t.replica.own_policy else ""),
                                   target=t.replica.name, target_url=t.replica.url)
                log.info("replica %s: %s deleted (retention deleted it on the primary at %s)", t.replica.name, path, event.get("at_iso"))
            t.kept_by_policy = kept
        except StoreError as e:
            t.fail(e)
            log.warning("replica %s: retention on the replica failed, will retry: %s", t.replica.name, e)

    # ---------------------------------------------------------------- commands
    def target(self, name: str) -> Target:
        t = self.targets.get(name)
        if t is None:
            known = ", ".join(self.targets) or "none configured"
            raise LifecycleError(f"no replica target {name!r} (targets: {known}): add a [replica.{name}] table to the config file")
        return t

    async def status(self) -> list[dict[str, Any]]:
        if self.enabled and (not self.surveyed.is_set() or self.commits_surveyed < self.commits_seen):
            wait = FIRST_SURVEY_WAIT if not self.surveyed.is_set() else COMMIT_SURVEY_WAIT
            with trio.move_on_after(wait):  # the first survey, or one that saw this node's last commit
                while not self.surveyed.is_set() or self.commits_surveyed < self.commits_seen:
                    await self._survey_done.wait()
        now = time.time()
        return [{**t.entry(now), "unsurveyed_commits": self.commits_seen - self.commits_surveyed} for t in self.targets.values()]

    async def verify(self, name: str, ck: Checkpoint, deep: bool, progress: Callable[[dict[str, Any]], Awaitable[None]]) -> dict[str, Any]:
        t = self.target(name)
        store = t.open()
        prefix = t.replica.key_prefix
        manifest = await self.io(read_manifest, store, place.own_key(prefix, ck, MANIFEST))
        if manifest is None:
            raise LifecycleError(f"{ck.path} has no manifest on replica {name} ({t.replica.url}): not replicated (yet); "
                                 f"see `ckptfs replicate status`")
        view = TargetView(self.cfg, store, prefix, self.io)
        result = await verify(view, ck, manifest, deep, progress)  # type: ignore[arg-type]
        return {**result, "target": name}

    async def handle(self, request: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> None:
        """Control-socket requests: `replicate_status`, and `verify` with a `target`."""
        cmd = request["cmd"]
        path = str(request.get("path", "")).strip("/")
        try:
            if cmd == "replicate_status":
                if not self.targets:
                    raise LifecycleError("no replica targets configured: add [replica.NAME] tables to the config file (docs/replication.md)")
                targets = await self.status()
                if path:  # the catalogue page: where this checkpoint stands on each target
                    for t, entry in zip(self.targets.values(), targets):
                        entry["checkpoint"] = t.state_of(path)
                await send({"ok": True, "targets": targets, "primary_error": self.primary_error,
                            "lease_held": self.lease is not None and self.lease.valid()})
            elif cmd == "verify":
                name = str(request["target"])
                self.target(name)
                ck = self.lc.patterns.checkpoint_of(path)
                if ck is None or ck.path != path:
                    raise LifecycleError(f"{path or '/'} is not a checkpoint (checkpoint_patterns): give the checkpoint's path in the mount")

                async def progress(p: dict[str, Any]) -> None:
                    await send({"ok": True, **p})

                await send({"ok": True, "done": True, "result": await self.verify(name, ck, bool(request.get("deep")), progress)})
            elif cmd == "drill":
                await self._drill(str(request["target"]), path, request, send)
            elif cmd == "drill_done":
                pending = self.drills.pop(str(request.get("id")), None)
                if pending is None:
                    raise LifecycleError(f"no drill {request.get('id')!r} is waiting here (the daemon restarted?): run the drill again")
                name, result, keep_dir = pending
                await send({"ok": True, "done": True, "result": await self._drill_end(name, drill.finish(result, request.get("exec")), keep_dir)})
            else:
                raise LifecycleError(f"unknown command {cmd!r}")
        except LifecycleError as e:
            await send({"ok": False, "error": str(e)})
        except StoreError as e:
            target = request.get("target")
            await send({"ok": False, "error": f"{cmd} {path or '/'}{f' on replica {target}' if target else ''}: {e}"})
        except Exception as e:  # noqa: BLE001 - a command's failure must never stop the daemon (and its mount)
            err = one_error(e) if isinstance(e, BaseExceptionGroup) else None
            if not isinstance(err, StoreError):
                log.exception("%s %s failed", cmd, path or "/")
                err = None
            await send({"ok": False, "error": f"{cmd} {path or '/'}: {err or f'internal error ({type(e).__name__}: {e}); see the daemon log'}"})

    def owns_drill(self, drill_id: Any) -> bool:
        return str(drill_id) in self.drills

    async def _drill(self, name: str, path: str, request: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> None:
        """`ckptfs drill --target NAME`: restore from the replica (drill.restore through the target), verify deep."""
        t = self.target(name)
        store = t.open()
        ck = self.lc.patterns.checkpoint_of(path)
        if ck is not None and ck.path != path:
            raise LifecycleError(f"{path} is inside checkpoint {ck.path}: give the checkpoint's directory, or a directory above it")
        if ck is None:
            held = [v for p, v in self.primary.items() if t.known.get(p) == v.signature and (not path or p == path or p.startswith(path + "/"))]
            if not held:
                raise LifecycleError(f"no checkpoint under {path or '/'} is on replica {name} yet: see `ckptfs replicate status`")
            ck = max(held, key=lambda v: (v.manifest.committed_at, v.ck.step)).ck
        view = TargetView(self.cfg, store, t.replica.key_prefix, self.io)
        manifest = await self.io(read_manifest, store, place.own_key(view.keys.prefix, ck, MANIFEST))
        if manifest is None:
            raise LifecycleError(f"{ck.path} has no manifest on replica {name} ({t.replica.url}): not replicated (yet); "
                                 f"see `ckptfs replicate status`")
        keep_dir = bool(request.get("keep"))
        try:
            into = drill.new_target(self.lc, str(request.get("dir") or ""))
        except OSError as e:
            raise LifecycleError(f"cannot create a directory to restore into ({e}): give --dir a writable directory") from None

        async def progress(p: dict[str, Any]) -> None:
            await send({"ok": True, **p})

        try:
            result = await drill.restore(view, ck, manifest, into, progress)  # type: ignore[arg-type]
        except BaseException:
            if not keep_dir:
                shutil.rmtree(into, ignore_errors=True)
            raise
        result["target"] = name
        if request.get("exec") and result["verify"] == "whole":
            self.drills[into.name] = (name, result, keep_dir)
            await send({"ok": True, "done": True, "id": into.name, "result": result, "waiting": True})
            return
        await send({"ok": True, "done": True, "result": await self._drill_end(name, drill.finish(result, None), keep_dir)})

    async def _drill_end(self, name: str, result: dict[str, Any], keep_dir: bool) -> dict[str, Any]:
        """Remove the restored copy (unless kept) and record the drill on the replica (its `.ckptfs/drills/last.json`)."""
        t = self.target(name)
        if not keep_dir:
            shutil.rmtree(result["dir"], ignore_errors=True)
        result["kept"] = keep_dir
        view = TargetView(self.cfg, t.open(), t.replica.key_prefix, self.io)
        try:
            await drill.record(view, result)  # type: ignore[arg-type]
        except (StoreError, LifecycleError) as e:
            result["record_error"] = str(e)
        log.info("drill of %s from replica %s: %s (restore %.1f s, verify %s)", result["path"], name, result["outcome"],
                 result["restore_seconds"], result["verify"])
        return result

    def collector(self) -> "ReplicationCollector":
        return ReplicationCollector(self)


class ReplicationCollector(Collector):
    """Per-target replication metrics (docs/metrics.md), from the last survey: the scrape makes no request."""

    def __init__(self, r: Replicator) -> None:
        self.r = r

    def collect(self):  # type: ignore[no-untyped-def]
        now = time.time()
        entries = [t.entry(now) for t in self.r.targets.values()]
        families = {
            "lag": GaugeMetricFamily("ckptfs_replication_lag_seconds", "Age of the oldest committed checkpoint not yet on the target (0 when none is pending).", labels=["target"]),
            "bytes": GaugeMetricFamily("ckptfs_replication_lag_bytes", "Bytes of the committed checkpoints not yet on the target.", labels=["target"]),
            "count": GaugeMetricFamily("ckptfs_replication_checkpoints", "Checkpoints selected for the target, by state: replicated, pending (not yet there), failed (pending, and the last copy failed).", labels=["target", "state"]),
            "up": GaugeMetricFamily("ckptfs_replication_target_up", "1 if the last survey reached the target, 0 if it was unreachable or refused.", labels=["target"]),
            "surveyed": GaugeMetricFamily("ckptfs_replication_survey_timestamp_seconds", "When the target was last surveyed (Unix time); 0 if not yet.", labels=["target"]),
            "errors": CounterMetricFamily("ckptfs_replication_errors", "Failed surveys of, and copies to, the target.", labels=["target"]),
            "copied_bytes": CounterMetricFamily("ckptfs_replication_copied_bytes", "Bytes this node copied to the target.", labels=["target"]),
            "copied": CounterMetricFamily("ckptfs_replication_copied_objects", "Objects this node copied to the target.", labels=["target"]),
            "skipped": CounterMetricFamily("ckptfs_replication_skipped_objects", "Objects a copy found already on the target (size, xxh3 and source ETag), not copied again.", labels=["target"]),
        }
        for e in entries:
            n = [e["name"]]
            families["lag"].add_metric(n, float(e["lag_seconds"]))
            families["bytes"].add_metric(n, float(e["bytes_behind"]))
            for state in ("replicated", "pending", "failed"):
                families["count"].add_metric([e["name"], state], float(e[state]))
            families["up"].add_metric(n, 1.0 if e["reachable"] else 0.0)
            families["surveyed"].add_metric(n, float(e["surveyed_at"] or 0))
            families["errors"].add_metric(n, float(e["errors_total"]))
            families["copied_bytes"].add_metric(n, float(e["copied_bytes_total"]))
            families["copied"].add_metric(n, float(e["copied_objects_total"]))
            families["skipped"].add_metric(n, float(e["skipped_objects_total"]))
        yield from families.values()
        g = GaugeMetricFamily("ckptfs_replication_lease_held", "1 while this node holds the replication lease (it does the copying).")
        g.add_metric([], 1.0 if self.r.lease is not None and self.r.lease.valid() else 0.0)
        yield g
