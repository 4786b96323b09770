"""Room in the cache: evicting clean copies, and writers waiting for the drain (backpressure).

Dirty bytes are never evicted, so when the cache is full of them a writer
waits for the drainer to make files durable (which makes them evictable) and
gets ENOSPC only after `write_stall_timeout`: slow, never silent loss. A writer
waits only while waiting can help: while some other file's bytes are on their way
to the bucket (closed, or flushed, and not yet durable). When nothing is left to
drain (the disk filled by something else, or by files still open for writing)
the write gets ENOSPC at once, and a write after the disk has room again
succeeds: a waiting writer also looks at the disk every `ROOM_POLL_SECONDS`, as
space freed by another process sends no event.
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

import trio

from ..cache import Cache, CacheFull
from ..config import Config, fmt_bytes
from ..journal import Journal, Row
from .backlog import Backlog
from .files import OpenFiles

log = logging.getLogger(__name__)

T = TypeVar("T")

STALL_LOG_INTERVAL = 60.0  # seconds between "a write waits" warnings
ROOM_POLL_SECONDS = 1.0  # a waiting writer looks at the disk this often: another process may free space


def under(prefix_path: str, path: str) -> bool:
    """True if mount-relative `path` is `prefix_path` or below it ('' is the whole mount)."""
    return not prefix_path or path == prefix_path or path.startswith(prefix_path + "/")


class Space:
    def __init__(self, cfg: Config, journal: Journal, cache: Cache, backlog: Backlog, files: OpenFiles,
                 on_change: Callable[[], None]) -> None:
        self.cfg, self.journal, self.cache, self.backlog, self.files = cfg, journal, cache, backlog, files
        self._on_change = on_change  # wakes the drainer
        self._freed = trio.Event()
        self.evicted_files_total = 0
        self.evicted_bytes_total = 0
        self.write_stall_seconds_total = 0.0
        self.write_stalls_total = 0
        self.enospc_total = 0
        self.stalled_writers = 0
        self._stall_logged_at = -1e9

    def freed(self) -> None:
        """Something may have made room (a delete, an eviction, a file becoming durable): wake waiting writers."""
        self._freed.set()
        self._freed = trio.Event()

    def lend(self, want: int, need: int) -> int:
        """Room set aside for a copy worker's next writes (fuse/workers.py): up to `want` bytes, at least
        `need` (its next write), evicting clean copies for it if need be; each write it makes is then
        accounted by `OpenFiles.wrote`, what it does not use comes back with `repay`. 0 while writers
        wait for room (they go first) or when `need` does not fit: the write takes `when_room`."""
        if self.stalled_writers:
            return 0
        room = self.cache.room()
        if room < need:
            self.evict(need - room)
            room = self.cache.room()
            if room < need:
                return 0
        n = max(need, min(want, room))
        self.cache.lent_bytes += n
        return n

    def repay(self, n: int) -> None:
        """Room a copy worker set aside and did not use."""
        self.cache.lent_bytes -= n
        if n and self.stalled_writers:
            self.freed()

    def drain_can_free(self, writing: int | None = None) -> bool:
        """True while the drain may still make room: a file other than `writing` holds cached bytes not yet
        durable that nothing holds back (closed, flushed or being uploaded); once durable they are evictable."""
        for e in self.backlog.entries():
            if e.ino == writing or not e.cached or e.size <= 0:
                continue
            live = self.files.live.get(e.ino)
            if live is None or not live.writers or e.urgent or self.backlog.is_taken(e.ino):
                return True
        return False

    def _refuse(self, needed: int, why: str) -> None:
        self.enospc_total += 1
        log.warning("write of %d bytes gets ENOSPC (%s): %s", needed, why, self.why_full())

    async def when_room(self, attempt: Callable[[], T], writing: int | None = None) -> T:
        """Run `attempt` (a write to inode `writing`); when the cache is full evict clean copies, then wait for the
        drain while it can free something, then ENOSPC."""
        try:
            return attempt()
        except CacheFull as full:
            needed = full.needed
        if self.evict(needed) >= needed:
            try:
                return attempt()
            except CacheFull as full:
                needed = full.needed
        if not self.drain_can_free(writing):
            # refused at once: first make sure the disk is still full (its free space is sampled every 0.25 s)
            self.cache.forget_disk_sample()
            try:
                return attempt()
            except CacheFull as full:
                self._refuse(full.needed, "nothing left to drain or evict")
                raise
        started = trio.current_time()
        deadline = started + self.cfg.write_stall_timeout
        if started - self._stall_logged_at > STALL_LOG_INTERVAL:
            self._stall_logged_at = started
            log.warning("a write of %d bytes waits for the drain: %s", needed, self.why_full())
        self.write_stalls_total += 1
        self.stalled_writers += 1
        self._on_change()  # make sure the drainer is looking
        try:
            while True:
                with trio.move_on_at(min(deadline, trio.current_time() + ROOM_POLL_SECONDS)):
                    await self._freed.wait()
                self.evict(needed)
                try:
                    return attempt()
                except CacheFull as full:
                    needed = full.needed
                    if trio.current_time() >= deadline:
                        self._refuse(needed, f"cache full for {self.cfg.write_stall_timeout:.0f}s")
                        raise
                    if not self.drain_can_free(writing):
                        self._refuse(needed, "nothing left to drain or evict")
                        raise
        finally:
            self.stalled_writers -= 1
            self.write_stall_seconds_total += trio.current_time() - started

    def why_full(self) -> str:
        """Which setting stops the cache growing, and what to do about it (for the log)."""
        cache = self.cache
        if cache.limit() == "cache_min_free":
            return (f"the cache file system has {fmt_bytes(max(0, cache.disk_free()))} free and cache_min_free = "
                    f"{fmt_bytes(cache.min_free)} must stay free: lower cache_min_free, free space on that disk, or check the drain")
        return (f"the cache holds {fmt_bytes(cache.used_bytes)} of cache_capacity = {fmt_bytes(cache.capacity_bytes)}, "
                "none of it evictable yet: raise cache_capacity or check the drain (ckptfs status)")

    def evict(self, needed: int) -> int:
        """Drop local copies of durable files, least recently used first, until `needed` bytes are free.

        Victims come from the journal's eviction index a batch at a time (`Journal.evictable_in_order`),
        never from a sort of every clean copy: this runs on the trio thread, at every write that finds
        the cache full, so its cost must not grow with the number of files cached."""
        freed = 0
        for row in self.journal.evictable_in_order():
            if freed >= needed:
                break
            try:
                evicted = self._evict_one(row)
            except OSError as e:  # the journal cannot record it (a full or failing disk): nothing was removed
                log.warning("cannot evict clean cache copies now: %s", e)
                break
            if evicted:
                freed += row.size
                log.info("evicted clean cache copy of inode %d (%d bytes)", row.ino, row.size)
        return freed

    def make_room(self, needed: int) -> None:
        """Room for a fetch: evict if needed, else raise CacheFull."""
        if self.cache.room() < needed:
            self.evict(needed - self.cache.room())
        self.cache.grow(0, needed)

    def _evict_one(self, row: Row) -> bool:
        if self.files.in_use(row.ino):
            return False
        # the journal first: if it cannot be written the copy stays, never a row that claims a copy that is gone
        self.journal.update(row.ino, cached=0)
        self.cache.remove(row.ino, row.size)
        self.evicted_files_total += 1
        self.evicted_bytes_total += row.size
        return True

    def evict_to_watermark(self) -> int:
        """Above the high watermark, evict clean copies down to the low one. Returns bytes freed."""
        cap = self.cache.capacity_bytes
        if not cap or self.cache.used_bytes <= cap * self.cfg.cache_high_watermark:
            return 0
        freed = self.evict(int(self.cache.used_bytes - cap * self.cfg.cache_low_watermark))
        if freed:
            log.info("cache above %.0f%% of its capacity: evicted %d bytes of clean copies", 100 * self.cfg.cache_high_watermark, freed)
            self.freed()
        return freed

    def evict_under(self, path: str) -> tuple[int, int, int]:
        """Drop the clean copies at or below `path`: (files, bytes) evicted and files skipped (dirty, uploading or open)."""
        files = size = skipped = 0
        for row in self.journal.evictable_in_order():
            p = self.journal.path_of(row.ino)
            if p is None or not under(path, p):
                continue
            if self._evict_one(row):
                files += 1
                size += row.size
            else:
                skipped += 1
        at = self.journal.resolve(path)
        skipped += len(self.backlog.under(at.ino)) if at is not None else 0
        if size:
            self.freed()
        return files, size, skipped

    def stats(self) -> dict[str, float]:
        return {
            "stalled_writers": self.stalled_writers,
            "evicted_files_total": self.evicted_files_total,
            "evicted_bytes_total": self.evicted_bytes_total,
            "write_stalls_total": self.write_stalls_total,
            "write_stall_seconds_total": round(self.write_stall_seconds_total, 3),
            "enospc_total": self.enospc_total,
        }
