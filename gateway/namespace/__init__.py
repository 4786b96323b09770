"""The tree the mount shows, and how every change to it reaches the bucket.

One room per concern, each owning its state, built in this order (each may
use only the ones before it):

* `backlog` Backlog      the files not yet durable, in memory: counts per directory, the drain's order
* `deletes` DeleteQueue  the object deletions queued in the journal, in memory
* `files`   OpenFiles    in-memory state of files in use (size, version, handles)
* `space`   Space        eviction of clean copies, writers waiting for room
* `uploads` UploadQueue  what is uploaded, copied, deleted or marked when; flush
* `tree`    Tree         names and inodes: create, mkdir, unlink, rmdir, rename
* `merge`   ListingMerge a bucket listing overlaid on the tree
* `archive` Archive      objects in a storage class that may need a restore (from listings, HEAD)

`Namespace` only builds and holds them, recovers the journal at start-up and
gathers their statistics; callers use the rooms directly (`ns.tree.rename`).
"""

from __future__ import annotations

import time
from typing import Callable

from ..cache import Cache
from ..config import Config
from ..journal import DIRTY, Journal
from .archive import Archive
from .backlog import Backlog
from .deletes import DeleteQueue
from .files import Live, OpenFiles
from .keys import Keys
from .merge import ListingMerge
from .space import Space, under
from .tree import NAME_MAX, Tree, valid_name
from .uploads import Pending, UploadQueue, UploadTicket

__all__ = ["Namespace", "Live", "Pending", "UploadTicket", "NAME_MAX", "valid_name", "under"]


class Namespace:
    def __init__(self, cfg: Config, journal: Journal, cache: Cache) -> None:
        self.cfg, self.journal, self.cache = cfg, journal, cache
        self.on_change: Callable[[], None] = lambda: None  # the drainer's wake-up
        self.keys = Keys(cfg.key_prefix)
        self.backlog = Backlog(journal, cfg.commit_markers, cfg.upload_delay, cfg.temporary_dir_patterns, cfg.temporary_hold_seconds)
        self.files = OpenFiles(cfg, journal, cache, self.backlog)
        self.space = Space(cfg, journal, cache, self.backlog, self.files, self._changed)
        self.deletes = DeleteQueue(journal)
        self.uploads = UploadQueue(cfg, journal, self.keys, self.backlog, self.deletes, self.files, self.space, self._changed)
        self.tree = Tree(journal, cache, self.backlog, self.files, self.space, self.uploads, self._changed)
        self.archive = Archive()
        self.merge = ListingMerge(journal, self.keys, cache, self.files, self.space, self.tree, self.uploads, self.archive)

    def _changed(self) -> None:
        self.on_change()

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
        self.backlog.load()  # the one read of every file not yet durable; kept up to date in memory from here

    def stats(self) -> dict[str, float]:
        return {**self.uploads.stats(), **self.merge.stats(), **self.space.stats()}
