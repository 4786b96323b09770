"""The lifecycle as the daemon uses it: one object holding its parts, and the control-socket commands."""

from __future__ import annotations

import errno
import functools
import logging
import shutil
import time
from typing import Any, Awaitable, Callable

import trio

from .. import threads
from ..peering import node_name_of
from ..config import Config
from ..namespace import Namespace
from ..remote import Remote
from ..objects import StoreError
from ..storeapi import LifecycleStore
from . import audit, coldmove, drill, retention, tiers
from .catalogue import STATES, Catalogue
from .lease import Lease
from .overview import overview
from .manifest import MOVING, OWN_OBJECTS, LifecycleError, first_store_error, label
from ..patterns import Checkpoint, Patterns
from .protect import Guard, protect, unprotect
from .tracker import Tracker
from .stats import SCAN_SECONDS, LifecycleCollector, summarize
from .usage import usage
from .verify import verify

__all__ = ["Lifecycle", "LifecycleError", "STATES"]

log = logging.getLogger(__name__)

DRILL_EXEC_LIMIT = 6 * 3600.0  # a restored directory waiting for its CLI's command is removed after this
STORE_THREADS = 16  # requests to the bucket in flight for lifecycle work (verify's ranges, HEADs)
PROGRESS_INTERVAL = 0.2
COMMANDS = ("checkpoints", "catalogue", "checkpoint_commit", "verify", "protect", "unprotect", "audit",
            "retention_plan", "retention_apply", "retention_restore", "drill", "drill_done", "usage", *tiers.COMMANDS)


