"""The tree the mount shows, and every rule about how a change to it reaches the bucket.

The journal holds the tree; this module adds the state that changes too often
to commit on every call (sizes, versions and open handles of files being
written) and the policy that ties them together:

* a write bumps the file's *version*; an upload is published only if the
  version it started from is still current, so a changed file is re-queued;
* a rename is one journal transaction; a file renamed before its upload goes
  straight to its final key, and a durable file renamed is uploaded again
  under its new key before its old object is deleted;
* deleting the object of a removed file waits while another live file owns
  the same key and is not yet durable (its upload will replace the object).

Everything here runs on the trio thread and is synchronous, except
`write_waiting`, where a writer waits for the drain to free space
(backpressure). Errors are `OSError(errno)` for the FS to map.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import trio

from .cache import Cache, CacheFull
from .config import Config
from .journal import DIRTY, DURABLE, ROOT_INODE, UPLOADING, Journal, Row
if TYPE_CHECKING:
    from .store import Listing

log = logging.getLogger(__name__)

NAME_MAX = 255


def _valid_name(name: str) -> bool:
    """Object keys that cannot be a POSIX name ('a//b', '.', '..', too long) are not shown."""
    return bool(name) and name not in (".", "..") and len(name.encode()) <= NAME_MAX


@dataclass
class Live:
    """In-memory state of a file being used; the journal catches up on close/fsync."""

    version: int
    size: int
    mtime_ns: int
    handles: int = 0
    writers: int = 0
    modified: bool = False  # changes not yet written to the journal
    unclosed: bool = False  # changed since the last close: the next last-close makes it eligible


@dataclass
class Pending:
    """A file the drainer may upload, as seen when scheduling."""

    ino: int
    key: str
    size: int
    closed_at: float


@dataclass
class UploadTicket:
    ino: int
    version: int
    size: int
    key: str
    closed_at: float
    copy_from: str | None = None  # publish by copying this object inside the store, not by uploading
    xxh3: str | None = None  # known digest of the bytes (for a copy)


class Namespace:
    def __init__(self, cfg: Config, journal: Journal, cache: Cache) -> None:
        self.cfg = cfg
        self.journal = journal
        self.cache = cache
        self.live: dict[int, Live] = {}
        self.lookups: dict[int, int] = {}
        self.urgent: set[int] = set()  # flush asked for these: skip upload_delay and open writers
        self.urgent_until = 0.0  # a flush is running until then: directory markers go out at once
        self.on_change: Callable[[], None] = lambda: None  # the drainer's wake-up
        self.on_durable: Callable[[float], None] = lambda seconds: None
        self._space_freed = trio.Event()
        # totals since start, exported as metrics and in status
        self.evicted_files_total = 0
        self.evicted_bytes_total = 0
        self.write_stall_seconds_total = 0.0
        self.write_stalls_total = 0
        self.enospc_total = 0
        self.stalled_writers = 0
        self.remote_removed_total = 0  # entries gone from the bucket (deleted by another node)
        self.remote_changed_total = 0  # objects replaced in the bucket by another node
        # keys this node deleted lately, with when: a listing that started before must not resurrect them
        self.recently_deleted: dict[str, float] = {}
        self.fetching: set[int] = set()  # being read in from the bucket: never evicted meanwhile

    # --------------------------------------------------------------- start-up
    def recover(self) -> None:
        """Bring the journal to a consistent state after any kind of stop, crash included."""
        j = self.journal
        with j.transaction():
            for row in j.orphans():
                # unlinked while open when the daemon stopped: nobody can open it again
                if row.kind == "file":
                    self.cache.remove(row.ino, row.size)
                j.db.execute("DELETE FROM inodes WHERE ino = ?", (row.ino,))
                j.forget_upload(row.ino)
            now = time.time()
            for row in j.pending_files():
                # the cache file is the truth for the size: writes reach it before the journal
                j.update(row.ino, state=DIRTY, size=self.cache.size(row.ino), closed_at=row.closed_at or now)
            # a read from the bucket cut short: its partial copy is worth nothing
            uncached = [r[0] for r in j.db.execute("SELECT ino FROM inodes WHERE kind = 'file' AND cached = 0")]
        j.sync()
        self.cache.scan(set(j.all_inodes()) - set(uncached))

    # ---------------------------------------------------------------- lookups
    def key_of(self, path: str) -> str:
        return self.cfg.key_prefix + path

    def path_of_key(self, key: str) -> str:
        return key[len(self.cfg.key_prefix):]

    def row(self, ino: int) -> Row:
        row = self.journal.get(ino)
        if row is None:
            raise OSError(errno.ENOENT, "no such inode")
        live = self.live.get(ino)
        if live is not None:
            row.size, row.mtime_ns = live.size, live.mtime_ns
            if live.modified:
                row.state = DIRTY
        return row

    def lookup(self, parent: int, name: str) -> Row:
        row = self.journal.lookup(parent, name)
        if row is None:
            raise OSError(errno.ENOENT, name)
        return self.row(row.ino)

    def ref(self, ino: int, n: int = 1) -> None:
        """The kernel now holds `n` more references to `ino` (lookup count)."""
        self.lookups[ino] = self.lookups.get(ino, 0) + n

    def forget(self, ino: int, n: int) -> None:
        left = self.lookups.get(ino, 0) - n
        if left > 0:
            self.lookups[ino] = left
            return
        self.lookups.pop(ino, None)
        self._reap(ino)

    def _reap(self, ino: int) -> None:
        """Drop an unlinked inode once neither the kernel nor an open handle refers to it."""
        if ino == ROOT_INODE or self.lookups.get(ino) or (ino in self.live and self.live[ino].handles):
            return
        row = self.journal.get(ino)
        if row is None or row.parent is not None:
            if ino in self.live and not (self.live[ino].modified or self.live[ino].unclosed):
                del self.live[ino]
            return
        self.live.pop(ino, None)
        self.urgent.discard(ino)
        if row.kind == "file":
            self.cache.remove(ino, row.size)
            self.space_freed()
        self.journal.delete(ino)

    def children(self, parent: int) -> list[Row]:
        return [self.row(r.ino) if r.ino in self.live else r for r in self.journal.children(parent)]

    def state_of(self, ino: int) -> str | None:
        return self.row(ino).state

    # --------------------------------------------------------------- creation
    def _check_name(self, parent: int, name: str) -> Row:
        if len(name.encode()) > NAME_MAX:
            raise OSError(errno.ENAMETOOLONG, name)
        prow = self.journal.get(parent)
        if prow is None or prow.parent is None and parent != ROOT_INODE:
            raise OSError(errno.ENOENT, "parent directory was removed")
        if not prow.is_dir:
            raise OSError(errno.ENOTDIR, name)
        if self.journal.lookup(parent, name) is not None:
            raise OSError(errno.EEXIST, name)
        return prow

    def create(self, parent: int, name: str, mode: int, uid: int, gid: int, closed: bool = False) -> Row:
        """A new empty file; `closed` if no handle is opened on it (mknod), so it is eligible at once."""
        self._check_name(parent, name)
        with self.journal.transaction():
            row = self.journal.insert(parent, name, "file", stat.S_IFREG | (mode & 0o7777), uid, gid, DIRTY)
            self.cache.create(row.ino)
            self._touch_dir(parent)
            if closed:
                self.journal.update(row.ino, closed_at=time.time())
        if not closed:
            # even an empty file is uploaded: the new file is a change to persist on close
            self.live[row.ino] = Live(version=row.version, size=0, mtime_ns=row.mtime_ns, modified=True, unclosed=True)
        else:
            self.on_change()
        return row

    def mkdir(self, parent: int, name: str, mode: int, uid: int, gid: int) -> Row:
        self._check_name(parent, name)
        with self.journal.transaction():
            row = self.journal.insert(parent, name, "dir", stat.S_IFDIR | (mode & 0o7777), uid, gid, None)
            self._touch_dir(parent)
            self._marker_if_empty(row.ino)
        self.on_change()
        return row

    def _marker_if_empty(self, ino: int) -> None:
        """An empty directory exists in the bucket only as a `dir/` marker object: queue one."""
        if ino == ROOT_INODE or self.journal.has_children(ino):
            return
        path = self.journal.path_of(ino)
        if path is not None:
            self.journal.queue_marker(self.key_of(path) + "/")

    def _touch_dir(self, ino: int) -> None:
        now = time.time_ns()
        self.journal.update(ino, mtime_ns=now, ctime_ns=now)

    # ------------------------------------------------------------ file data
    def _live(self, ino: int) -> Live:
        live = self.live.get(ino)
        if live is None:
            row = self.journal.get(ino)
            if row is None:
                raise OSError(errno.ENOENT, "no such inode")
            live = Live(version=row.version, size=row.size, mtime_ns=row.mtime_ns)
            self.live[ino] = live
        return live

    def needs_fetch(self, ino: int) -> bool:
        row = self.journal.get(ino)
        return row is not None and row.kind == "file" and not row.cached

    def open(self, ino: int, write: bool) -> int:
        row = self.row(ino)
        if row.is_dir:
            raise OSError(errno.EISDIR, "is a directory")
        if not row.cached and ino not in self.fetching:
            raise OSError(errno.EIO, "cache copy missing; fetch it first")
        fd = self.cache.open(ino)
        self.journal.update(ino, atime=time.time())
        live = self._live(ino)
        live.handles += 1
        if write:
            live.writers += 1
        return fd

    def _modified(self, ino: int, live: Live, new_size: int) -> None:
        """Record that the file's bytes changed: a new version that must be uploaded."""
        live.version += 1
        live.size = new_size
        live.mtime_ns = time.time_ns()
        live.unclosed = True
        if not live.modified:
            live.modified = True
            row = self.journal.get(ino)
            if row is not None and row.parent is not None and (row.state != DIRTY or row.copy_from):
                # a durable file that changes must never be taken for durable after a crash,
                # nor published by copying the object that holds its old bytes
                self.journal.update(ino, state=DIRTY, version=live.version, copy_from=None)

    def write(self, ino: int, fd: int, offset: int, data: bytes) -> int:
        live = self._live(ino)
        end = offset + len(data)
        if end > self.cfg.file_size_limit:
            raise OSError(errno.EFBIG, "file larger than max_file_size")
        if end > live.size:
            self.cache.grow(live.size, end)
        try:
            n = os.pwrite(fd, data, offset)
        except OSError:
            if end > live.size:
                self.cache.grow(end, live.size)
            raise
        self._modified(ino, live, max(live.size, offset + n))
        return n

    async def write_waiting(self, ino: int, fd: int, offset: int, data: bytes) -> int:
        """`write`, but when the cache is full evict clean copies, then wait for the drain, then ENOSPC."""
        try:
            return self.write(ino, fd, offset, data)
        except CacheFull as full:
            needed = full.needed
        if self.evict(needed) >= needed:
            try:
                return self.write(ino, fd, offset, data)
            except CacheFull as full:
                needed = full.needed
        started = trio.current_time()
        deadline = started + self.cfg.write_stall_timeout
        self.write_stalls_total += 1
        self.stalled_writers += 1
        self.on_change()  # make sure the drainer is looking
        try:
            while True:
                with trio.move_on_at(deadline):
                    await self._space_freed.wait()
                self.evict(needed)
                try:
                    return self.write(ino, fd, offset, data)
                except CacheFull as full:
                    needed = full.needed
                    if trio.current_time() >= deadline:
                        self.enospc_total += 1
                        log.warning("cache full for %.0fs: write of %d bytes gets ENOSPC (raise cache_capacity or check the drain)",
                                    self.cfg.write_stall_timeout, needed)
                        raise
        finally:
            self.stalled_writers -= 1
            self.write_stall_seconds_total += trio.current_time() - started

    def space_freed(self) -> None:
        self._space_freed.set()
        self._space_freed = trio.Event()

    def evict(self, needed: int) -> int:
        """Drop local copies of durable files, least recently used first, until `needed` bytes are free."""
        freed = 0
        for row in self.journal.evictable():
            if freed >= needed:
                break
            if self._evict_one(row):
                freed += row.size
                log.info("evicted clean cache copy of inode %d (%d bytes)", row.ino, row.size)
        return freed

    def make_room(self, needed: int) -> None:
        """Room for a fetch: evict if needed, else raise CacheFull."""
        if self.cache.room() < needed:
            self.evict(needed - self.cache.room())
        self.cache.grow(0, needed)

    def _evict_one(self, row: Row) -> bool:
        live = self.live.get(row.ino)
        if live is not None and (live.handles or live.modified) or row.ino in self.fetching:
            return False
        self.cache.remove(row.ino, row.size)
        self.journal.update(row.ino, cached=0)
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
            self.space_freed()
        return freed

    def evict_under(self, path: str) -> tuple[int, int, int]:
        """Drop the clean copies at or below `path`: (files, bytes) evicted and files skipped (dirty, uploading or open)."""
        files = size = skipped = 0
        for row in self.journal.evictable():
            p = self.journal.path_of(row.ino)
            if p is None or not self._under(path, p):
                continue
            if self._evict_one(row):
                files += 1
                size += row.size
            else:
                skipped += 1
        skipped += sum(1 for r in self.journal.pending_files() if self._under(path, self.journal.path_of(r.ino) or "\0"))
        if size:
            self.space_freed()
        return files, size, skipped

    def empty_uncached(self, ino: int) -> None:
        """A file only in the bucket opened with O_TRUNC: start an empty local copy instead of reading it."""
        self.cache.create(ino)
        live = self._live(ino)
        with self.journal.transaction():
            self.journal.update(ino, cached=1)
            live.size = 0
            self._modified(ino, live, 0)

    def fetched(self, ino: int, etag: str, xxh3: str) -> None:
        self.journal.update(ino, cached=1, atime=time.time(), etag=etag, xxh3=xxh3)

    # ------------------------------------------------------------ the bucket
    def merge_listing(self, dir_ino: int, started_at: float, listing: "Listing") -> None:
        """Overlay one directory's bucket listing on the journal; local changes always win.

        New objects and prefixes become entries (files durable and not cached);
        a clean entry whose object is gone disappears, one whose ETag changed
        loses its cached copy so the next open fetches the new bytes. An entry
        the bucket confirmed (or this node created) after the listing started is
        kept: the listing is older than it.
        """
        j = self.journal
        dpath = j.path_of(dir_ino)
        if dpath is None:
            return
        base = self.key_of(dpath + "/" if dpath else "")
        pending = j.pending_keys()
        recent = {k for k, at in self.recently_deleted.items() if at >= started_at}

        def skip(key: str) -> bool:
            return key in pending or key in recent

        uid, gid = os.getuid(), os.getgid()
        children = {r.name: r for r in j.children(dir_ino)}
        seen: set[str] = set()
        with j.transaction():
            if listing.marker and dir_ino != ROOT_INODE:
                j.update(dir_ino, state=DURABLE, seen_at=max(started_at, j.get(dir_ino).seen_at or 0))  # type: ignore[union-attr]
            for name in listing.dirs:
                if not _valid_name(name):
                    continue
                key = base + name + "/"
                if any(k.startswith(key) for k in pending) and name not in children:
                    continue  # being emptied by this node
                seen.add(name)
                row = children.get(name)
                if row is None:
                    j.insert(dir_ino, name, "dir", stat.S_IFDIR | 0o755, uid, gid, DURABLE, seen_at=started_at)
                elif row.is_dir:
                    j.update(row.ino, seen_at=max(started_at, row.seen_at or 0))
            for obj in listing.objects:
                if "/" in obj.name or not _valid_name(obj.name):
                    continue
                key = base + obj.name
                if skip(key):
                    continue
                seen.add(obj.name)
                row = children.get(obj.name)
                mtime_ns = int(obj.mtime * 1e9)
                if row is None:
                    j.insert(dir_ino, obj.name, "file", stat.S_IFREG | 0o644, uid, gid, DURABLE, size=obj.size,
                             mtime_ns=mtime_ns, ctime_ns=mtime_ns, etag=obj.etag, remote_key=key, cached=0, seen_at=started_at)
                    continue
                if row.is_dir or row.state != DURABLE:
                    continue  # local changes win
                if row.etag == obj.etag:
                    j.update(row.ino, seen_at=max(started_at, row.seen_at or 0))
                    continue
                if (row.seen_at or 0) > started_at or self._in_use(row.ino):
                    continue  # newer than the listing, or open: look again next time
                # replaced by someone else: forget the old bytes
                log.info("object %s changed in the bucket (etag %s -> %s): the next open fetches it", key, row.etag, obj.etag)
                if row.cached:
                    self.cache.remove(row.ino, row.size)
                j.update(row.ino, size=obj.size, mtime_ns=mtime_ns, ctime_ns=mtime_ns, etag=obj.etag, xxh3=None,
                         remote_key=key, cached=0, seen_at=started_at, version=row.version + 1)
                self.live.pop(row.ino, None)
                self.remote_changed_total += 1
            for name, row in children.items():
                if name in seen or (row.seen_at or 0) > started_at:
                    continue
                if not self._removable(row):
                    continue
                log.info("%s is gone from the bucket: removing it from the mount", base + name)
                self._remove_subtree(row)
                self.remote_removed_total += 1
        self.space_freed()

    def _in_use(self, ino: int) -> bool:
        live = self.live.get(ino)
        return live is not None and (live.handles > 0 or live.modified) or ino in self.fetching

    def _removable(self, row: Row) -> bool:
        """True if nothing of `row` (or below it) is local work the bucket has not seen yet."""
        if not row.is_dir:
            return row.state == DURABLE and not self._in_use(row.ino)
        if row.state != DURABLE and any(self.path_of_key(k).rstrip("/") == self.journal.path_of(row.ino) for _, k, _ in self.journal.pending_markers()):
            return False
        return all(self._removable(r) for r in self.journal.children(row.ino))

    def _remove_subtree(self, row: Row) -> None:
        for child in self.journal.children(row.ino) if row.is_dir else []:
            self._remove_subtree(child)
        if row.kind == "file" and row.cached:
            self.cache.remove(row.ino, row.size)
        self.journal.update(row.ino, parent=None, name=None, remote_key=None, state=None)
        self._reap(row.ino)

    def truncate(self, ino: int, size: int) -> None:
        if size > self.cfg.file_size_limit:
            raise OSError(errno.EFBIG, "file larger than max_file_size")
        live = self._live(ino)
        self.cache.grow(live.size, size)
        try:
            os.truncate(self.cache.path(ino), size)
        except OSError:
            self.cache.grow(size, live.size)
            raise
        self._modified(ino, live, size)
        if not live.handles:
            self._persist(ino, closed=True)

    def _persist(self, ino: int, closed: bool) -> None:
        """Write a file's in-memory state to the journal."""
        live = self.live.get(ino)
        if live is None or not (live.modified or (closed and live.unclosed)):
            return
        fields: dict[str, object] = dict(size=live.size, mtime_ns=live.mtime_ns, ctime_ns=live.mtime_ns, version=live.version)
        row = self.journal.get(ino)
        if row is not None and row.parent is not None:
            fields["state"] = DIRTY  # an unlinked file stays out of the drain
        if closed:
            fields["closed_at"] = time.time()
            live.unclosed = False
        self.journal.update(ino, **fields)
        live.modified = False

    def fsync(self, ino: int) -> None:
        """Called after the cache file itself was fsynced: make the journal entry durable too."""
        if ino in self.live:
            self._persist(ino, closed=False)
        self.journal.sync()

    def persist_all(self) -> None:
        """At unmount: handles still open will never be released, so close them in the journal now."""
        with self.journal.transaction():
            for ino, live in self.live.items():
                live.writers = live.handles = 0
                self._persist(ino, closed=True)

    def release(self, ino: int, write: bool) -> None:
        live = self.live.get(ino)
        if live is None:
            return
        live.handles -= 1
        if write:
            live.writers -= 1
        if live.writers == 0 and (live.modified or live.unclosed):
            self._persist(ino, closed=True)
            self.on_change()
        if not live.handles:
            self._reap(ino)

    def setattr(self, ino: int, mode: int | None, uid: int | None, gid: int | None, atime_ns: int | None, mtime_ns: int | None) -> None:
        row = self.row(ino)
        fields: dict[str, object] = {}
        if mode is not None:
            fields["mode"] = (row.mode & ~0o7777) | (mode & 0o7777)
        if uid is not None:
            fields["uid"] = uid
        if gid is not None:
            fields["gid"] = gid
        if mtime_ns is not None:
            fields["mtime_ns"] = mtime_ns
            if ino in self.live:
                self.live[ino].mtime_ns = mtime_ns
        if fields:
            fields["ctime_ns"] = time.time_ns()
            self.journal.update(ino, **fields)

    # ---------------------------------------------------------------- removal
    def _drop_remote(self, row: Row) -> None:
        """The object of a file that leaves the tree must leave the bucket."""
        if row.remote_key:
            self.journal.queue_delete(row.remote_key)
        if row.ino in self.live:
            self.live[row.ino].version += 1  # aborts an upload in flight
        self.journal.update(row.ino, parent=None, name=None, remote_key=None, state=None)
        self.journal.forget_upload(row.ino)

    def unlink(self, parent: int, name: str) -> None:
        row = self.journal.lookup(parent, name)
        if row is None:
            raise OSError(errno.ENOENT, name)
        if row.is_dir:
            raise OSError(errno.EISDIR, name)
        with self.journal.transaction():
            self._drop_remote(row)
            self._touch_dir(parent)
            self._marker_if_empty(parent)
        self._reap(row.ino)
        self.on_change()

    def rmdir(self, parent: int, name: str) -> None:
        row = self.journal.lookup(parent, name)
        if row is None:
            raise OSError(errno.ENOENT, name)
        if not row.is_dir:
            raise OSError(errno.ENOTDIR, name)
        if self.journal.has_children(row.ino):
            raise OSError(errno.ENOTEMPTY, name)
        with self.journal.transaction():
            self._drop_marker(row)
            self.journal.update(row.ino, parent=None, name=None)
            self._touch_dir(parent)
            self._marker_if_empty(parent)
        self._reap(row.ino)
        self.on_change()

    def _drop_marker(self, row: Row) -> None:
        """A directory leaving its path: its `dir/` object must go, if the bucket may have one.

        A directory's state is DURABLE once the bucket holds anything under it
        (its marker, or a file's object). Deleting `dir/` also removes what some
        stores (SeaweedFS) keep of a directory after its last object is gone; it
        runs after the deletes of everything under it (see `ready_deletes`).
        """
        path = self.journal.path_of(row.ino)
        if path is not None and row.state == DURABLE:
            self.journal.queue_delete(self.key_of(path) + "/")

    # ----------------------------------------------------------------- rename
    def rename(self, old_parent: int, old_name: str, new_parent: int, new_name: str, noreplace: bool) -> None:
        j = self.journal
        src = j.lookup(old_parent, old_name)
        if src is None:
            raise OSError(errno.ENOENT, old_name)
        if len(new_name.encode()) > NAME_MAX:
            raise OSError(errno.ENAMETOOLONG, new_name)
        dst_parent = j.get(new_parent)
        if dst_parent is None or not dst_parent.is_dir:
            raise OSError(errno.ENOTDIR, new_name)
        if src.is_dir and j.is_ancestor(src.ino, new_parent):
            raise OSError(errno.EINVAL, "cannot move a directory into itself")
        dst = j.lookup(new_parent, new_name)
        if dst is not None and dst.ino == src.ino:
            return
        if dst is not None:
            if noreplace:
                raise OSError(errno.EEXIST, new_name)
            if dst.is_dir and not src.is_dir:
                raise OSError(errno.EISDIR, new_name)
            if src.is_dir and not dst.is_dir:
                raise OSError(errno.ENOTDIR, new_name)
            if dst.is_dir and j.has_children(dst.ino):
                raise OSError(errno.ENOTEMPTY, new_name)
        with j.transaction():
            if dst is not None:
                if dst.is_dir:
                    self._drop_marker(dst)
                    j.update(dst.ino, parent=None, name=None)
                else:
                    self._drop_remote(dst)
            moved = [src] if not src.is_dir else [src, *j.descendants(src.ino)]
            for row in moved:
                if row.is_dir:
                    self._drop_marker(row)  # still at its old path here
            j.update(src.ino, parent=new_parent, name=new_name, ctime_ns=time.time_ns())
            for row in moved:
                if row.is_dir:
                    j.update(row.ino, state=None)
                    self._marker_if_empty(row.ino)
                else:
                    self._requeue_moved(row)
            self._touch_dir(old_parent)
            self._marker_if_empty(old_parent)
            if new_parent != old_parent:
                self._touch_dir(new_parent)
        if dst is not None:
            self._reap(dst.ino)
        self.on_change()

    def _requeue_moved(self, row: Row) -> None:
        """A moved file must end up under its new key; nothing to do if it was never uploaded.

        A durable file whose bytes are still exactly its object's is copied inside
        the store (no byte through this node, and it need not be cached); a file
        changed since is uploaded from the cache. Either way the old object is
        deleted only once the new one is complete, so a crash in between leaves
        both, never neither, and the next mount finishes the job.
        """
        if row.state == DIRTY and not row.remote_key and not row.copy_from:
            return  # not uploaded yet: it will go straight to the final key
        live = self._live(row.ino)
        live.version += 1  # an upload under the old key in flight is abandoned
        unchanged = row.state == DURABLE and not live.modified
        copy_from = row.remote_key if unchanged else row.copy_from if not live.modified else None
        if row.remote_key:
            # the new object first, then delete the old one
            self.journal.queue_delete(row.remote_key, after_ino=row.ino)
        self.journal.update(row.ino, state=DIRTY, version=live.version, remote_key=None, copy_from=copy_from, closed_at=time.time())
        self.journal.forget_upload(row.ino)

    # ---------------------------------------------------------- drain support
    def is_marker(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pat) for pat in self.cfg.commit_markers)

    def _ancestors(self, ino: int, memo: dict[int, int | None]) -> list[int]:
        out = []
        cur: int | None = ino
        while cur is not None and cur != ROOT_INODE:
            if cur not in memo:
                row = self.journal.get(cur)
                memo[cur] = row.parent if row else None
            cur = memo[cur]
            if cur is not None:
                out.append(cur)
        return out

    def candidates(self, now: float, busy: set[int]) -> tuple[list[Pending], float | None]:
        """Files ready to upload, oldest close first, and when the next one becomes ready."""
        rows = [r for r in self.journal.pending_files() if r.parent is not None]
        memo: dict[int, int | None] = {}
        # directories that still hold a non-marker file which is not durable
        blocking_dirs: set[int] = set()
        for r in rows:
            if not self.is_marker(r.name or ""):
                blocking_dirs.update(self._ancestors(r.ino, memo))
        ready: list[Pending] = []
        next_at: float | None = None
        for r in rows:
            if r.ino in busy:
                continue
            live = self.live.get(r.ino)
            urgent = r.ino in self.urgent
            if live is not None and live.writers and not urgent:
                continue
            if self.is_marker(r.name or "") and r.parent in blocking_dirs:
                continue
            closed_at = r.closed_at or 0.0  # never closed but no writer left: due now
            due = closed_at + self.cfg.upload_delay
            if due > now and not urgent:
                next_at = due if next_at is None else min(next_at, due)
                continue
            path = self.journal.path_of(r.ino)
            if path is None:
                continue
            size = live.size if live is not None else r.size
            ready.append(Pending(r.ino, self.key_of(path), size, closed_at))
        ready.sort(key=lambda p: p.closed_at)
        return ready, next_at

    def begin_upload(self, ino: int) -> UploadTicket | None:
        """Snapshot what is about to be uploaded; None if the file is gone or moved away."""
        row = self.journal.get(ino)
        if row is None or row.parent is None or row.state not in (DIRTY, UPLOADING):
            return None
        live = self.live.get(ino)
        if live is not None and live.modified:
            self._persist(ino, closed=live.writers == 0)
            row = self.journal.get(ino)
            assert row is not None
        path = self.journal.path_of(ino)
        if path is None:
            return None
        self.journal.update(ino, state=UPLOADING)
        version = live.version if live is not None else row.version
        return UploadTicket(ino, version, row.size, self.key_of(path), row.closed_at or time.time(), row.copy_from, row.xxh3)

    def still_current(self, ticket: UploadTicket) -> bool:
        """True if publishing `ticket` now would publish the file's current bytes at its current key."""
        row = self.journal.get(ticket.ino)
        if row is None or row.parent is None:
            return False
        live = self.live.get(ticket.ino)
        version = live.version if live is not None else row.version
        if version != ticket.version:
            return False
        return self.journal.path_of(ticket.ino) == self.path_of_key(ticket.key)

    def finish_upload(self, ticket: UploadTicket, etag: str, xxh3: str) -> bool:
        """The object at ticket.key is complete. Make the file durable, or clean up if it moved on."""
        j = self.journal
        if self.still_current(ticket):
            with j.transaction():
                j.update(ticket.ino, state=DURABLE, etag=etag, xxh3=xxh3 or None, remote_key=ticket.key, copy_from=None, seen_at=time.time())
                for ancestor in self._ancestors(ticket.ino, {}):
                    if ancestor != ROOT_INODE:
                        j.update(ancestor, state=DURABLE)  # the bucket now holds something under it
                j.forget_upload(ticket.ino)
            self.urgent.discard(ticket.ino)
            self.on_durable(max(0.0, time.time() - ticket.closed_at))
            self.space_freed()  # a durable file can be evicted to make room
            self.on_change()
            return True
        with j.transaction():
            row = j.get(ticket.ino)
            owner = j.resolve(self.path_of_key(ticket.key))
            if owner is None or owner.ino != ticket.ino:
                j.queue_delete(ticket.key)  # a stale object under a name the file no longer has
            if row is not None and row.state == UPLOADING:
                j.update(ticket.ino, state=DIRTY)
            j.forget_upload(ticket.ino)
        self.on_change()
        return False

    def upload_failed(self, ino: int) -> None:
        row = self.journal.get(ino)
        if row is not None and row.state == UPLOADING:
            self.journal.update(ino, state=DIRTY)

    def ready_deletes(self, busy_keys: set[str]) -> list[tuple[int, str]]:
        """Queued object deletions that may run now; drops those a live file has made moot."""
        out = []
        pending = self.journal.pending_deletes()
        for delete_id, key, after_ino in pending:
            if key in busy_keys:
                continue
            if after_ino is not None:
                waited = self.journal.get(after_ino)
                if waited is not None and waited.parent is not None and waited.state != DURABLE:
                    continue
            owner = self.journal.resolve(self.path_of_key(key))
            if key.endswith("/"):
                if owner is not None and owner.is_dir:
                    self.journal.drop_delete(delete_id)  # the directory exists again: its marker stays
                    continue
                if any(k != key and k.startswith(key) for _, k, _ in pending):
                    continue  # objects under it go first
            if owner is not None and owner.kind == "file":
                if owner.state == DURABLE and owner.remote_key == key:
                    self.journal.drop_delete(delete_id)  # the live file's upload replaced the object
                continue  # its upload will replace the object; wait and see
            out.append((delete_id, key))
        return out

    def delete_done(self, delete_id: int, key: str) -> None:
        self.journal.drop_delete(delete_id)
        now = time.time()
        self.recently_deleted[key] = now
        for k, at in list(self.recently_deleted.items()):
            if now - at > 600:
                del self.recently_deleted[k]

    def ready_markers(self, now: float, busy_keys: set[str]) -> tuple[list[tuple[int, str]], float | None]:
        """Queued `dir/` markers that may be put now, and when the next one will be due.

        Drops those made moot (directory gone, no longer empty, or marked already).
        They wait `upload_delay` like files, so a `step.tmp/` renamed at once never reaches the bucket.
        """
        out = []
        next_at: float | None = None
        for marker_id, key, queued_at in self.journal.pending_markers():
            if key in busy_keys:
                continue
            row = self.journal.resolve(self.path_of_key(key))
            if row is None or not row.is_dir or self.journal.has_children(row.ino):
                self.journal.drop_delete(marker_id)
                continue
            due = queued_at + self.cfg.upload_delay
            if due <= now or time.monotonic() < self.urgent_until:
                out.append((marker_id, key))
            else:
                next_at = due if next_at is None else min(next_at, due)
        return out, next_at

    def copy_source_gone(self, ino: int) -> None:
        """The object a renamed file was to be copied from was deleted behind our back."""
        row = self.journal.get(ino)
        if row is None:
            return
        if row.cached:
            self.journal.update(ino, copy_from=None)  # upload the local copy instead
            return
        log.error("%s: its bytes were only in object %s, which someone deleted from the bucket: the file is lost",
                  self.journal.path_of(ino), row.copy_from)
        self._remove_subtree(row)

    def marker_done(self, marker_id: int, key: str) -> None:
        with self.journal.transaction():
            self.journal.drop_delete(marker_id)
            row = self.journal.resolve(self.path_of_key(key))
            if row is not None and row.is_dir:
                self.journal.update(row.ino, state=DURABLE, seen_at=time.time())

    # ------------------------------------------------------------------ flush
    def _under(self, prefix_path: str, path: str) -> bool:
        return not prefix_path or path == prefix_path or path.startswith(prefix_path + "/")

    def pending_under(self, path: str) -> tuple[int, int, int]:
        """(files, bytes, deletes) not yet durable at or below `path` (mount-relative)."""
        files = size = 0
        for r in self.journal.pending_files():
            p = self.journal.path_of(r.ino)
            if p is not None and self._under(path, p):
                files += 1
                live = self.live.get(r.ino)
                size += live.size if live else r.size
        deletes = sum(1 for _, key, _ in self.journal.pending_deletes() if self._under(path, self.path_of_key(key)))
        deletes += sum(1 for _, key, _ in self.journal.pending_markers() if self._under(path, self.path_of_key(key).rstrip("/")))
        return files, size, deletes

    def mark_urgent(self, path: str) -> None:
        self.urgent_until = time.monotonic() + 2.0
        for r in self.journal.pending_files():
            p = self.journal.path_of(r.ino)
            if p is not None and self._under(path, p):
                self.urgent.add(r.ino)
        self.on_change()

    def stats(self) -> dict[str, float]:
        rows = self.journal.pending_files()
        now = time.time()
        dirty_bytes = 0
        oldest = 0.0
        uploading = 0
        in_cache = {DIRTY: 0, UPLOADING: 0}  # bytes of those files held in the cache (a renamed remote file has none)
        for r in rows:
            live = self.live.get(r.ino)
            dirty_bytes += live.size if live else r.size
            if r.cached:
                in_cache[r.state or DIRTY] += live.size if live else r.size
            if r.state == UPLOADING:
                uploading += 1
            if r.closed_at:
                oldest = max(oldest, now - r.closed_at)
        return {
            "dirty_files": len(rows),
            "dirty_bytes": dirty_bytes,
            "uploading_files": uploading,
            "oldest_dirty_age_seconds": round(oldest, 3),
            "cache_dirty_bytes": in_cache[DIRTY],
            "cache_uploading_bytes": in_cache[UPLOADING],
            "pending_deletes": len(self.journal.pending_deletes()),
            "pending_markers": len(self.journal.pending_markers()),
            "remote_removed_total": self.remote_removed_total,
            "remote_changed_total": self.remote_changed_total,
            "stalled_writers": self.stalled_writers,
            "evicted_files_total": self.evicted_files_total,
            "evicted_bytes_total": self.evicted_bytes_total,
            "write_stalls_total": self.write_stalls_total,
            "write_stall_seconds_total": round(self.write_stall_seconds_total, 3),
            "enospc_total": self.enospc_total,
        }
