"""The lifecycle as the daemon uses it: one object holding its parts, and the control-socket commands."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import trio

from ..config import Config
from ..store import Store, StoreError
from . import audit
from .catalogue import STATES, Catalogue
from .manifest import OWN_OBJECTS, LifecycleError
from .patterns import Checkpoint, Patterns
from .protect import Guard, protect, unprotect
from .tracker import Tracker
from .stats import SCAN_SECONDS, LifecycleCollector, summarize
from .verify import verify

if TYPE_CHECKING:
    from ..namespace import Namespace
    from ..remote import Remote

__all__ = ["Lifecycle", "LifecycleError", "Guard", "STATES"]

log = logging.getLogger(__name__)

STORE_THREADS = 16  # requests to the bucket in flight for lifecycle work (verify's ranges, HEADs)
PROGRESS_INTERVAL = 0.2
COMMANDS = ("checkpoints", "checkpoint_commit", "verify", "protect", "unprotect", "audit")


class Lifecycle:
    def __init__(self, cfg: Config, ns: "Namespace", store: Store, remote: "Remote") -> None:
        self.cfg, self.ns, self.store, self.remote = cfg, ns, store, remote
        self.keys = ns.keys
        self.patterns = Patterns(cfg.checkpoint_patterns)
        self.limiter = trio.CapacityLimiter(STORE_THREADS)
        self.catalogue = Catalogue(self)
        self.tracker = Tracker(self, cfg.cache_dir)
        self.guard = Guard(ns.journal, self.catalogue)
        self.last_verify: dict[str, Any] | None = None
        self.summary: dict[str, Any] = {}  # the catalogue summarised for the metrics (stats.py)
        remote.on_listing = self.catalogue.learn_listing
        ns.uploads.own_objects = self._own_objects

    def _own_objects(self, path: str) -> list[str]:
        """ckptfs's objects inside directory `path`, deleted with it when it is removed or renamed."""
        ck = self.patterns.checkpoint_of(path)
        return list(OWN_OBJECTS) if ck is not None and ck.path == path else []

    async def io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking store call in a worker thread."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=self.limiter)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.tracker.run)
            if self.patterns.enabled:
                nursery.start_soon(self._scan_loop)
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
        return entries

    def collector(self) -> LifecycleCollector:
        return LifecycleCollector(self)

    # ---------------------------------------------------------------- commands
    async def _checkpoint(self, rel: str) -> Checkpoint:
        """The checkpoint whose directory is mount-relative `rel`; LifecycleError if it is not one."""
        ck = self.patterns.checkpoint_of(rel)
        if ck is None:
            pats = ", ".join(self.patterns.patterns) or "none configured"
            raise LifecycleError(f"{rel or '/'} is not a checkpoint: no directory on its path matches checkpoint_patterns ({pats})")
        if ck.path != rel:
            raise LifecycleError(f"{rel} is inside checkpoint {ck.path}: give the checkpoint's directory")
        ino = await self.remote.resolve(rel)
        row = self.ns.journal.get(ino) if ino is not None else None
        if row is None or not row.is_dir:
            raise LifecycleError(f"{rel}: no such directory in the mount")
        return ck

    async def handle(self, request: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> None:
        """One control-socket request (see control.py); errors become {"ok": false, "error": ...}."""
        cmd = request["cmd"]
        path = str(request.get("path", "")).strip("/")
        try:
            if cmd == "checkpoints":
                if path and await self.remote.resolve(path) is None:
                    raise LifecycleError(f"{path}: no such file or directory in the mount")
                await send({"ok": True, "checkpoints": await self.scan(path)})
            elif cmd == "checkpoint_commit":
                ck = await self._checkpoint(path)
                await self._wait_durable(path, send)
                manifest, wrote = await self.tracker.commit(ck, None, "command", dict(request.get("metadata") or {}))
                await send({"ok": True, "done": True, "written": wrote, "path": ck.path, "step": ck.step,
                            "generation": manifest.generation, "changed": manifest.changed,
                            "files": len(manifest.files), "bytes": manifest.bytes})
            elif cmd == "verify":
                ck = await self._checkpoint(path)
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
                    raise LifecycleError(f"{cmd} needs --reason TEXT: it goes to the audit log")
                ck = await self._checkpoint(path)
                who = dict(request.get("who") or {})
                fn = protect if cmd == "protect" else unprotect
                await send({"ok": True, **await fn(self, ck, reason, who)})
            elif cmd == "audit":
                await send({"ok": True, "events": await audit.read(self, path)})
            else:
                raise LifecycleError(f"unknown command {cmd!r}")
        except LifecycleError as e:
            await send({"ok": False, "error": str(e)})
        except StoreError as e:
            await send({"ok": False, "error": f"{cmd} {path or '/'}: {e}"})

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
        }
