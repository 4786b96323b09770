"""Merging a bucket listing into the tree: what other nodes and tools did shows up here.

Local changes always win. New objects and prefixes become entries (files
durable and not cached); a clean entry whose object is gone disappears; one
whose ETag changed loses its cached copy so the next open fetches the new
bytes. An entry the bucket confirmed (or this node created) after the listing
started is kept: the listing is older than it. Keys this node is deleting, or
deleted after the listing started, are not brought back, and neither is a
directory (a common prefix) with such a key under it: a listing that started
before an `rm -rf` finished shows prefixes that are empty by the time it is
merged. Such a directory created elsewhere meanwhile shows up with the next
listing.

Listings can be merged out of order (a directory's own listing and a recursive
listing of a tree above it run at once), and an older one must not undo what a
newer one showed. What the journal writes per entry (`seen_at`) is only what a
listing or an upload changed: an entry inserted, an object replaced, a file made
durable. That an unchanged entry was confirmed again is kept in memory, per
directory, not written per row: a listing of an unchanged 10,000-entry directory
would otherwise rewrite 10,000 rows on the trio thread at every `metadata_ttl`.
Per directory is enough because every entry is confirmed by a listing of its
own directory: once a listing of a directory that started at t is merged, one
that started before t says nothing about that directory that the newer one did
not say better (what it shows and the newer one does not is gone or being
deleted; what it lacks and the newer one shows was created meanwhile), so it is
dropped whole. The one confirmation that comes from another directory's listing
is a subdirectory's own (its `dir/` marker or anything under it), kept per
directory too. In memory is enough because no listing outlives the process: after
a restart every listing merged starts after the journal's last write.

The kernel caches what it was told of a name (its entry, its attributes, its pages) for a while
without asking again: a name removed or an object replaced here would still answer a `stat` until
that expires, while `ls` already shows the bucket's truth. Every name the merge removes, and every
entry whose object it replaces, is told to the subscribers of `on_removed` / `on_replaced` (the
daemon makes the kernel forget them). Lists of subscribers, so a second one never silently
replaces the first; each is called on the trio thread, in the merge, and must not block: the merge
may run while a request on the same directory waits for it (the daemon queues the invalidation and
sends it from a task of its own).
"""

from __future__ import annotations

import logging
import math
import os
import stat
import time
from typing import Callable

from ..cache import Cache
from ..journal import DURABLE, ROOT_INODE, Journal, Row
from ..objects import Listing
from .archive import Archive
from .files import OpenFiles
from .keys import Keys, is_reserved
from .space import Space
from .tree import Tree, valid_name
from .uploads import UploadQueue

log = logging.getLogger(__name__)


