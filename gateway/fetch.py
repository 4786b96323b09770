"""Read files that are only in the bucket into the cache, in parallel ranges.

A file written by another node, or whose clean copy was evicted, has no local
bytes. Opening it starts a `Download`: `read_concurrency` ranged GETs,
written into a sparse cache file. Workers go through the file in order (that
is the read-ahead for a sequential reader) but a reader's missing range jumps
the queue, so a read waits only for the ranges it needs, never for the whole
file.

Range sizes grow along the file: the first is `read_range_size`, each next one
twice the last, up to `read_range_max_size`. A reader that wants the start of
a file (a header, an index) waits for a small range; one that streams the file
gets few large requests, and each request costs the daemon CPU (signing,
parsing, a thread hand-off) that with small ranges was most of a cold read's
cost (docs/benchmarks.md).

Integrity: every range is fetched with `If-Match` on the ETag the download
started from, so a file replaced meanwhile is never stitched from two
versions. A hasher follows the workers and computes the xxh3-128 of the
whole file; it is compared with the digest stored with the object (metadata
`xxh3`, written by ckptfs) or, failing that, the one recorded when this node
uploaded it. A read that reaches the end of the file waits for that check, so
a reader that reads a file to its end gets EIO, never silently wrong bytes.
Objects written by other tools carry no digest and are served as they are.

Archived objects (GLACIER, DEEP_ARCHIVE, intelligent tiering's archive tiers) cannot be read
until restored. A file whose listed class may need a restore is checked with one HeadObject
when it is opened (`refuse_if_archived`, its answer kept for `metadata_ttl`): not restored, the
open fails with ENOMEDIUM before any GET. A GET refused with InvalidObjectState anyway (the
class changed after the listing) fails the read with ENOMEDIUM too, never EIO. Each refusal
names the fix (`archived in GLACIER: run ckptfs restore /mnt/...`): the error's text, the
status's last error, and a log line at most once per file per minute (docs/semantics.md).
"""

from __future__ import annotations

import bisect
import errno
import logging
import math
import os
import time

import trio
import xxhash

from . import threads
from .cache import CacheFull
from .config import Config
from .namespace import Namespace
from .objects import ARCHIVED, CHANGED, NETWORK, SERVER, StoreError
from .storageclass import ONGOING, ArchiveState
from .storeapi import ObjectStore

log = logging.getLogger(__name__)

RANGE_ATTEMPTS = 6  # reads are not acknowledged data: after this many failures the reader gets EIO
HASH_CHUNK = 4 << 20
ARCHIVED_LOG_INTERVAL = 60.0  # seconds: one log line per archived file refused, at most this often


class Download:
    """One file being read from the bucket into its cache file."""

    def __init__(self, ino: int, key: str, etag: str, size: int, first_range: int, max_range: int) -> None:
        self.ino, self.key, self.etag, self.size = ino, key, etag, size
        self.starts: list[int] = []  # where each range begins; the last one ends at `size`
        start, length = 0, first_range
        while start < size:
            self.starts.append(start)
            start += length
            length = min(max_range, length * 2)
        self.count = len(self.starts)
        self.done = [False] * self.count
        self.started = [False] * self.count
        self.waiters: dict[int, trio.Event] = {}
        self.wanted: list[int] = []  # ranges a reader waits for: fetched before the read-ahead
        self.next_in_order = 0
        self.metadata: dict[str, str] | None = None
        self.error: OSError | None = None
        self.finished = trio.Event()  # every range fetched and checked, or failed

    def bytes_done(self) -> int:
        """Bytes of the ranges already in the cache file (progress of a warmup)."""
        return sum(self.span(i)[1] for i in range(self.count) if self.done[i])

    def span(self, i: int) -> tuple[int, int]:
        """(offset, length) of range `i`."""
        end = self.starts[i + 1] if i + 1 < self.count else self.size
        return self.starts[i], end - self.starts[i]

    def _take(self) -> int | None:
        while self.wanted:
            i = self.wanted.pop()
            if not self.started[i]:
                return i
        while self.next_in_order < self.count and self.started[self.next_in_order]:
            self.next_in_order += 1
        return self.next_in_order if self.next_in_order < self.count else None

    def _range_done(self, i: int) -> None:
        self.done[i] = True
        ev = self.waiters.pop(i, None)
        if ev is not None:
            ev.set()

    def fail(self, error: OSError) -> None:
        if self.error is None:
            self.error = error
        for ev in self.waiters.values():
            ev.set()
        self.waiters.clear()

    async def wait(self, offset: int, length: int) -> None:
        """Return once bytes [offset, offset+length) are in the cache file; raise the download's error."""
        if self.error is not None:
            raise self.error
        end = min(self.size, offset + length)
        if offset < end:
            for i in range(bisect.bisect_right(self.starts, offset) - 1, bisect.bisect_right(self.starts, end - 1)):
                while not self.done[i]:
                    if self.error is not None:
                        raise self.error
                    if not self.started[i]:
                        self.wanted.append(i)
                    ev = self.waiters.setdefault(i, trio.Event())
                    await ev.wait()
        if offset + length >= self.size:
            await self.finished.wait()  # the last bytes are served only once the whole file checked out
        if self.error is not None:
            raise self.error