class Lifecycle:
    def __init__(self, cfg: Config, ns: Namespace, store: LifecycleStore, remote: Remote) -> None:
        self.cfg, self.ns, self.store, self.remote = cfg, ns, store, remote
        self.keys = ns.keys
        self.patterns = Patterns(cfg.checkpoint_patterns)
        self.limiter = trio.CapacityLimiter(STORE_THREADS)
        self.catalogue = Catalogue(self)
        self.tracker = Tracker(self, cfg.cache_dir)
        self.guard = Guard(ns.journal, self.catalogue)
        self.last_verify: dict[str, Any] | None = None
        self.tag_errors_total = 0  # checkpoint objects that could not be tagged (tiers.py)
        self.entries: list[dict[str, Any]] = []  # the last whole-mount catalogue walk
        self.summary: dict[str, Any] = {}  # the catalogue summarised for the metrics (stats.py)
        self.retention_stats: dict[str, Any] = {"expired": 0, "deleted": 0, "deleted_bytes": 0, "errors": 0,
                                                "last_run": 0.0, "lease_held": False}
        self.retention_lease: Lease | None = None  # this node's, kept from run to run when retention is scheduled
        self.retention_lock = trio.Lock()  # one retention run at a time on this node
        self.drill_record: dict[str, Any] = {}  # the bucket's drill record: last and last_success (drill.py)
        self.drills_pending: dict[str, tuple[float, dict[str, Any], bool]] = {}  # id -> (started, restore result, keep dir)
        self.drills_total = {"ok": 0, "failed": 0}
        self.mover = coldmove.Mover(self)  # tier_move_target: moves old checkpoints to a cold target (coldmove.py)
        # told the path of each manifest written: the replicator (a layer above) starts a pass at once instead of
        # up to replication_interval later
        self.on_commit: list[Callable[[str], None]] = []
        if cfg.retention_interval > 0:
            self.retention_lease = Lease.for_mount(store, self.keys.of, retention.LEASE_NAME, retention.lease_ttl(cfg),
                                                  node=node_name_of(cfg))
            if not retention.policy_enabled(cfg):
                log.warning("retention_interval is set but every retention_keep_* rule is 0: scheduled retention keeps everything")
        remote.on_listing = self.catalogue.learn_listing
        ns.uploads.own_objects = self._own_objects
        ns.uploads.on_settled = self.tracker.settled

    def _own_objects(self, path: str) -> list[str]:
        """ckptfs's objects inside directory `path`, deleted with it when it is removed or renamed."""
        ck = self.patterns.checkpoint_of(path, is_dir=True)
        return list(OWN_OBJECTS) if ck is not None and ck.path == path else []

    async def io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking store call in a worker thread (abandoned if cancelled: a hung store never holds up a stop)."""
        return await threads.call(functools.partial(fn, *args), limiter=self.limiter)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # the drills still pending keep their directories: this runs again when the supervisor restarts the lifecycle
        drill.clean_leftovers(self, {r["dir"] for _, r, _ in self.drills_pending.values()})
        async with trio.open_nursery() as nursery:
            await nursery.start(self.tracker.run)
            if self.patterns.enabled:
                nursery.start_soon(self._scan_loop)
                if self.retention_lease is not None:
                    nursery.start_soon(retention.schedule, self, self.retention_lease)
                nursery.start_soon(self.mover.run)
            task_status.started()

    async def _scan_loop(self) -> None:
        """Summarise the catalogue for the metrics now and then (a walk of the bucket)."""
        while True:
            try:
                await self.scan("")
            except (StoreError, LifecycleError) as e:
                log.info("catalogue walk for the metrics failed, will retry: %s", e)
            await trio.sleep(SCAN_SECONDS)

    async def scan(self, path: str) -> list[dict[str, Any]]:
        entries = [await self.catalogue.describe(ck) for ck in await self.catalogue.find(path)]
        if not path:
            self.summary = summarize(entries)
            self.entries = entries  # for the storage metrics (usage.py)
            self.drill_record = await drill.read_record(self)
        return entries

    # ------------------------------------------------ user.ckptfs.state of a checkpoint directory (fs.CheckpointStates)
    def is_checkpoint(self, path: str) -> bool:
        ck = self.patterns.checkpoint_of(path, is_dir=True)
        return ck is not None and ck.path == path and not ck.file

    async def checkpoint_state(self, path: str) -> str | None:
        """The state `ckptfs checkpoints` shows for directory checkpoint `path` (None if it is not one): local work
        as it is now, else what the bucket says. A store that cannot answer is EIO, not a wrong word."""
        if not self.is_checkpoint(path):
            return None
        ck = self.patterns.checkpoint_of(path, is_dir=True)
        assert ck is not None
        self.tracker.refresh()
        local = self.tracker.local_state(path)
        if local:
            return local
        try:
            return str((await self.catalogue.describe(ck))["state"])
        except (StoreError, LifecycleError) as e:
            raise OSError(errno.EIO, f"{path}: the bucket did not say its state: {e}") from None

    def collector(self) -> LifecycleCollector:
        return LifecycleCollector(self)

    # ---------------------------------------------------------------- commands
    async def _checkpoint(self, rel: str) -> Checkpoint:
        """The checkpoint (directory or file) at mount-relative `rel`; LifecycleError if it is not one."""
        ck = self.patterns.checkpoint_of(rel)
        if ck is None:
            pats = ", ".join(self.patterns.patterns) or "none configured"
            raise LifecycleError(f"{rel or '/'} is not a checkpoint: nothing on its path matches checkpoint_patterns ({pats})")
        if ck.path != rel:
            raise LifecycleError(f"{rel} is inside checkpoint {ck.path}: give the checkpoint's directory")
        ino = await self.remote.resolve(rel)
        row = self.ns.journal.get(ino) if ino is not None else None
        if row is None or row.is_dir == ck.file:
            raise LifecycleError(f"{rel}: no such {'file' if ck.file else 'directory'} in the mount")
        return ck

    async def handle(self, request: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> None:
        """One control-socket request (see control.py); errors become {"ok": false, "error": ...}."""
        cmd = request["cmd"]
        path = str(request.get("path", "")).strip("/")
        self.tracker.refresh()  # every answer below judges local work as it is now
        try:
            if cmd == "checkpoints":
                if path and await self.remote.resolve(path) is None:
                    raise LifecycleError(f"{path}: no such file or directory in the mount")
                await send({"ok": True, "checkpoints": await self.scan(path)})
            elif cmd == "checkpoint_commit":
                ck = await self._checkpoint(path)
                await self._wait_durable(path, send)
                self.tracker.refresh()  # drained now: no longer `draining` in what the next request sees
                metadata = request.get("metadata") or {}
                if not isinstance(metadata, dict):
                    raise LifecycleError(f"metadata must be a JSON object ({{\"key\": value, ...}}), not {type(metadata).__name__}")
                manifest, wrote = await self.tracker.commit(ck, None, "command", metadata)
                await send({"ok": True, "done": True, "written": wrote, "path": ck.path, "step": ck.step,
                            "generation": manifest.generation, "changed": manifest.changed,
                            "files": len(manifest.files), "bytes": manifest.bytes})
            elif cmd == "verify" and request.get("target"):  # the cold target (control.py sends replicas to the replicator)
                ck = await self._checkpoint(path)

                async def progress(p: dict[str, Any]) -> None:
                    await send({"ok": True, **p})

                result = await self.mover.verify(ck, bool(request.get("deep")), progress, str(request["target"]))
                await send({"ok": True, "done": True, "result": result})
            elif cmd == "verify":
                ck = await self._checkpoint(path)
                record, _ = await self.mover.record(ck.path)
                if label(record) and record["state"] != MOVING:  # type: ignore[index]
                    assert record is not None
                    raise LifecycleError(f"{ck.path} is {record['state']} to cold target {record.get('target')} ({record.get('target_url')}) "
                                         f"since {record.get('at_iso')}: its files are not in this bucket; verify it there with "
                                         f"`ckptfs verify {ck.path} --target {record.get('target')}`, or bring it back with `ckptfs restore {ck.path}`")
                manifest = await self.catalogue.manifest(ck)
                if manifest is None:
                    raise LifecycleError(f"{ck.path} is not committed (no manifest): nothing to verify against; "
                                         f"run `ckptfs checkpoint commit {ck.path}` once it is complete")

                async def progress(p: dict[str, Any]) -> None:
                    await send({"ok": True, **p})

                result = await verify(self, ck, manifest, bool(request.get("deep")), progress)
                await send({"ok": True, "done": True, "result": result})
            elif cmd in ("protect", "unprotect"):
                reason = str(request.get("reason", "")).strip()
                if not reason:
                    raise LifecycleError(f"{cmd} needs a non-empty reason: it goes to the audit log")
                ck = await self._checkpoint(path)
                who = dict(request.get("who") or {})
                fn = protect if cmd == "protect" else unprotect
                await send({"ok": True, **await fn(self, ck, reason, who)})
            elif cmd == "audit":
                await send({"ok": True, "events": await audit.read(self, path)})
            elif cmd in ("retention_plan", "retention_apply"):
                await self._exists(path)
                # a checkpoint is judged within its whole series (its directory), whatever PATH narrows the output to
                ck = self.patterns.checkpoint_of(path)
                scope = retention.series_scope(self.patterns, path)
                if cmd == "retention_plan":
                    decisions = retention.plan(await self.scan(scope), self.cfg)
                else:
                    decisions = await retention.apply_leased(self, scope, dict(request.get("who") or {}),
                                                             only=ck.path if ck is not None else None)
                if ck is not None:
                    decisions = [d for d in decisions if d.path == ck.path]
                await send({"ok": True, "plan": [d.to_json() for d in decisions], "policy": retention.policy_enabled(self.cfg)})
            elif cmd == "drill":
                await self._exists(path)
                await self._drill(path, request, send)
            elif cmd == "drill_done":
                pending = self.drills_pending.pop(str(request.get("id")), None)
                if pending is None:
                    raise LifecycleError(f"no drill {request.get('id')!r} is waiting here (the daemon restarted?): run the drill again")
                _, result, keep_dir = pending
                await send({"ok": True, "done": True, "result": await self._drill_end(drill.finish(result, request.get("exec")), keep_dir)})
            elif cmd == "retention_restore":
                ck = await self._checkpoint(path)
                await send({"ok": True, **await retention.restore(self, ck, dict(request.get("who") or {}), str(request.get("reason", "")))})
            elif cmd == "catalogue":  # the catalogue page (ui/): the entries of `checkpoints` and what it shows beside them
                await self._exists(path)
                await send({"ok": True, **await overview(self, path, bool(request.get("files")))})
            elif cmd == "usage":
                await self._exists(path)
                await send({"ok": True, **await usage(self, path)})
            elif cmd in tiers.COMMANDS:
                await tiers.handle(self, cmd, path, request, send)
            else:
                raise LifecycleError(f"unknown command {cmd!r}")
        except LifecycleError as e:
            await send({"ok": False, "error": str(e)})
        except StoreError as e:
            await send({"ok": False, "error": f"{cmd} {path or '/'}: {e}"})
        except Exception as e:  # noqa: BLE001 - a command's failure must never stop the daemon (and its mount)
            err = first_store_error(e) if isinstance(e, BaseExceptionGroup) else None
            if err is None:
                log.exception("%s %s failed", cmd, path or "/")
            await send({"ok": False, "error": f"{cmd} {path or '/'}: {err or f'internal error ({type(e).__name__}: {e}); see the daemon log'}"})

    async def _drill(self, path: str, request: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> None:
        ck, manifest = await drill.choose(self, path)
        now = time.time()
        for old, (started, result, keep_dir) in list(self.drills_pending.items()):
            if now - started > DRILL_EXEC_LIMIT:
                del self.drills_pending[old]  # its CLI never came back
                if not keep_dir:
                    shutil.rmtree(result["dir"], ignore_errors=True)
        drill.clean_leftovers(self, {r["dir"] for _, r, _ in self.drills_pending.values()})
        keep_dir = bool(request.get("keep"))
        try:
            target = drill.new_target(self, str(request.get("dir") or ""))
        except OSError as e:
            raise LifecycleError(f"cannot create a directory to restore into ({e}): give --dir a writable directory") from None

        async def progress(p: dict[str, Any]) -> None:
            await send({"ok": True, **p})

        source, manifest = await self.mover.source(ck, manifest)  # a moved checkpoint: from its cold target
        try:
            result = await drill.restore(source or self, ck, manifest, target, progress)
        except BaseException:
            if not keep_dir:
                shutil.rmtree(target, ignore_errors=True)
            raise
        if request.get("exec") and result["verify"] == "whole":
            self.drills_pending[target.name] = (now, result, keep_dir)
            await send({"ok": True, "done": True, "id": target.name, "result": result, "waiting": True})
            return
        await send({"ok": True, "done": True, "result": await self._drill_end(drill.finish(result, None), keep_dir)})

    async def _drill_end(self, result: dict[str, Any], keep_dir: bool) -> dict[str, Any]:
        self.drills_total["ok" if result["outcome"] == "ok" else "failed"] += 1
        if not keep_dir:
            shutil.rmtree(result["dir"], ignore_errors=True)
        result["kept"] = keep_dir
        try:
            await drill.record(self, result)
        except (StoreError, LifecycleError) as e:
            result["record_error"] = str(e)
            log.warning("drill of %s: its outcome could not be recorded in the bucket: %s", result["path"], e)
        log.info("drill of %s: %s (restore %.1f s, %.1f MB/s, verify %s%s)", result["path"], result["outcome"], result["restore_seconds"],
                 result["bytes_per_second"] / 1e6, result["verify"], f", command exit {result['exec']['exit_code']}" if result.get("exec") else "")
        return result

    async def _exists(self, path: str) -> None:
        if path and await self.remote.resolve(path) is None:
            raise LifecycleError(f"{path}: no such file or directory in the mount")

    async def _wait_durable(self, path: str, send: Callable[[Any], Awaitable[None]]) -> None:
        """Until every file under `path` written on this node is durable (progress lines meanwhile)."""
        uploads = self.ns.uploads
        while True:
            uploads.mark_urgent(path)
            files, size, deletes = uploads.pending_under(path)
            if not (files or deletes):
                return
            await send({"ok": True, "files": files, "bytes": size, "deletes": deletes})
            await trio.sleep(PROGRESS_INTERVAL)

    # ----------------------------------------------------------------- metrics
    def stats(self) -> dict[str, Any]:
        return {
            "checkpoint_commits_total": self.tracker.commits_total,
            "checkpoint_commit_errors_total": self.tracker.commit_errors_total,
            "protection_refusals_total": self.guard.refused_total,
            "checkpoints_active": len(self.tracker.active),
            "retention": dict(self.retention_stats),
            "tier_move": self.mover.stats(),
        }
