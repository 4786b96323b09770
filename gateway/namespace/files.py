"""Open files: the state of files being used, kept in memory until close or fsync.

A write changes a file's bytes thousands of times a second; committing each
to SQLite would cost more than the write. So sizes, versions and handle counts
of files in use live here, and the journal catches up on the last close, on
fsync and before an upload snapshots the file. The *version* is what makes an
upload safe: bumped on every change, an upload is published only if the version
it started from is still current.

Synchronous, on the trio thread (only `fsync` awaits: the journal's fsync runs in a
worker thread). Errors are `OSError(errno)` for the FS to map;
`CacheFull` (an OSError) when the cache has no room for a write.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from typing import Callable

from ..cache import Cache
from ..config import Config
from ..hooks import Hook
from ..journal import DIRTY, UPLOADING, Journal, Row
from .backlog import Backlog

RELATIME_NS = 24 * 3600 * 10**9  # an atime older than this is updated on open even if newer than the mtime
# a file's mtime is taken from a coarse clock (a jiffy, 1-10 ms): a write in the same tick as an mtime we
# read may leave it unchanged. An mtime older than this when read cannot be repeated by a later write.
MTIME_SETTLED_NS = 100_000_000


@dataclass
class Live:
    """In-memory state of a file being used; the journal catches up on close/fsync."""

    version: int
    size: int
    mtime_ns: int
    ctime_ns: int
    handles: int = 0
    writers: int = 0
    modified: bool = False  # changes not yet written to the journal
    unclosed: bool = False  # changed since the last close: the next last-close makes it eligible
    # the cache file's (size, mtime) last recorded from a passthrough writer, once its mtime was settled
    # (MTIME_SETTLED_NS): the same again means the kernel wrote nothing since
    behind: tuple[int, int] | None = None


class OpenFiles:
    def __init__(self, cfg: Config, journal: Journal, cache: Cache, backlog: Backlog) -> None:
        self.cfg, self.journal, self.cache, self.backlog = cfg, journal, cache, backlog
        self.live: dict[int, Live] = {}
        # files whose in-memory size may be ahead of the journal's (`live.modified` set since): what the upload queue's
        # figures correct for without a scan of every file waiting. Stale members (persisted, gone) are dropped as read.
        self.unpersisted: set[int] = set()
        self.fetching: set[int] = set()  # being read in from the bucket: never evicted meanwhile
        # which bytes changed, as they change (peers/sender.py streams them to the peers under durability = peer):
        # (ino, offset, length) after bytes reached the cache file; (ino, size) after a truncate. Must not raise.
        self.on_bytes: Hook[[int, int, int]] = Hook()
        self.on_truncate: Hook[[int, int]] = Hook()

    def row(self, ino: int) -> Row:
        """The journal's row with the in-memory size, mtime and state of a file in use."""
        row = self.journal.get(ino)
        if row is None:
            raise OSError(errno.ENOENT, "no such inode")
        live = self.live.get(ino)
        if live is not None:
            row.size, row.mtime_ns, row.ctime_ns = live.size, live.mtime_ns, live.ctime_ns
            if live.modified:
                row.state = DIRTY
        return row

    def get(self, ino: int) -> Live:
        live = self.live.get(ino)
        if live is None:
            row = self.journal.get(ino)
            if row is None:
                raise OSError(errno.ENOENT, "no such inode")
            live = Live(version=row.version, size=row.size, mtime_ns=row.mtime_ns, ctime_ns=row.ctime_ns)
            self.live[ino] = live
        return live

    def in_use(self, ino: int) -> bool:
        """Open, changed and not yet persisted, or being fetched: not to be evicted or replaced."""
        live = self.live.get(ino)
        return live is not None and (live.handles > 0 or live.modified) or ino in self.fetching

    def started(self, row: Row) -> None:
        """A new file: even an empty one is a change to persist and upload on its last close."""
        self.live[row.ino] = Live(version=row.version, size=0, mtime_ns=row.mtime_ns, ctime_ns=row.ctime_ns, modified=True, unclosed=True)
        self.unpersisted.add(row.ino)
        self.on_bytes(row.ino, 0, 0)  # an empty file (a commit marker) is replicated too

    def abandon_upload(self, ino: int) -> None:
        """Bump the version of a file in use so an upload in flight is not published."""
        if ino in self.live:
            self.live[ino].version += 1

    def needs_fetch(self, ino: int) -> bool:
        row = self.journal.get(ino)
        return row is not None and row.kind == "file" and not row.cached

    def open(self, ino: int, write: bool, created: Row | None = None) -> int:
        """A handle's fd on the cache file. `created`: the row `Tree.create` just inserted (with its
        LRU atime), so the open reads and writes no row of its own."""
        row = created if created is not None else self.row(ino)
        if row.is_dir:
            raise OSError(errno.EISDIR, "is a directory")
        if not row.cached and ino not in self.fetching:
            raise OSError(errno.EIO, "cache copy missing; fetch it first")
        fd = self.cache.open(ino)
        now = time.time_ns()
        fields: dict[str, object] = dict(atime=now / 1e9)  # least recently opened is evicted first
        shown = row.atime_ns if row.atime_ns is not None else row.mtime_ns
        if not write and (shown <= max(row.mtime_ns, row.ctime_ns) or now - shown > RELATIME_NS):
            fields["atime_ns"] = now  # relatime, as Linux mounts by default: an open for reading updates the atime
        if created is None:
            try:
                self.journal.update(ino, **fields)
            except OSError:  # a full or failing cache disk: the file still opens, its LRU time and atime stay as they were
                pass
        live = self.get(ino)
        live.handles += 1
        if write:
            live.writers += 1
        return fd

    def will_change(self, ino: int, live: Live) -> None:
        """Called before a file's bytes change: a durable file that changes must never be taken for
        durable after a crash, nor published by copying the object that holds its old bytes. So the
        journal says dirty first, then a byte changes (a kill -9 between leaves a dirty file with its old
        bytes: uploaded again, nothing lost). Raises (the journal's error) with nothing changed."""
        if live.modified:
            return  # already dirty in the journal
        row = self.journal.get(ino)
        if row is not None and row.parent is not None and (row.state != DIRTY or row.copy_from):
            self.journal.update(ino, state=DIRTY, version=live.version, copy_from=None)
            self.backlog.changed(ino)
        live.modified = True
        self.unpersisted.add(ino)

    def dirty_in_journal(self, ino: int) -> bool:
        """True if the journal already says the file is not durable (dirty or uploading, published by an
        upload of the cache copy): bytes may change without a journal write first (the copy workers)."""
        live = self.live.get(ino)
        if live is not None and live.modified:
            return True
        row = self.journal.get(ino)
        return row is not None and (row.parent is None or row.state in (DIRTY, UPLOADING) and not row.copy_from)

    def modified(self, ino: int, live: Live, new_size: int) -> None:
        """Record that the file's bytes changed: a new version that must be uploaded."""
        self.will_change(ino, live)
        live.version += 1
        live.size = new_size
        live.mtime_ns = live.ctime_ns = time.time_ns()
        live.unclosed = True

    def changed_behind(self, ino: int, size: int | None, mtime_ns: int | None) -> None:
        """A change no WRITE told us of: under FUSE passthrough the kernel writes the cache file
        itself. Called when a writer opens (size None: the file counts as modified from now)
        and with the cache file's size and mtime on its fsync, getattr, close and `status`. The
        bytes are already on disk: accounted, never refused. A size and mtime the same as last
        recorded (and that mtime settled then) are no change: reading the state (`status`, a
        scrape) makes no new version, which would abandon the file's upload in flight."""
        live = self.get(ino)
        if size is not None and mtime_ns is not None and live.behind == (size, mtime_ns):
            return
        new_size = live.size if size is None else size
        if new_size != live.size:
            self.cache.resized(live.size, new_size)
        self.modified(ino, live, new_size)
        if mtime_ns is not None:
            live.mtime_ns = mtime_ns
        settled = size is not None and mtime_ns is not None and time.time_ns() - mtime_ns > MTIME_SETTLED_NS
        live.behind = (new_size, mtime_ns) if settled and mtime_ns is not None else None

    def write(self, ino: int, fd: int, offset: int, data: bytes) -> int:
        live = self.get(ino)
        end = offset + len(data)
        if end > self.cfg.file_size_limit:
            raise OSError(errno.EFBIG, "file larger than max_file_size")
        self.will_change(ino, live)
        if end > live.size:
            self.cache.grow(live.size, end)
        try:
            n = os.pwrite(fd, data, offset)
        except OSError:
            if end > live.size:
                self.cache.grow(end, live.size)
            raise
        if offset + n < end and end > live.size:  # a short write (the disk filled up meanwhile): account what it took
            self.cache.grow(end, max(live.size, offset + n))
        self.modified(ino, live, max(live.size, offset + n))
        self.on_bytes(ino, offset, n)
        return n

    def wrote(self, ino: int, offset: int, lent: int, written: int) -> None:
        """A copy worker (fuse/workers.py) wrote `written` bytes at `offset` into the cache file, on
        `lent` bytes of room `Space.lend` set aside: account them. Posted to the trio thread before the
        reply goes to the kernel, into the queue every request goes through: whatever the kernel sends
        after the reply sees the new size and version."""
        self.cache.lent_bytes -= lent
        if not written:
            return
        live = self.get(ino)
        end = offset + written
        if end > live.size:
            self.cache.resized(live.size, end)
        self.modified(ino, live, max(live.size, end))
        self.on_bytes(ino, offset, written)

    def truncate(self, ino: int, size: int) -> None:
        if size > self.cfg.file_size_limit:
            raise OSError(errno.EFBIG, "file larger than max_file_size")
        live = self.get(ino)
        self.will_change(ino, live)
        self.cache.grow(live.size, size)
        try:
            os.truncate(self.cache.path(ino), size)
        except OSError:
            self.cache.grow(size, live.size)
            raise
        self.modified(ino, live, size)
        self.on_truncate(ino, size)
        if not live.handles:
            self.persist(ino, closed=True)

    def persist(self, ino: int, closed: bool) -> None:
        """Write a file's in-memory state to the journal; `closed` starts its upload clock."""
        live = self.live.get(ino)
        if live is None or not (live.modified or (closed and live.unclosed)):
            return
        fields: dict[str, object] = dict(size=live.size, mtime_ns=live.mtime_ns, ctime_ns=live.ctime_ns, version=live.version)
        row = self.journal.get(ino)
        if row is not None and row.parent is not None:
            fields["state"] = DIRTY  # an unlinked file stays out of the drain
        if closed:
            fields["closed_at"] = time.time()
            live.unclosed = False
        self.journal.update(ino, **fields)
        self.backlog.changed(ino)
        live.modified = False

    async def fsync(self, ino: int) -> None:
        """Called after the cache file itself was fsynced: make the journal entry durable too.

        The journal's fsync runs in a worker thread: the trio thread serves other requests meanwhile."""
        if ino in self.live:
            self.persist(ino, closed=False)
        await self.journal.durable()

    def persist_all(self) -> None:
        """At unmount: handles still open will never be released, so close them in the journal now."""
        with self.journal.transaction():
            for ino, live in self.live.items():
                live.writers = live.handles = 0
                self.persist(ino, closed=True)

    def release(self, ino: int, write: bool) -> bool:
        """A handle closed. True if the file's last writer left with changes: the drainer has work."""
        live = self.live.get(ino)
        if live is None:
            return False
        live.handles -= 1
        if write:
            live.writers -= 1
            if live.writers == 0:
                self.backlog.changed(ino)  # no writer holds it back any more
        if live.writers == 0 and (live.modified or live.unclosed):
            self.persist(ino, closed=True)
            return True
        return False

    def set_times(self, ino: int, ctime_ns: int, mtime_ns: int | None = None) -> None:
        """The journal got new times for `ino` (setattr, rename, link count): keep a file in use in step."""
        live = self.live.get(ino)
        if live is not None:
            live.ctime_ns = ctime_ns
            if mtime_ns is not None:
                live.mtime_ns = mtime_ns

    def allocate(self, ino: int, fd: int, offset: int, length: int, keep_size: bool) -> None:
        """fallocate mode 0 (or FALLOC_FL_KEEP_SIZE): reserve disk blocks; mode 0 may grow the file."""
        live = self.get(ino)
        end = offset + length
        if keep_size or end <= live.size:
            return  # the cache accounts logical sizes: nothing changes that anyone can see
        if end > self.cfg.file_size_limit:
            raise OSError(errno.EFBIG, "file larger than max_file_size")
        self.will_change(ino, live)
        self.cache.grow(live.size, end)
        try:
            os.posix_fallocate(fd, live.size, end - live.size)
        except OSError:
            self.cache.grow(end, live.size)
            raise
        start = live.size
        self.modified(ino, live, end)
        self.on_bytes(ino, start, end - start)

    def forget_if_idle(self, ino: int) -> None:
        """Drop the in-memory state of a file nobody uses and that has nothing left to persist."""
        live = self.live.get(ino)
        if live is not None and not (live.handles or live.modified or live.unclosed):
            del self.live[ino]

    def emptied(self, ino: int) -> None:
        """A file only in the bucket opened with O_TRUNC: start an empty local copy instead of reading it."""
        self.cache.create(ino)
        live = self.get(ino)
        with self.journal.transaction():
            self.journal.update(ino, cached=1)
            live.size = 0
            self.modified(ino, live, 0)
        self.on_truncate(ino, 0)

    def fetched(self, ino: int, etag: str, xxh3: str) -> None:
        self.journal.update(ino, cached=1, atime=time.time(), etag=etag, xxh3=xxh3)

    def size_of(self, row: Row) -> int:
        live = self.live.get(row.ino)
        return live.size if live is not None else row.size
