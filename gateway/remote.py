"""The bucket's side of the namespace: directory listings, cached for `metadata_ttl`.

Every node mounts the same bucket, so the tree a node shows is the bucket
listing overlaid by its own journal (see `namespace/merge.py` for who
wins). A directory is listed again when a lookup or readdir touches it and its
last listing is older than the TTL; concurrent lookups in one directory share
one listing. Before a directory is renamed or removed its whole subtree is
listed (one recursive listing), so that objects this node never looked at move
or block the removal too.

A slow or hung store never holds a request for long. A request waits for a
listing at most `listing_timeout`; after that (or at once if the listing
failed, or while the store is known not to answer) it is answered from what
the node knows, and the directory counts as *stale*. Its listing goes on in
the background (one task per directory, in the nursery `run` owns), retried
with exponential backoff until one succeeds; only then is the directory
fresh again. A stale directory is never waited for a second time. The store
counts as answering again as soon as any request to it succeeds (an upload, a
read: the store stamps `answered_at`), not only when a listing of this module
does.

A rename or rmdir of a directory whose recursive listing did not answer in time
goes ahead on what the node knows if that is enough: every directory concerned
was listed by this node at least once, or holds nothing the bucket has (made
here and not uploaded). Otherwise it fails with ETIMEDOUT: objects this node
never saw could be left behind.
"""

from __future__ import annotations

import errno
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import trio

from . import threads
from .config import Config
from .journal import DURABLE, ROOT_INODE
from .namespace import Namespace
from .namespace.uploads import RECENT_DELETE_SECONDS
from .objects import Listing, RemoteObject, StoreError
from .storeapi import ObjectStore

log = logging.getLogger(__name__)

# A directory in use is listed again in the background once its listing is this share of the TTL old, so a
# lookup seldom finds it expired and waits (a writer creating files one after another waited for a listing of
# the directory every `metadata_ttl`, longer as it filled). Listings stay at most `metadata_ttl` old, as before.
REFRESH_AHEAD = 0.8
LISTING_THREADS = 8  # listings in flight at once; their own threads, so uploads never starve them (nor they fsync)


@dataclass
class _Job:
    """The background listing of one directory: attempts until one succeeds (or the directory is gone)."""

    attempt_done: trio.Event = field(default_factory=trio.Event)  # set when the current attempt ends, then replaced
    failures: int = 0
    progress_at: float = field(default_factory=time.monotonic)  # when the attempt started or last got a page

    def touch(self) -> None:  # called from the listing's thread: a plain float store
        self.progress_at = time.monotonic()