class ListingMerge:
    def __init__(self, journal: Journal, keys: Keys, cache: Cache, files: OpenFiles, space: Space, tree: Tree,
                 uploads: UploadQueue, archive: Archive | None = None) -> None:
        self.journal, self.keys, self.cache = journal, keys, cache
        self.archive = archive or Archive()  # storage classes that may need a restore, learnt from listings
        self.files, self.space, self.tree, self.uploads = files, space, tree, uploads
        self.remote_removed_total = 0  # entries gone from the bucket (deleted by another node)
        self.remote_changed_total = 0  # objects replaced in the bucket by another node
        self.merged_at: dict[int, float] = {}  # directory inode -> start of the newest listing of it merged
        self.shown_at: dict[int, float] = {}  # directory inode -> start of the newest listing of it that showed it exists
        # told (parent inode, name) of every entry removed, and (inode) of every entry whose object was replaced
        self.on_removed: list[Callable[[int, str], None]] = []
        self.on_replaced: list[Callable[[int], None]] = []

    def merge(self, dir_ino: int, started_at: float, listing: Listing) -> None:
        """Overlay one directory's bucket listing (taken from `started_at`) on the journal."""
        j = self.journal
        # (a newer one "in the future" is a wall clock stepped back: not a reason to drop listings until it catches up)
        if started_at < self.merged_at.get(dir_ino, -math.inf) <= time.time():
            log.debug("listing of directory %d (started %.3f) dropped: one that started at %.3f was merged", dir_ino,
                      started_at, self.merged_at[dir_ino])
            return
        dpath = j.path_of(dir_ino)
        if dpath is None:
            return
        self.merged_at[dir_ino] = started_at
        if listing.marker or listing.dirs or listing.objects:
            self.shown_at[dir_ino] = started_at
        base = self.keys.of(dpath + "/" if dpath else "")
        pending = j.pending_keys()
        recent = {k for k, at in self.uploads.recently_deleted.items() if at >= started_at}
        # subdirectories with something under them deleted since the listing started, or about to be:
        # the listing may show the prefix of objects that are gone by now (`rm -rf` while it ran)
        emptied: set[str] = set()
        for k in pending | recent:
            if k.startswith(base):
                first, sep, _ = k[len(base):].partition("/")
                if sep:
                    emptied.add(first)

        def skip(key: str) -> bool:
            return key in pending or key in recent

        uid, gid = os.getuid(), os.getgid()
        children = {r.name: r for r in j.children(dir_ino)}
        seen: set[str] = set()
        with j.transaction():
            here = j.get(dir_ino) if listing.marker and dir_ino != ROOT_INODE else None
            if here is not None and here.state != DURABLE:
                j.update(dir_ino, state=DURABLE, seen_at=max(started_at, here.seen_at or 0))
            for name in listing.dirs:
                if not valid_name(name) or is_reserved(name):
                    continue
                if name in emptied and name not in children:
                    continue  # being emptied by this node, or emptied since the listing started
                seen.add(name)
                row = children.get(name)
                if row is None:
                    j.insert(dir_ino, name, "dir", stat.S_IFDIR | 0o755, uid, gid, DURABLE, seen_at=started_at)
            for obj in listing.objects:
                if "/" in obj.name or not valid_name(obj.name) or is_reserved(obj.name):
                    continue
                key = base + obj.name
                if skip(key):
                    continue
                seen.add(obj.name)
                self.archive.listed(key, obj.storage_class)
                row = children.get(obj.name)
                mtime_ns = int(obj.mtime * 1e9)
                if row is None:
                    j.insert(dir_ino, obj.name, "file", stat.S_IFREG | 0o644, uid, gid, DURABLE, size=obj.size,
                             mtime_ns=mtime_ns, ctime_ns=mtime_ns, etag=obj.etag, remote_key=key, cached=0, seen_at=started_at)
                    continue
                if row.is_dir or row.state != DURABLE:
                    continue  # local changes win
                if row.etag == obj.etag:
                    continue  # unchanged: nothing to write (see the module's docstring)
                if (row.seen_at or 0) > started_at or self.files.in_use(row.ino):
                    continue  # newer than the listing, or open: look again next time
                # replaced by someone else: forget the old bytes
                log.info("object %s changed in the bucket (etag %s -> %s): the next open fetches it", key, row.etag, obj.etag)
                if row.cached:
                    self.cache.remove(row.ino, row.size)
                j.update(row.ino, size=obj.size, mtime_ns=mtime_ns, ctime_ns=mtime_ns, etag=obj.etag, xxh3=None,
                         remote_key=key, cached=0, seen_at=started_at, version=row.version + 1)
                self.files.live.pop(row.ino, None)
                self.remote_changed_total += 1
                self._tell(self.on_replaced, row.ino)
            for name, row in children.items():
                if name in seen or (row.seen_at or 0) > started_at or self.shown_at.get(row.ino, -math.inf) > started_at:
                    continue  # in the listing, or confirmed after it started (inserted, uploaded, or listed itself)
                if not self._removable(row):
                    continue
                log.info("%s is gone from the bucket: removing it from the mount", base + name)
                self.tree.remove_subtree(row)
                self.remote_removed_total += 1
                self._tell(self.on_removed, dir_ino, name)
        self.space.freed()

    @staticmethod
    def _tell(subscribers: list[Callable[..., None]], *args: object) -> None:
        """Call every subscriber; one that fails is logged and does not undo the merge or skip the others."""
        for fn in subscribers:
            try:
                fn(*args)
            except Exception:
                log.exception("telling %r of a listing's change", fn)

    def _removable(self, row: Row) -> bool:
        """True if nothing of `row` (or below it) is local work the bucket has not seen yet."""
        if not row.is_dir:
            return row.state == DURABLE and not self.files.in_use(row.ino)
        if row.state != DURABLE and any(self.keys.path(k).rstrip("/") == self.journal.path_of(row.ino)
                                        for _, k, _ in self.journal.pending_markers()):
            return False
        return all(self._removable(r) for r in self.journal.children(row.ino))

    def stats(self) -> dict[str, float]:
        return {"remote_removed_total": self.remote_removed_total, "remote_changed_total": self.remote_changed_total}
