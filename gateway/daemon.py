"""Wiring: check the environment, mount, run FUSE + drainer + control + metrics, stop cleanly.

Start-up checks everything a user can get wrong before mounting, and reports
each as one `UserError` line. Shutdown (SIGTERM, SIGINT, `ckptfs unmount`, or
an external unmount) unmounts first, so no new writes arrive, then keeps
draining up to `shutdown_timeout` (without limit for `unmount --flush`);
whatever is left stays in the journal for the next mount.
"""

from __future__ import annotations

import errno
import functools
import inspect
import logging
import os
import platform
import shutil
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import trio

from .cache import Cache
from .config import Config, fmt_bytes, parse_hostport
from .control import ControlServer
from .drain import Drainer
from .fetch import Fetcher
from .fs import CkptFS
from .fuse.invalidations import Invalidations
from .fuse.kernel import KernelSession, choose_transport
from .fuse.workers import worker_count
from .fuse.libfuse import LibfuseSession
from .fuse.session import FuseSession
from .httpserver import serve as serve_http
from .journal import Journal, JournalError, disk_full_message
from .lifecycle.coldmove import MoveCollector
from .lifecycle.service import Lifecycle
from .lifecycle.usage import UsageCollector
from .metrics import Metrics
from .ui.serve import UiError, check_bind, read_token, require_extra
from .ui.snapshot import Snapshots
from .namespace import Namespace, under
from .namespace.keys import PROBE_NAME_PREFIX
from .preflight import UserError, check_cache_dir, check_cold_extra, check_fuse, check_mountpoint, lock_cache_dir, secure_cache_dir
from .objects import StoreError
from .peering import PeerOptionError, node_name_of
from .peers.membership import live_peer_nodes
from .peers.service import Peers
from .remote import Remote
from .replication.service import Replicator
from .store import Store
from .supervisor import Supervisor, describe, faults_from_environment, journal_failed_for_good, leaf
from .version import VERSION
from .warmup import warm_up

log = logging.getLogger("ckptfs")

STATUS_INTERVAL = 2.0  # seconds between STATUS= updates to systemd
STOP_MARGIN_SECONDS = 30.0  # on top of shutdown_timeout: unmounting, journal sync, exit