class Remote:
    def __init__(self, ns: Namespace, store: ObjectStore, cfg: Config) -> None:
        self.ns, self.store = ns, store
        self.ttl = cfg.metadata_ttl
        self.bound = cfg.listing_timeout or math.inf
        self.max_backoff = cfg.retry_max_backoff
        self.listed_at: dict[int, float] = {}  # directory inode -> monotonic start of its last successful listing
        self.stale: dict[int, float] = {}  # directory inode -> since when requests get it without a listing (epoch)
        # monotonic start of the latest request that failed or timed out, the store having answered nothing since
        self.down_since: float | None = None
        self._jobs: dict[int, _Job] = {}
        self._threads = trio.CapacityLimiter(LISTING_THREADS)
        self._nursery: trio.Nursery | None = None
        self.listings_total = 0
        self.listing_errors_total = 0
        self.listing_timeouts_total = 0
        # told every directory listing merged (mount-relative path, listing): the lifecycle learns protection from it
        self.on_listing: Callable[[str, Listing], None] = lambda path, listing: None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the background listings until cancelled (the daemon stopping abandons those in flight)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None  # closed: until the supervisor restarts this, requests answer from what the node knows

    def stats(self) -> dict[str, float]:
        return {
            "listings_total": self.listings_total,
            "listing_errors_total": self.listing_errors_total,
            "listing_timeouts_total": self.listing_timeouts_total,
            "stale_directories": len(self.stale),
        }

    def _fresh(self, ino: int, since: float) -> bool:
        """Listed successfully by a listing that started less than the TTL before `since` (monotonic)."""
        at = self.listed_at.get(ino)
        return at is not None and since - at < self.ttl

    def _prefix(self, ino: int) -> str | None:
        path = self.ns.journal.path_of(ino)
        if path is None:
            return None
        return self.ns.keys.of(path + "/" if path else "")

    def _store_down(self, started: float) -> None:
        """A request that started at `started` (monotonic) failed or timed out: the store does not answer, unless it
        answered something since that request started (a request sent into an outage that ended: old news)."""
        if started < self.store.answered_at:
            return
        self.down_since = started if self.down_since is None else max(self.down_since, started)

    def store_down(self) -> bool:
        """True while the store is known not to answer (requests then get what the node knows without waiting).

        Cleared by any request the store answered after the last failure began, whoever sent it (an upload, a
        read, a listing: the store stamps `answered_at`), not only by a listing of this module: a background
        listing waiting out its backoff must not keep the outage alive for an rmdir after a flush succeeded."""
        if self.down_since is not None and self.store.answered_at > self.down_since:
            self.down_since = None
        return self.down_since is not None

    def _mark_stale(self, ino: int, why: str) -> None:
        if ino not in self.stale:
            self.stale[ino] = time.time()
            log.warning("listing %s: %s; showing what this node knows until a listing succeeds (retried in the background)",
                        self._prefix(ino) or "/", why)

    async def _list(self, prefix: str, recursive: bool, on_page: Callable[[], None]) -> Listing:
        return await threads.call(lambda: self.store.list(prefix, recursive=recursive, on_page=on_page), limiter=self._threads)

    # ------------------------------------------------------------ one directory
    async def refresh(self, ino: int) -> None:
        """Bring directory `ino` up to date unless its listing is fresh; waits at most `listing_timeout`."""
        row = self.ns.journal.get(ino)
        arrived = time.monotonic()
        if row is None or not row.is_dir:
            return
        if self._fresh(ino, arrived):
            if self._nursery is not None and ino not in self._jobs and ino not in self.stale and not self.store_down() \
                    and arrived - self.listed_at[ino] >= REFRESH_AHEAD * self.ttl:
                self._start(ino)  # in the background: this request is answered from the listing still fresh
            return
        while not self._fresh(ino, arrived):
            job = self._jobs.get(ino) or self._start(ino)
            if job is None:
                return  # the directory is gone
            if ino in self.stale:
                return  # waited for once already: its listing goes on in the background
            if self.store_down():
                self._mark_stale(ino, "the object store is not answering listings")
                return
            # a listing that keeps answering (page after page of a large directory) is waited for
            deadline = max(arrived, job.progress_at) + self.bound
            # never negative (trio refuses it): the deadline may be past already, after an earlier round or a busy loop
            with trio.move_on_after(max(0.0, deadline - time.monotonic())):
                await job.attempt_done.wait()
                continue  # succeeded (fresh), failed (stale), or started before this request: look again
            if time.monotonic() - job.progress_at < self.bound:
                continue
            self.listing_timeouts_total += 1
            self._store_down(job.progress_at)
            self._mark_stale(ino, f"no answer within listing_timeout ({self.bound:g}s)")
            return

    def _start(self, ino: int) -> _Job | None:
        if self._prefix(ino) is None:
            return None
        if self._nursery is None:  # the listings service is restarting after an unexpected error (supervisor.py)
            self._mark_stale(ino, "the listing service is restarting after an error")
            return None
        job = self._jobs[ino] = _Job()
        self._nursery.start_soon(self._list_until_listed, ino, job)
        return job

    async def _list_until_listed(self, ino: int, job: _Job) -> None:
        try:
            while True:
                row = self.ns.journal.get(ino)
                prefix = self._prefix(ino)
                if row is None or not row.is_dir or prefix is None:
                    self.stale.pop(ino, None)
                    return
                started_wall, started_mono = time.time(), time.monotonic()
                job.progress_at = started_mono
                try:
                    listing = await self._list(prefix, False, job.touch)
                except StoreError as e:
                    self.listing_errors_total += 1
                    job.failures += 1
                    self._store_down(started_mono)
                    self._mark_stale(ino, f"failed: {e}")
                    delay = min(self.max_backoff, 0.5 * 2 ** min(job.failures, 20)) * random.uniform(0.5, 1.0)
                    log.debug("listing %s failed (%s): retry in %.1fs", prefix or "/", e, delay)
                    job.attempt_done.set()
                    job.attempt_done = trio.Event()
                    await trio.sleep(delay)
                    continue
                if self._prefix(ino) != prefix or time.time() - started_wall > RECENT_DELETE_SECONDS:
                    continue  # renamed meanwhile, or too old to tell what was deleted since: list again
                try:
                    self.ns.merge.merge(ino, started_wall, listing)
                except OSError as e:  # the journal cannot record it (a full or failing cache disk): list again later
                    job.failures += 1
                    self._mark_stale(ino, f"the listing could not be recorded ({e.strerror})")
                    job.attempt_done.set()
                    job.attempt_done = trio.Event()
                    await trio.sleep(min(self.max_backoff, 0.5 * 2 ** min(job.failures, 20)) * random.uniform(0.5, 1.0))
                    continue
                self.listings_total += 1
                self.listed_at[ino] = started_mono
                self.on_listing(self.ns.keys.path(prefix).rstrip("/"), listing)
                self.down_since = None
                since = self.stale.pop(ino, None)
                if since is not None:
                    log.info("listing %s answered after %.0fs: the directory is up to date again", prefix or "/", time.time() - since)
                return
        finally:
            job.attempt_done.set()
            if self._jobs.get(ino) is job:
                del self._jobs[ino]

    # ------------------------------------------------------------ a whole tree
    async def refresh_tree(self, ino: int, op: str | None = None) -> None:
        """Bring every object below directory `ino` into the journal (one recursive listing).

        `op` ("rmdir" or "rename") bounds the wait by `listing_timeout`; if the listing does not answer
        in time, the operation goes ahead on what this node knows when that is enough, and otherwise
        raises ETIMEDOUT. Without `op` (warmup) it waits as long as the store takes.
        """
        prefix = self._prefix(ino)
        if prefix is None:
            return
        if op is None or not self.store_down():
            if await self._list_tree(ino, prefix, self.bound if op else math.inf):
                return
        if op is None:
            return
        if not self._known(ino, whole=op == "rename"):
            log.warning("%s of %s refused (ETIMEDOUT): the object store did not answer its listing and this node never "
                        "listed it, so objects under it may be unknown here; try again once the store answers", op, prefix)
            raise OSError(errno.ETIMEDOUT, f"{op}: the object store did not answer")
        log.info("%s of %s: the object store did not answer its listing; going ahead on what this node listed before", op, prefix)

    async def _list_tree(self, ino: int, prefix: str, bound: float) -> bool:
        started_wall, started_mono = time.time(), time.monotonic()
        try:
            listing = await self._list_bounded(prefix, bound)
        except StoreError as e:
            self.listing_errors_total += 1
            self._store_down(started_mono)
            log.warning("listing %s failed, showing what this node knows: %s", prefix or "/", e)
            return False
        if listing is None:
            self.listing_timeouts_total += 1
            self._store_down(started_mono)
            log.warning("listing %s: no answer within listing_timeout (%gs)", prefix or "/", bound)
            return False
        if self._prefix(ino) != prefix:
            return False  # moved while it was listed: the listing is of another name
        self.listings_total += 1
        self.down_since = None
        # split the flat listing into one listing per directory, parents first
        per_dir: dict[str, Listing] = {"": Listing([], [], listing.marker)}
        for obj in listing.objects:
            parts = obj.name.split("/")
            for depth in range(len(parts) - 1):
                parent, name = "/".join(parts[:depth]), parts[depth]
                here = per_dir.setdefault(parent, Listing([], [], False))
                if name not in here.dirs:
                    here.dirs.append(name)
                per_dir.setdefault("/".join(parts[: depth + 1]), Listing([], [], False))
            parent, name = "/".join(parts[:-1]), parts[-1]
            if name:
                per_dir[parent].objects.append(RemoteObject(name, obj.size, obj.etag, obj.mtime, obj.storage_class))
            else:
                per_dir[parent].marker = True
        base = self.ns.journal.path_of(ino)
        for rel in sorted(per_dir, key=lambda p: p.count("/") if p else -1):
            path = f"{base}/{rel}".strip("/") if rel else base
            if path is None:
                continue
            row = self.ns.journal.resolve(path)
            if row is None or not row.is_dir:
                continue  # a local change won over this part of the listing
            self.ns.merge.merge(row.ino, started_wall, per_dir[rel])
            self.listed_at[row.ino] = started_mono
            self.stale.pop(row.ino, None)
            self.on_listing(path, per_dir[rel])
        return True

    async def _list_bounded(self, prefix: str, bound: float) -> Listing | None:
        """The recursive listing of `prefix`, or None once no page of it arrived for `bound` seconds (abandoned)."""
        job = _Job()
        out: list[Listing] = []
        error: list[StoreError] = []

        async def run() -> None:
            try:
                out.append(await self._list(prefix, True, job.touch))
            except StoreError as e:
                error.append(e)
            finally:
                job.attempt_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            while not job.attempt_done.is_set():
                with trio.move_on_after(job.progress_at + bound - time.monotonic()):
                    await job.attempt_done.wait()
                if not job.attempt_done.is_set() and time.monotonic() - job.progress_at >= bound:
                    nursery.cancel_scope.cancel()
                    break
        if error:
            raise error[0]
        return out[0] if out else None

    def _known(self, ino: int, whole: bool) -> bool:
        """True if this node knows what the bucket holds in directory `ino` (and, if `whole`, below it)."""
        j = self.ns.journal
        row = j.get(ino)
        rows = [row] if row is not None else []
        if whole:
            rows += [r for r in j.descendants(ino) if r.is_dir]
        return all(r.ino in self.listed_at or r.state != DURABLE for r in rows)

    async def resolve(self, path: str) -> int | None:
        """The inode at mount-relative `path`, listing each directory on the way as needed."""
        ino = ROOT_INODE
        for part in [p for p in path.split("/") if p]:
            await self.refresh(ino)
            row = self.ns.journal.lookup(ino, part)
            if row is None:
                return None
            ino = row.ino
        return ino
