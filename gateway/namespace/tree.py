"""The directory tree: names, inodes and the kernel's references to them.

The journal holds the tree; this room applies the POSIX rules to it (create,
mkdir, unlink, rmdir, rename, attributes) and tells the upload queue what each
change means for the bucket. A rename is one journal transaction, whatever it
moves. An unlinked inode stays until neither the kernel (lookup count) nor an
open handle refers to it, then its cache file goes.

Synchronous, on the trio thread. Errors are `OSError(errno)` for the FS to map.
"""

from __future__ import annotations

import errno
import logging
import stat
import time
from typing import Callable

from ..cache import Cache
from ..hooks import Hook
from ..journal import DIRTY, ROOT_INODE, Journal, Row
from .backlog import Backlog
from .files import OpenFiles
from .keys import PROBE_NAME_PREFIX
from .space import Space
from .uploads import UploadQueue, keys_left_while_away

log = logging.getLogger(__name__)

NAME_MAX = 255


def valid_name(name: str) -> bool:
    """Object keys that cannot be a POSIX name ('a//b', '.', '..', too long), or ckptfs's probes, are not shown."""
    return bool(name) and name not in (".", "..") and len(name.encode()) <= NAME_MAX and not name.startswith(PROBE_NAME_PREFIX)


class Tree:
    def __init__(self, journal: Journal, cache: Cache, backlog: Backlog, files: OpenFiles, space: Space, uploads: UploadQueue,
                 on_change: Callable[[], None]) -> None:
        self.journal, self.cache, self.backlog, self.files, self.space, self.uploads = journal, cache, backlog, files, space, uploads
        self._on_change = on_change
        # files whose path changed (renamed, moved with a directory, unlinked, replaced): peers/sender.py tells the peers
        self.on_paths_changed: Hook[[list[int]]] = Hook()
        self.lookups: dict[int, int] = {}

    # ---------------------------------------------------------------- lookups
    def lookup(self, parent: int, name: str) -> Row:
        row = self.journal.lookup(parent, name)
        if row is None:
            raise OSError(errno.ENOENT, name)
        return self.files.row(row.ino)

    def children(self, parent: int, offset: int = 0, limit: int = -1) -> list[Row]:
        """Entries of `parent` by name (a page: `limit` from the `offset`-th), files in use with their in-memory state."""
        return [self.files.row(r.ino) if r.ino in self.files.live else r for r in self.journal.children(parent, offset, limit)]

    def ref(self, ino: int, n: int = 1) -> None:
        """The kernel now holds `n` more references to `ino` (lookup count)."""
        self.lookups[ino] = self.lookups.get(ino, 0) + n

    def forget(self, ino: int, n: int) -> None:
        left = self.lookups.get(ino, 0) - n
        if left > 0:
            self.lookups[ino] = left
            return
        self.lookups.pop(ino, None)
        self.reap(ino)

    def reap(self, ino: int) -> None:
        """Drop an unlinked inode once neither the kernel nor an open handle refers to it."""
        live = self.files.live.get(ino)
        if ino == ROOT_INODE or self.lookups.get(ino) or (live is not None and live.handles):
            return
        row = self.journal.get(ino)
        if row is None or row.parent is not None:
            self.files.forget_if_idle(ino)
            return
        self.files.live.pop(ino, None)
        if row.kind == "file":
            self.cache.remove(ino, row.size)
            self.space.freed()
        self.journal.delete(ino)

    # --------------------------------------------------------------- creation
    def _check_name(self, parent: int, name: str, below: int = 0) -> Row:
        if len(name.encode()) > NAME_MAX:
            raise OSError(errno.ENAMETOOLONG, name)
        prow = self.journal.get(parent)
        if prow is None or prow.parent is None and parent != ROOT_INODE:
            raise OSError(errno.ENOENT, "parent directory was removed")
        if not prow.is_dir:
            raise OSError(errno.ENOTDIR, name)
        if self.journal.lookup(parent, name) is not None:
            raise OSError(errno.EEXIST, name)
        self.uploads.keys.check_new(self.journal.path_of(parent) or "", name, below)
        return prow

    def _key_bytes_below(self, row: Row) -> int:
        """Bytes the longest object key under `row` adds to `row`'s own key (a file: 0; a directory: at least its `/`)."""
        if not row.is_dir:
            return 0
        rows = self.journal.descendants(row.ino)
        by_ino = {r.ino: r for r in rows}
        lengths = {row.ino: 0}
        longest = 1  # its own `dir/` marker

        def length(r: Row) -> int:
            if r.ino not in lengths:
                parent = by_ino.get(r.parent) if r.parent is not None else None
                lengths[r.ino] = (length(parent) if parent is not None else 0) + 1 + len((r.name or "").encode())
            return lengths[r.ino]

        for r in rows:
            longest = max(longest, length(r) + (1 if r.is_dir else 0))
        return longest

    def create(self, parent: int, name: str, mode: int, uid: int, gid: int, closed: bool = False) -> Row:
        """A new empty file; `closed` if no handle is opened on it (mknod), so it is eligible at once."""
        self._check_name(parent, name)
        with self.journal.transaction():
            # its LRU atime (OpenFiles.open) in the same commit as the row
            row = self.journal.insert(parent, name, "file", stat.S_IFREG | (mode & 0o7777), uid, gid, DIRTY, atime=time.time())
            self.cache.create(row.ino)
            self._touch_dir(parent)
            if closed:
                self.journal.update(row.ino, closed_at=time.time())
        self.backlog.changed(row.ino)
        if not closed:
            self.files.started(row)
        else:
            self.files.on_bytes(row.ino, 0, 0)  # an empty file made by mknod: the peers hold it too
            self._on_change()
        return row

    def mkdir(self, parent: int, name: str, mode: int, uid: int, gid: int) -> Row:
        self._check_name(parent, name, below=1)  # its `dir/` marker
        with self.journal.transaction():
            row = self.journal.insert(parent, name, "dir", stat.S_IFDIR | (mode & 0o7777), uid, gid, None)
            self._touch_dir(parent)
            self.uploads.marker_if_empty(row.ino)
        self._on_change()
        return row

    def _touch_dir(self, ino: int) -> None:
        now = time.time_ns()
        self.journal.update(ino, mtime_ns=now, ctime_ns=now)

    def setattr(self, ino: int, mode: int | None, uid: int | None, gid: int | None, atime_ns: int | None, mtime_ns: int | None,
                kill_priv: bool = False) -> None:
        """`kill_priv`: drop setuid/setgid as a write by an unprivileged user would (`_priv_bits`), in the same
        journal write as the other changes: a chown is never half done (its group changed, its bits kept)."""
        row = self.files.row(ino)
        fields: dict[str, object] = {}
        if mode is not None:
            fields["mode"] = (row.mode & ~0o7777) | (mode & 0o7777)
        elif kill_priv and row.kind == "file" and (drop := _priv_bits(row.mode)):
            fields["mode"] = row.mode & ~drop
        if uid is not None:
            fields["uid"] = uid
        if gid is not None:
            fields["gid"] = gid
        if mtime_ns is not None:
            fields["mtime_ns"] = mtime_ns
        if atime_ns is not None:
            fields["atime_ns"] = atime_ns
        if fields:
            fields["ctime_ns"] = now = time.time_ns()
            self.journal.update(ino, **fields)
            self.files.set_times(ino, now, mtime_ns)

    def kill_priv(self, ino: int) -> None:
        """A write by a user without the privilege to keep them: drop setuid (and setgid of a group-executable file)."""
        row = self.journal.get(ino)
        if row is None or row.kind != "file":
            return
        drop = _priv_bits(row.mode)
        if drop:
            now = time.time_ns()
            self.journal.update(ino, mode=row.mode & ~drop, ctime_ns=now)
            self.files.set_times(ino, now)

    # ---------------------------------------------------------------- removal
    def _detach(self, row: Row) -> None:
        """Take `row` out of the tree; its inode lives on until the kernel and its handles let go."""
        now = time.time_ns()  # its link count changed
        self.journal.update(row.ino, parent=None, name=None, remote_key=None, state=None, ctime_ns=now)
        self.backlog.changed(row.ino)
        self.files.set_times(row.ino, now)

    def unlink(self, parent: int, name: str) -> None:
        row = self.journal.lookup(parent, name)
        if row is None:
            raise OSError(errno.ENOENT, name)
        if row.is_dir:
            raise OSError(errno.EISDIR, name)
        with self.journal.transaction():
            self.uploads.drop_object(row)
            self._detach(row)
            self._touch_dir(parent)
            self.uploads.marker_if_empty(parent)
        self.reap(row.ino)
        self.on_paths_changed([row.ino])
        self._on_change()

    def rmdir(self, parent: int, name: str) -> None:
        row = self.journal.lookup(parent, name)
        if row is None:
            raise OSError(errno.ENOENT, name)
        if not row.is_dir:
            raise OSError(errno.ENOTDIR, name)
        if self.journal.has_children(row.ino):
            raise OSError(errno.ENOTEMPTY, name)
        with self.journal.transaction():
            self.uploads.drop_marker(row)
            self.journal.update(row.ino, parent=None, name=None)
            self._touch_dir(parent)
            self.uploads.marker_if_empty(parent)
        self.reap(row.ino)
        self._on_change()

    def remove_subtree(self, row: Row) -> None:
        """Forget `row` and everything below it locally (the bucket no longer has them)."""
        for child in self.journal.children(row.ino) if row.is_dir else []:
            self.remove_subtree(child)
        if row.kind == "file" and row.cached:
            self.cache.remove(row.ino, row.size)
        self._detach(row)
        self.reap(row.ino)

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
        self.remove_subtree(row)

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
        # every key that moves must fit: a directory's whole subtree, looked at here or not (fs lists it first)
        self.uploads.keys.check_new(j.path_of(new_parent) or "", new_name, self._key_bytes_below(src))
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
        self.uploads.renamed()  # paths move: tickets of uploads in flight look at theirs again
        with j.transaction():
            moved = [src] if not src.is_dir else [src, *j.descendants(src.ino)]
            away = keys_left_while_away(self.uploads, moved)  # their old keys, while paths still give them
            if dst is not None:
                if dst.is_dir:
                    self.uploads.drop_marker(dst)
                    j.update(dst.ino, parent=None, name=None)
                else:
                    self.uploads.drop_object(dst)
                    self._detach(dst)
            for row in moved:
                if row.is_dir:
                    self.uploads.drop_marker(row)  # still at its old path here
            now = time.time_ns()
            j.update(src.ino, parent=new_parent, name=new_name, ctime_ns=now)
            self.files.set_times(src.ino, now)
            for row in moved:
                if row.is_dir:
                    j.update(row.ino, state=None)
                    self.uploads.marker_if_empty(row.ino)
                else:
                    self.uploads.requeue_moved(row, away.get(row.ino))
            self._touch_dir(old_parent)
            self.uploads.marker_if_empty(old_parent)
            if new_parent != old_parent:
                self._touch_dir(new_parent)
        if dst is not None:
            self.reap(dst.ino)
        self.on_paths_changed([row.ino for row in moved if not row.is_dir] + ([dst.ino] if dst is not None and not dst.is_dir else []))
        self._on_change()


def _priv_bits(mode: int) -> int:
    """The bits an unprivileged write, truncate or chown drops: setuid, and setgid of a group-executable file."""
    return (stat.S_ISUID if mode & stat.S_ISUID else 0) | (stat.S_ISGID if mode & stat.S_ISGID and mode & stat.S_IXGRP else 0)