# ------------------------------------------------------------------ daemon
class Daemon:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.started = time.time()
        self._stop = trio.Event()
        self._stop_now = trio.Event()  # a second signal: stop draining at once
        self.flush_on_stop = False
        self.fs: CkptFS | None = None  # the filesystem, once running
        self.fuse_transport = ""  # "kernel" or "libfuse", once running
        self.session: FuseSession | None = None  # the mount, once mounted
        self.metrics_port: int | None = None
        self.ui_token: str | None = None  # ui_enabled: the catalogue page's token (ui_token_file)
        self._stopped = trio.Event()  # drained (or gave up): `left` says what stays in the journal
        self.left: dict[str, Any] = {}
        self._stop_reporters = 0
        self.ready = False  # the mount came up (READY sent)
        self.failure: str | None = None  # why the daemon stops on its own (the FUSE session, the journal): exit status 1
        self.supervisor = Supervisor(fatal=journal_failed_for_good, on_fatal=self._fatal, faults=faults_from_environment())
        self.peers: Peers | None = None  # durability = peer (built in prepare), else None
        self.peers_elsewhere: list[str] = []  # durability = local: live nodes of this prefix that run durability = peer

    # ---- wiring, before trio
    def prepare(self) -> None:
        cfg = self.cfg
        check_fuse()
        check_mountpoint(cfg.mountpoint)
        check_cache_dir(cfg.cache_dir, cfg.mountpoint)
        found = set(os.listdir(cfg.cache_dir))
        secure_cache_dir(cfg.cache_dir)
        check_cold_extra(cfg)
        self.ui_token = self._ui_token() if cfg.ui_enabled else None
        self.lock_fd = lock_cache_dir(cfg.cache_dir)
        self.found_in_cache_dir = found  # held by this daemon from here: what a failed start removes is its own
        try:
            self.store = Store(cfg)
            self.store.check()
        except StoreError as e:
            raise UserError(str(e)) from None
        refused = self._probe_key_chars()
        try:
            self.journal = Journal(Path(cfg.cache_dir) / "journal.sqlite3", cfg.bucket, cfg.prefix.strip("/"))
        except JournalError as e:
            raise UserError(str(e)) from None
        if not self.journal.reserved:  # not even the journal's reserve fits: every change could fail from the start
            raise UserError(disk_full_message(cfg.cache_dir))
        try:
            self.cache = Cache(Path(cfg.cache_dir), cfg.cache_capacity, cfg.cache_min_free)
            self.ns = Namespace(cfg, self.journal, self.cache)
            self.ns.keys.refused = refused
            self.ns.recover()
        except OSError as e:  # recovery writes the journal and the cache: a full or failing disk stops it
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise UserError(disk_full_message(cfg.cache_dir)) from None
            raise UserError(f"cache directory {cfg.cache_dir} cannot be read or written ({e.strerror}): "
                            "check that disk (dmesg), then mount again") from None
        self.invalidations = Invalidations(self.ns.merge)  # what a listing found deleted or replaced elsewhere: the kernel forgets it
        self.metrics = Metrics(self.status, peers=cfg.durability == "peer")
        self.ns.uploads.on_durable = self.metrics.time_to_durable.observe
        if cfg.durability == "peer":
            try:
                self.peers = Peers(cfg, self.ns, self.cache, self.store, self.metrics, self.supervisor)
            except PeerOptionError as e:
                raise UserError(str(e)) from None
            except OSError as e:
                raise UserError(f"peer replicas in {cfg.cache_dir}/peers cannot be read or written ({e.strerror}): "
                                "check that disk, then mount again") from None
        self.drainer = Drainer(cfg, self.ns, self.cache, self.store, self.metrics, gate=self.peers.gate if self.peers is not None else None)
        self.fetcher = Fetcher(cfg, self.ns, self.store)
        self.remote = Remote(self.ns, self.store, cfg)
        self.lifecycle = Lifecycle(cfg, self.ns, self.store, self.remote)
        self.metrics.registry.register(self.lifecycle.collector())
        self.metrics.registry.register(UsageCollector(self.lifecycle))
        self.metrics.registry.register(MoveCollector(self.lifecycle.mover))
        if self.peers is not None:  # a takeover's checkpoints commit as if their writer had finished
            self.peers.commit_taken_over_with(self.lifecycle.tracker.commit_taken_over)
            self.peers.on_checkpoints.append(self.lifecycle.tracker.taken_over)
            self.peers.fence(self.drainer.fence)  # the drain's writes and deletes conditional (drainfence.py)
        self.replicator = Replicator(cfg, self.lifecycle)
        if self.replicator.targets:
            self.metrics.registry.register(self.replicator.collector())
        self.control = ControlServer(cfg.control_socket, self)

    def _probe_key_chars(self) -> dict[str, str]:
        """Learn once which characters the store changes in keys; names with them are refused (EINVAL)."""
        try:
            refused = self.store.probe_key_chars(self.cfg.key_prefix, f"{PROBE_NAME_PREFIX}{os.urandom(6).hex()}/")
        except StoreError as e:
            log.warning("could not check which characters the object store keeps in keys (%s): refusing names with '\\'", e)
            return {"\\": "?"}
        if refused:
            shown = ", ".join(f"{c!r} -> {k!r}" for c, k in refused.items())
            log.info("the object store does not keep these characters in keys as written (%s): names with them are refused (EINVAL)", shown)
        return refused

    # ---- control API
    def status(self) -> dict[str, Any]:
        if self.fs is not None:
            self.fs.sync_passthrough_all()  # what passthrough writers wrote so far counts as dirty and cached
        s: dict[str, Any] = dict(self.ns.stats())
        now = time.time()
        rate = self.drainer.throughput.rate()
        in_bucket = min(s["dirty_bytes"], self.bytes_in_bucket(""))
        left = s["dirty_bytes"] - in_bucket
        errors = [(self.drainer.last_error, self.drainer.last_error_at), (self.fetcher.last_error, self.fetcher.last_error_at)]
        if self.peers is not None:  # a write refused, or acknowledged without its peer copies
            errors.append((self.peers.sender.last_error, self.peers.sender.last_error_at))
        last_error, last_error_at = max(errors, key=lambda e: -1.0 if e[1] is None else e[1])  # the latest
        s.update(
            version=VERSION,
            pid=os.getpid(),
            mountpoint=os.path.abspath(self.cfg.mountpoint),
            source=f"s3://{self.cfg.bucket}/{self.cfg.prefix}".rstrip("/"),
            cache_dir=os.path.abspath(self.cfg.cache_dir),
            cache_used_bytes=self.cache.used_bytes,
            cache_capacity_bytes=self.cache.capacity_bytes,
            uploaded_bytes_total=int(self.metrics.uploaded_bytes._value.get()),
            uploaded_files_total=int(self.metrics.uploaded_files._value.get()),
            upload_errors_total=int(self.metrics.errors_total()),
            last_error=last_error,
            last_error_at=last_error_at,
            last_error_age_seconds=None if last_error_at is None else round(max(0.0, now - last_error_at), 1),
            parts_in_flight=int(self.metrics.parts_in_flight._value.get()),
            dirty_bytes_in_bucket=in_bucket,
            upload_bytes_per_second=round(rate),
            upload_rate_window_seconds=self.drainer.throughput.window,
            drain_eta_seconds=0.0 if not left else round(left / rate, 1) if rate else None,
            fetched_bytes_total=self.fetcher.fetched_bytes_total,
            fetched_files_total=self.fetcher.fetched_files_total,
            read_errors_total=self.fetcher.read_errors_total,
            archived_reads_refused_total=self.fetcher.archived_refusals_total,
            **self.remote.stats(),
            checksum_mismatches_total=self.fetcher.checksum_mismatches_total,
            fuse_transport=self.fuse_transport,
            passthrough=bool(self.session is not None and self.session.passthrough),
            passthrough_handles=self.fs.passthrough_handles if self.fs is not None else 0,
            fuse_protocol=self.session.protocol if self.session is not None else None,
            fuse_workers=self.session.workers if self.session is not None else 0,
            **self.lifecycle.stats(),
            encryption=self.store.enc.describe(),
            deletes_not_permitted_total=self.drainer.deletes_not_permitted_total,
            shutdown_timeout=self.cfg.shutdown_timeout,
            open_for_writing=self.open_for_writing(),
            uptime_seconds=round(time.time() - self.started, 1),
            services=self.supervisor.status(),
            durability=self.cfg.durability,
            node=node_name_of(self.cfg),
            **peer_fields(peer_status(self.peers), s["dirty_bytes"], s["oldest_close_age_seconds"]),
            peer_nodes_elsewhere=self.peers_elsewhere,
        )
        return s

    def exists(self, path: str) -> bool:
        return self.journal.resolve(path) is not None

    def flush_progress(self, path: str) -> dict[str, int]:
        self.ns.uploads.mark_urgent(path)
        files, size, deletes = self.ns.uploads.pending_under(path)
        return {"files": files, "bytes": size, "deletes": deletes, "uploaded_bytes": min(size, self.bytes_in_bucket(path)),
                "upload_bytes_per_second": round(self.drainer.throughput.rate())}

    def bytes_in_bucket(self, path: str) -> int:
        """Bytes of files at or under `path` whose upload is running and whose parts are already in the bucket."""
        total = 0
        for ino, sent in self.drainer.sent.items():
            p = self.journal.path_of(ino)
            if p is not None and under(path, p):
                total += sent
        return total

    async def warmup(self, paths: list[str], progress: Callable[[dict[str, Any]], Awaitable[None]]) -> list[tuple[str, str]]:
        """Read files (or whole trees) from the bucket into the cache; returns (path, error) of those that failed."""
        return await warm_up(self.journal, self.remote, self.fetcher, paths, progress)

    def evict(self, path: str) -> dict[str, int]:
        files, size, skipped = self.ns.space.evict_under(path)
        return {"files": files, "bytes": size, "skipped": skipped}

    def open_for_writing(self) -> list[str]:
        """Paths of files some process has open for writing now (an unmount would cut them off)."""
        out = []
        for ino, live in self.ns.files.live.items():
            if live.writers > 0:
                out.append(self.journal.path_of(ino) or f"(deleted file, inode {ino})")
        return sorted(out)

    async def stopped(self) -> dict[str, Any]:
        """Wait until the daemon has unmounted and drained what it could; what stays in the journal.

        The caller reports it (the control socket's `unmount` reply), then calls `stop_reported`.
        """
        self._stop_reporters += 1
        await self._stopped.wait()
        return self.left

    def stop_reported(self) -> None:
        self._stop_reporters -= 1

    def request_stop(self, flush: bool) -> None:
        self.flush_on_stop = self.flush_on_stop or flush
        self._stop.set()

    def inject_fault(self, service: str) -> None:
        """Tests only (CKPTFS_TEST_FAULTS, supervisor.py): make a running service fail. KeyError where not enabled."""
        self.supervisor.inject_fault(service)

    # ---- failures that stop the daemon (supervisor.py restarts every other one)
    def _fatal(self, service: str, why: str) -> None:
        """The FUSE session failed, or the journal for good: stop cleanly (see `run`) and exit with status 1."""
        if self.failure is None:
            self.failure = why if service != "fuse" else f"the FUSE session failed ({why.removeprefix('fuse failed: ')})"
        if service != "fuse":
            self._stop_now.set()  # nothing to drain with a journal that cannot record it
        self._stop.set()

    # ---- running
    def _ui_token(self) -> str | None:
        """The catalogue page's token (ui_token_file), checked before anything starts: one line if it cannot serve."""
        cfg = self.cfg
        host, _ = parse_hostport(cfg.metrics_addr)
        try:
            require_extra()
            token = read_token(cfg.ui_token_file) if cfg.ui_token_file else None
            check_bind(host, token, "metrics_addr")
        except UiError as e:
            raise UserError(f"ui_enabled: {e}") from None
        return token

    async def _serve_metrics(self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """/metrics on metrics_addr, and with ui_enabled the catalogue page under /ui (it asks the control dispatch itself).

        An address it cannot listen on raises the bare OSError, for run's one line."""
        read_timeout = self.cfg.metrics_read_timeout
        if not self.cfg.ui_enabled:
            await serve_http(self.metrics.app(), host, port, read_timeout=read_timeout, task_status=task_status)
            return
        from .ui.app import UI_PREFIX, CatalogueApp  # here: jinja2 is the 'ui' extra, checked by prepare

        snapshots = Snapshots(self.control.ask, "")
        page = CatalogueApp(snapshots, self.cfg.mountpoint, self.ui_token, prefix=UI_PREFIX)
        refused: OSError | None = None  # raised bare, after the nursery (not in its group)
        async with trio.open_nursery() as nursery:
            try:
                bound = await nursery.start(functools.partial(serve_http, self.metrics.app(page), host, port, read_timeout=read_timeout))
            except OSError as e:
                refused = e
                nursery.cancel_scope.cancel()
            else:
                await nursery.start(snapshots.run)
                task_status.started(bound)
        if refused is not None:
            raise refused

    async def run(self, ready_fd: int | None = None) -> None:
        """Every service under the supervisor (restarted after an unexpected error); the FUSE session `critical`.

        A failure of the FUSE session or of the journal for good (`_fatal`) takes the same stop as a signal:
        session stopped, open files persisted, the mount detached; then one line says why (exit status 1)."""
        cfg = self.cfg
        fs = self.fs = CkptFS(self.ns, self.fetcher, self.remote, str(cfg.control_socket.resolve()), self.lifecycle.guard)
        fs.checkpoint_states = self.lifecycle  # user.ckptfs.state of a checkpoint directory
        fs.invalidations = self.invalidations  # an OPENDIR waits for what its listing made the kernel forget
        if self.peers is not None:
            fs.peers = self.peers  # fsync and a writer's close wait for the peers' copies
            self.peers.sender.passthrough_inos = fs.passthrough_writers
            self.peers.sender.sync_passthrough = fs.sync_passthrough_all  # flush --level replicated: the kernel's bytes so far
            # a checkpoint directory is `replicated` once every file of it not yet durable is on peers' disks
            self.lifecycle.tracker.replicated = self.peers.is_replicated
        self.fuse_transport = choose_transport(cfg.fuse_transport)
        supervise, critical = self.supervisor.supervise, self.supervisor.critical
        async with trio.open_nursery() as nursery:
            await nursery.start(supervise, "control", self.control.serve)
            if cfg.metrics_addr:
                host, port = parse_hostport(cfg.metrics_addr)
                try:
                    self.metrics_port = await nursery.start(supervise, "metrics", self._serve_metrics, host, port)
                except OSError as e:
                    raise UserError(f"cannot listen for metrics on {cfg.metrics_addr}: {e.strerror}: choose another --metrics-addr") from None
            await nursery.start(supervise, "fetcher", self.fetcher.run)
            await nursery.start(supervise, "listings", self.remote.run)
            if self.peers is not None:  # before the mount: the first fsync finds its peers chosen
                try:
                    await nursery.start(self.peers.run)  # each part supervised inside
                except OSError as e:
                    raise UserError(f"cannot listen for peers on {cfg.peer_addr}: {e.strerror}: choose another peer_addr") from None
            session = self.session = self._mount(fs)
            await nursery.start(critical, "fuse", self._serve_fuse, session)
            await nursery.start(supervise, "invalidations", self.invalidations.run, session)
            if self.fuse_transport == "kernel":
                if session.passthrough:
                    log.info("FUSE: the protocol spoken on /dev/fuse, with passthrough")
                else:
                    log.warning("FUSE: the protocol spoken on /dev/fuse, without passthrough (%s): every byte is copied by the daemon",
                                session.passthrough_error)
            await nursery.start(supervise, "drainer", self.drainer.run)
            await nursery.start(supervise, "lifecycle", self.lifecycle.run)
            nursery.start_soon(self._signals)
            # ready only once the mount answers a request
            await trio.to_thread.run_sync(os.stat, cfg.mountpoint)
            # in a thread too: a stat of the mount from this thread deadlocks (the FUSE loop runs here) once the
            # kernel's cached attributes (1 s) expired between the two stats, as on a loaded machine
            await trio.to_thread.run_sync(set_kernel_read_ahead, cfg.mountpoint, cfg.kernel_read_ahead)
            await nursery.start(supervise, "replication", self.replicator.run)
            if self.peers is None:
                nursery.start_soon(local_among_peers, self)
            log.info("mounted s3://%s/%s at %s (cache %s)", cfg.bucket, cfg.prefix, cfg.mountpoint, cfg.cache_dir)
            self.ready = True
            if ready_fd is not None:
                os.write(ready_fd, b"READY\n")
                os.close(ready_fd)
            source = f"s3://{cfg.bucket}/{cfg.prefix}".rstrip("/")
            notify_systemd(f"READY=1\nSTATUS=mounted {source} at {cfg.mountpoint}".encode())
            if os.environ.get("NOTIFY_SOCKET"):
                nursery.start_soon(report_status, self)
            await self._stop.wait()
            # the stop may take up to shutdown_timeout: tell systemd, whatever its TimeoutStopSec says
            extend_us = int((self.cfg.shutdown_timeout + STOP_MARGIN_SECONDS) * 1_000_000)
            notify_systemd(f"STOPPING=1\nSTATUS=unmounting {cfg.mountpoint}\nEXTEND_TIMEOUT_USEC={extend_us}".encode())
            log.info("stopping: unmounting %s", cfg.mountpoint)
            # before the session closes its connection: an invalidation in flight writes to it
            await self._stop_step("stop the kernel invalidations", self.invalidations.stop)
            await self._stop_step("stop the FUSE session", session.stop)
            await self._stop_step("record what passthrough writers wrote", fs.sync_passthrough_all)
            # handles still open at unmount will never be released to us
            await self._stop_step("record the files still open", self.ns.files.persist_all)
            await self._drain_before_exit()
            self.left = {"cache_dir": os.path.abspath(cfg.cache_dir)}
            await self._stop_step("count what is left", self._count_left)
            if self.peers is not None and self.failure is None:  # with nothing undrained, its record says left
                await self._stop_step("leave the cluster", self.peers.leave)
            self._stopped.set()
            with trio.move_on_after(5):  # let `ckptfs unmount` hear what stays in the journal
                while self._stop_reporters:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        # blocking is fine here: unmounted, and nothing else runs on this thread any more
        await self._stop_step("sync the journal", self.journal.sync)
        if self.failure is not None:
            left = self.left
            log.error("ckptfs stopped: %s; %s is unmounted; %s files (%s bytes) not yet in the bucket stay in %s for the next mount",
                      self.failure, cfg.mountpoint, left.get("left_files", "?"), left.get("left_bytes", "?"), cfg.cache_dir)
        else:
            left = self.ns.stats()
            if left["dirty_files"] or left["pending_deletes"]:
                log.warning("stopped with %d files (%d bytes) and %d deletions not yet in the bucket; the next mount of %s uploads them",
                            left["dirty_files"], left["dirty_bytes"], left["pending_deletes"], cfg.cache_dir)
            else:
                log.info("stopped; everything is durable")
        await self._stop_step("close the journal", self.journal.close)

    def _count_left(self) -> None:
        s = self.ns.stats()
        self.left.update(left_files=s["dirty_files"], left_bytes=s["dirty_bytes"], left_deletes=s["pending_deletes"] + s["pending_markers"])

    async def _stop_step(self, what: str, step: Callable[[], Any]) -> None:
        """One step of the stop; after a failure (a journal that cannot be written) the next steps still run."""
        try:
            result = step()
            if inspect.isawaitable(result):
                await result
        except Exception as e:  # noqa: BLE001 - the mount must be detached whatever failed before
            if self.failure is None:
                log.error("stopping: could not %s: %s", what, describe(e), exc_info=leaf(e))
            else:
                log.warning("stopping: could not %s: %s", what, describe(e))

    def unbind_if_never_ready(self) -> None:
        """A start that failed (a busy metrics port, a wrong bucket, a refused mount) leaves the cache directory as it
        found it: a journal this start created and that holds nothing to upload is removed, so the directory is not
        bound to this bucket and prefix by a mount that never was, and so is every other entry this start created
        (its lock, data/, the control socket). What was there before is left alone, and nothing at all is removed
        unless this daemon held the directory's lock: another daemon's files are not ours."""
        found: set[str] | None = getattr(self, "found_in_cache_dir", None)  # None: the lock was never ours
        if self.ready or found is None:
            return
        journal: Journal | None = getattr(self, "journal", None)  # None: the start failed before opening it
        if journal is not None and journal.bound_now:
            if journal.holds_work():
                return  # never so for a start that never mounted; but then the journal and its data stay together
            try:
                journal.discard()
            except (OSError, sqlite3.Error) as e:
                log.warning("could not remove the journal of the failed start %s: %s", journal.path, e)
                return
        root = Path(self.cfg.cache_dir)
        for name in sorted(set(os.listdir(root)) - found):
            path = root / name
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)  # data/: created by this start, which wrote no file into it for anyone
                else:
                    path.unlink()
            except OSError as e:
                log.warning("could not remove %s, created by the failed start: %s", path, e.strerror)

    def _mount(self, fs: CkptFS) -> FuseSession:
        """Mount with the chosen transport; with `auto`, a kernel mount(2) refused (no
        CAP_SYS_ADMIN, say in a container) falls back to libfuse."""
        cfg = self.cfg
        if self.fuse_transport == "kernel":
            kernel = KernelSession(fs, cfg.mountpoint, source="ckptfs", fstype="fuse.ckptfs", passthrough=cfg.fuse_passthrough,
                                   workers=worker_count(cfg.fuse_workers), auto_workers=cfg.fuse_workers == "auto",
                                   allow_other=cfg.allow_other, read_only=cfg.read_only, probe_dir=str(self.cache.data_dir))
            try:
                kernel.mount()
                return kernel
            except OSError as e:
                if cfg.fuse_transport != "auto" or e.errno not in (errno.EPERM, errno.EACCES):
                    raise UserError(f"cannot mount {cfg.mountpoint} with fuse_transport=kernel: {e.strerror} "
                                    "(it needs root; use -o fuse_transport=libfuse)") from None
                log.warning("FUSE: cannot mount /dev/fuse directly (%s): using libfuse", e.strerror)
                self.fuse_transport = "libfuse"
        libfuse = LibfuseSession(fs, cfg.mountpoint, allow_other=cfg.allow_other, read_only=cfg.read_only)
        try:
            libfuse.mount()
        except RuntimeError as e:  # pyfuse3 could not mount; raised here, inside the nursery, it must be a UserError to stay one line
            raise UserError(f"FUSE mount of {cfg.mountpoint} failed ({e}): see the log lines above") from None
        return libfuse

    async def _serve_fuse(self, session: FuseSession, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the mount; an external unmount (fusermount3 -u, umount) ends it and stops the daemon too."""
        try:
            await session.serve(task_status=task_status)
        finally:
            self._stop.set()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if self._stop.is_set():
                    log.warning("received %s again: stopping without waiting for the drain", signal.Signals(signum).name)
                    self._stop_now.set()
                    continue
                log.info("received %s: unmounting, then draining for up to %gs", signal.Signals(signum).name, self.cfg.shutdown_timeout)
                self.request_stop(flush=False)

    async def _drain_before_exit(self) -> None:
        deadline = None if self.flush_on_stop else trio.current_time() + self.cfg.shutdown_timeout
        with trio.move_on_at(deadline if deadline is not None else float("inf")):
            while not self._stop_now.is_set():
                s = self.ns.stats()
                if not s["dirty_files"] and not s["pending_deletes"] and not s["pending_markers"] and self.drainer.idle():
                    return
                self.ns.uploads.mark_urgent("")
                with trio.move_on_after(0.1):
                    await self._stop_now.wait()


async def local_among_peers(daemon: "Daemon") -> None:
    """durability = local on a prefix where live nodes run durability = peer: said once at start (issue 43: their
    status said `no peer known`, this one nothing), since this node's writes are not replicated as theirs are."""
    try:
        daemon.peers_elsewhere = await live_peer_nodes(daemon.store, daemon.ns.keys.of)  # type: ignore[arg-type]
    except StoreError as e:
        log.debug("could not read the node records of this prefix: %s", e)
        return
    if daemon.peers_elsewhere:
        log.warning("this mount has durability = local while %s on this prefix run durability = peer: its files "
                    "are on this node alone until they drain; set durability = peer (docs/peers.md) to replicate them too",
                    ", ".join(daemon.peers_elsewhere))


async def report_status(daemon: "Daemon") -> None:
    """Keep `systemctl status` saying how far behind the drain is (STATUS= every few seconds)."""
    while True:
        s = daemon.ns.stats()
        what = f"{s['dirty_files']} files ({fmt_bytes(s['dirty_bytes'])}) not yet in the bucket"
        if daemon._stop.is_set():
            notify_systemd(f"STATUS=stopping: draining, {what}".encode())
        else:
            notify_systemd(f"STATUS={what}, drain lag {s['oldest_dirty_age_seconds']:.0f}s, "
                           f"cache {fmt_bytes(daemon.cache.used_bytes)} of {fmt_bytes(daemon.cache.capacity_bytes)}".encode())
        await trio.sleep(STATUS_INTERVAL)


def peer_status(peers: Any) -> dict[str, Any] | None:
    """`Peers.status()` (None with durability = local). Its failure (a bug) must not fail `ckptfs status` and every
    scrape with it: the rest is answered, this node's peer state says `unknown`, the log has the traceback."""
    if peers is None:
        return None
    try:
        return dict(peers.status())
    except Exception:  # noqa: BLE001 - reported as a state, never a failed status
        log.exception("could not read the peers' status")
        return {"state": "unknown", "peers": []}


def peer_fields(peers: dict[str, Any] | None, dirty_bytes: int, oldest_close_age: float) -> dict[str, Any]:
    """What `ckptfs status` (and the metrics) say of peer durability: the peers and their state, this node's own
    (`live`, `fenced`, `reconciling`), and the single-copy window, from `Peers.status()`. With durability = local
    (`peers` None) no peer holds anything: every byte not yet durable is single-copy, since its file's last close."""
    if peers is None:
        return {"peers": [], "peer_state": None, "peer_copies_uncounted": None, "peer_holders": [], "membership": None, "peer_addr": None, "failure_domain": None,
                "peer_replica_bytes": 0, "peer_conditional_writes": None, "peer_conditional_deletes": None,
                "single_copy_bytes": dirty_bytes, "single_copy_oldest_age_seconds": oldest_close_age,
                "peer_replicated_bytes_total": 0, "peer_degraded_writes_total": 0, "peer_takeovers_total": 0,
                "peer_replicas_refused_total": 0, "peer_handshake_refused_total": 0, "peer_unclaimed_nodes": [],
                "peer_owners_redirected_total": 0,
                "peer_refused_writes_total": 0, "peer_keys_refused_total": 0}
    return {
        "peers": list(peers.get("peers") or []),
        "peer_state": peers.get("state"),
        "peer_copies_uncounted": peers.get("copies_uncounted"),  # why this node's writes count no peer copies (None: they do)
        "peer_holders": list(peers.get("holders") or []),  # the nodes this node's record lists: only they may claim it
        # the node records' backend, how old this node's view of them is, and what reading and writing them cost
        "membership": peers.get("membership"),
        "peer_addr": peers.get("peer_addr"),
        "failure_domain": peers.get("failure_domain"),
        "peer_replica_bytes": peers.get("replica_bytes_held", 0),
        # whether the store refuses a stale conditional write (the fence of takeovers and of the drain); None: not known yet
        "peer_conditional_writes": peers.get("conditional_writes"),
        "peer_conditional_deletes": peers.get("conditional_deletes"),
        # unknown (the peers' status failed): as without peers, the worst case
        "single_copy_bytes": peers.get("single_copy_bytes", dirty_bytes),
        "single_copy_oldest_age_seconds": peers.get("single_copy_oldest_age_seconds", oldest_close_age),
        "peer_replicated_bytes_total": peers.get("replicated_bytes", 0),
        "peer_degraded_writes_total": peers.get("degraded_writes", 0),
        "peer_refused_writes_total": peers.get("refused_writes", 0),
        "peer_keys_refused_total": peers.get("keys_refused", 0),
        "peer_takeovers_total": peers.get("takeovers", 0),
        "peer_replicas_refused_total": peers.get("replicas_refused", 0),
        "peer_handshake_refused_total": peers.get("handshake_refused", 0),
        "peer_owners_redirected_total": peers.get("owners_redirected", 0),  # its share of owners taken: spread.py
        # dead for 2 x peer_lease_ttl and claimed by nobody: a takeover that cannot happen (CkptfsPeerTakeoverOverdue)
        "peer_unclaimed_nodes": list(peers.get("unclaimed_nodes") or []),
    }


def set_kernel_read_ahead(mountpoint: str, size: int) -> None:
    """Raise the mount's read-ahead (the kernel starts FUSE mounts at 128 KiB): fewer, larger read requests."""
    if not size:
        return
    st = os.stat(mountpoint)
    path = f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(max(4, size // 1024)))
    except OSError as e:
        log.info("kernel read-ahead left at its default (%s: %s; needs root)", path, e.strerror)


def notify_systemd(message: bytes) -> None:
    """sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET, if set."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    import socket

    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(message)
    except OSError as e:
        log.warning("could not notify systemd: %s", e)


def run_daemon(cfg: Config, ready_fd: int | None = None) -> int:
    """Foreground entry point. Returns the exit status."""
    starting = ("ckptfs %s starting (pid %d, python %s)", VERSION, os.getpid(), platform.python_version())
    if ready_fd is not None:
        log.info(*starting)  # --daemon: the log file's first line of this start names the version
    daemon = Daemon(cfg)
    try:
        daemon.prepare()
        if ready_fd is None:
            log.info(*starting)  # in the foreground only once the checks passed: a user error stays one line
        try:
            trio.run(daemon.run, ready_fd)
            if daemon.failure is not None:
                return 1  # the FUSE session or the journal failed: the last log line says why
        except BaseExceptionGroup as group:
            user_errors = group.subgroup((UserError, PeerOptionError))  # a service that could not start: one line
            if user_errors is None:
                raise
            first = user_errors.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise UserError(str(first)) from None
    except UserError as e:
        log.error("%s", e)
        daemon.unbind_if_never_ready()
        if ready_fd is not None:
            try:
                os.write(ready_fd, f"ERROR {e}\n".encode())
            except OSError:
                pass
        return 1
    return 0