class Fetcher:
    def __init__(self, cfg: Config, ns: Namespace, store: ObjectStore) -> None:
        self.cfg, self.ns, self.store = cfg, ns, store
        self.downloads: dict[int, Download] = {}
        self._nursery: trio.Nursery | None = None
        self.fetched_bytes_total = 0
        self.fetched_files_total = 0
        self.checksum_mismatches_total = 0
        self.read_errors_total = 0
        self.mountpoint = os.path.abspath(cfg.mountpoint) if cfg.mountpoint else ""
        self.archived_refusals_total = 0  # opens and reads refused: the object needs a restore
        self.last_error = ""  # the last archived refusal (status shows the newest of this and the drain's)
        self.last_error_at: float | None = None
        self._archived_logged: dict[str, float] = {}  # mount path -> monotonic time of its last log line

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Owns the downloads' tasks; also keeps the cache between its watermarks."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                while True:
                    self.ns.space.evict_to_watermark()
                    await trio.sleep(1.0)
        finally:
            self._nursery = None  # closed: no download starts until the supervisor restarts this

    def start(self, ino: int) -> Download | None:
        """The running download of `ino`, starting one if its bytes are not local; None if they are."""
        dl = self.downloads.get(ino)
        if dl is not None or not self.ns.files.needs_fetch(ino):
            return dl
        if self._nursery is None:  # restarting after an unexpected error (supervisor.py): this read fails, the next one may not
            raise OSError(errno.EIO, "the fetcher is restarting after an error")
        row = self.ns.files.row(ino)
        key = row.remote_key or row.copy_from
        if not key:
            raise OSError(errno.EIO, "file has neither local bytes nor an object")
        try:
            self.ns.space.make_room(row.size)
        except CacheFull:
            log.warning("no room in the cache to read %s (%d bytes): reader gets ENOSPC", key, row.size)
            raise
        dl = Download(ino, key, row.etag or "", row.size, self.cfg.read_range_size, self.cfg.read_range_max_size)
        try:
            fd = os.open(self.ns.cache.path(ino), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(fd, row.size)
        except OSError:
            self.ns.cache.grow(row.size, 0)
            raise
        self.downloads[ino] = dl
        self.ns.files.fetching.add(ino)
        self._nursery.start_soon(self._download, dl, fd, row.xxh3 if row.etag else None)
        return dl

    # ------------------------------------------------------------ archived objects
    async def archive_state(self, ino: int) -> ArchiveState | None:
        """The restore state of a file only in the bucket whose class may need a restore; None if it needs none or
        the store does not say (HeadObject, bounded by `read_range_timeout`; the answer is kept for `metadata_ttl`)."""
        row = self.ns.files.row(ino)
        key = row.remote_key or row.copy_from
        archive = self.ns.archive
        if row.is_dir or ino in self.downloads or not archive.may_need_restore(key) or not self.ns.files.needs_fetch(ino):
            return None
        assert key is not None
        known = archive.known(key, self.cfg.metadata_ttl)
        if known is not None:
            return known
        with trio.move_on_after(self.cfg.read_range_timeout or math.inf):
            try:
                state = await threads.call(lambda: self.store.archive_state(key))
            except StoreError as e:
                log.debug("HeadObject %s for its restore state failed: %s", key, e)
                return None
            archive.observed(key, state)
            return state
        return None

    async def refuse_if_archived(self, ino: int) -> None:
        """Raise ENOMEDIUM (naming `ckptfs restore PATH`) if the file is archived and not restored."""
        state = await self.archive_state(ino)
        if state is not None and state.needs_restore:
            raise self.archived(ino, state)

    def archived(self, ino: int, state: ArchiveState) -> OSError:
        """The error for a read of an archived file: counted, the status's last error, logged once a minute per file."""
        rel = self.ns.journal.path_of(ino)
        path = os.path.join(self.mountpoint, rel) if rel is not None else f"{self.mountpoint}/(inode {ino})"
        if state.restore == ONGOING:
            message = f"{path}: being restored from {state.where}, not readable yet: `ckptfs restore {path}` reports when it is"
        else:
            message = f"{path}: archived in {state.where}: run ckptfs restore {path}"
        self.archived_refusals_total += 1
        self.last_error, self.last_error_at = message, time.time()
        now = time.monotonic()
        if now - self._archived_logged.get(path, -math.inf) >= ARCHIVED_LOG_INTERVAL:
            if len(self._archived_logged) > 1000:
                self._archived_logged = {p: t for p, t in self._archived_logged.items() if now - t < ARCHIVED_LOG_INTERVAL}
            self._archived_logged[path] = now
            log.warning("read refused (ENOMEDIUM): %s", message)
        return OSError(errno.ENOMEDIUM, message)

    async def _refused_read(self, dl: Download) -> OSError:
        """A GET answered InvalidObjectState: learn the object's state (HeadObject, bounded) and say what to do."""
        state: ArchiveState | None = None
        with trio.move_on_after(self.cfg.read_range_timeout or math.inf):
            try:
                state = await threads.call(lambda: self.store.archive_state(dl.key))
            except StoreError:
                pass
        if state is None or not state.needs_restore:
            state = ArchiveState(state.storage_class if state else self.ns.archive.storage_class(dl.key) or "STANDARD",
                                 state.archive_status if state else "", refused=True)
        self.ns.archive.observed(dl.key, state)
        return self.archived(dl.ino, state)

    async def ensure_local(self, ino: int) -> None:
        """Wait until the whole file is local and checked (before writing to it, or truncating it)."""
        dl = self.start(ino)
        if dl is not None:
            await dl.wait(0, dl.size)

    async def _download(self, dl: Download, fd: int, known_xxh3: str | None) -> None:
        try:
            try:
                async with trio.open_nursery() as nursery:
                    for _ in range(min(self.cfg.read_concurrency, dl.count)):
                        nursery.start_soon(self._worker, dl, fd)
                    digest = await self._hash(dl, fd)
            except BaseExceptionGroup as group:
                errors = group.subgroup(OSError)
                if errors is None:
                    raise
                first: BaseException = errors
                while isinstance(first, BaseExceptionGroup):
                    first = first.exceptions[0]
                raise first from None
            expected = (dl.metadata or {}).get("xxh3") or known_xxh3
            if expected and digest != expected:
                self.checksum_mismatches_total += 1
                log.error("object %s does not match its checksum (xxh3 %s, expected %s): refusing to serve it",
                          dl.key, digest, expected)
                raise OSError(errno.EIO, "object does not match its checksum")
            self.fetched_files_total += 1
            self.ns.files.fetched(dl.ino, dl.etag, digest)
        except OSError as e:
            if not isinstance(e, CacheFull) and e.errno != errno.ENOMEDIUM:  # archived: counted as refused, not failed
                self.read_errors_total += 1
            dl.fail(e if e.errno else OSError(errno.EIO, str(e)))
            self.ns.cache.remove(dl.ino, dl.size)
        except BaseException:
            # cancelled (the fetcher restarting, the daemon stopping) or a bug: its readers get EIO instead of waiting
            # for ranges no task fetches any more, and the next open of the file starts a new download
            dl.fail(OSError(errno.EIO, "the read from the bucket was interrupted"))
            self.ns.cache.remove(dl.ino, dl.size)
            raise
        finally:
            os.close(fd)
            self.ns.files.fetching.discard(dl.ino)
            self.downloads.pop(dl.ino, None)
            dl.finished.set()
            for ev in dl.waiters.values():
                ev.set()

    async def _worker(self, dl: Download, fd: int) -> None:
        while dl.error is None:
            i = dl._take()
            if i is None:
                return
            dl.started[i] = True
            start, length = dl.span(i)
            bound = self.cfg.read_range_timeout or math.inf
            with trio.move_on_after(bound) as scope:
                metadata = await self._read_range(dl, fd, start, length)
            if scope.cancelled_caught:
                log.error("reading %s from the bucket: no answer for bytes %d-%d within read_range_timeout (%gs), "
                          "the object store is hung or very slow; the reader gets EIO", dl.key, start, start + length - 1, bound)
                raise OSError(errno.EIO, "the object store did not answer in time")
            if dl.metadata is None:
                dl.metadata = metadata
            self.fetched_bytes_total += length
            dl._range_done(i)

    async def _read_range(self, dl: Download, fd: int, start: int, length: int) -> dict[str, str]:
        """One range into the cache file, retried on network and server errors (a thread a hung store holds is abandoned)."""
        for attempt in range(1, RANGE_ATTEMPTS + 1):
            try:
                return await threads.call_with_fd(fd, lambda own: self.store.read_range(dl.key, dl.etag, start, length, own))
            except StoreError as e:
                if e.kind == ARCHIVED:
                    raise await self._refused_read(dl) from None
                if e.kind == CHANGED:
                    log.warning("%s changed in the bucket while being read: the reader gets EIO; "
                                "the mount shows the new object after the next listing", dl.key)
                retry = e.kind in (NETWORK, SERVER) and attempt < RANGE_ATTEMPTS
                if not retry:
                    log.error("reading %s from the bucket failed: %s", dl.key, e)
                    raise OSError(errno.EIO, str(e)) from None
                await trio.sleep(min(8.0, 0.25 * 2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _hash(self, dl: Download, fd: int) -> str:
        """xxh3-128 of the file, following the workers range by range."""
        h = xxhash.xxh3_128()

        def update(offset: int, length: int) -> None:
            end = offset + length
            while offset < end:
                data = os.pread(fd, min(HASH_CHUNK, end - offset), offset)
                h.update(data)
                offset += len(data)

        for i in range(dl.count):
            while not dl.done[i]:
                if dl.error is not None:
                    raise dl.error
                ev = dl.waiters.setdefault(i, trio.Event())
                await ev.wait()
            await trio.to_thread.run_sync(update, *dl.span(i))
        return h.hexdigest()
