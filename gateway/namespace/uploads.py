"""The upload queue: which change reaches the bucket when, and whether a finished upload still counts.

Everything that leaves the node goes through here: files ready to upload
(after `upload_delay`, no writer left, commit markers after the rest of their
directory, oldest close first; taken from the in-memory `Backlog`, so choosing costs
the same however many files wait), the tickets that snapshot a file for an upload,
the object deletions and `dir/` markers queued in the journal, and what a
flush waits for. The rules:

* an upload is published only if the file's version and path are still the
  ones its ticket saw; otherwise the file is re-queued (`still_current`);
* a file renamed before its upload goes straight to its final key; a durable
  file renamed is copied inside the store (or uploaded again if it changed),
  and its old object is deleted only once the new one is complete;
* a file renamed while it uploads, its bytes unchanged, keeps its upload: it
  completes under the key it started with, is then copied inside the store to
  the new key and the old object deleted (`finish_upload`), so no byte already
  sent is sent again (a multipart upload cannot change its key);
* deleting an object waits while another live file owns the same key and is
  not yet durable (its upload will replace the object).

Synchronous, on the trio thread; the drainer (drain.py) does the I/O.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Container

from ..config import Config
from ..hooks import Hook
from ..journal import DIRTY, DURABLE, OWN_OBJECT_ONLY, ROOT_INODE, UPLOADING, Journal, Row
from .backlog import Backlog, Waiting
from .deletes import DeleteQueue
from .files import OpenFiles
from .keys import Keys
from .space import Space, under

log = logging.getLogger(__name__)

RECENT_DELETE_SECONDS = 600


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
    renames: int = -1  # UploadQueue.renames when taken: none since, and `key` is still `named`, so the file is still at it
    named: str = ""  # the key of the file's path when taken (the drainer may switch `key` to an older upload's)


class UploadQueue:
    def __init__(self, cfg: Config, journal: Journal, keys: Keys, backlog: Backlog, deletes: DeleteQueue, files: OpenFiles,
                 space: Space, on_change: Callable[[], None]) -> None:
        self.cfg, self.journal, self.keys, self.backlog, self.files, self.space = cfg, journal, keys, backlog, files, space
        self.deletes = deletes
        self._on_change = on_change
        self.on_durable: Callable[[float], None] = lambda seconds: None
        self.on_settled: Callable[[str], None] = lambda key: None  # a key became durable or was deleted (lifecycle tracker)
        # a takeover may be uploading this node's files now (peers wire it): keys never-uploaded files leave get cleaned
        self.away: Callable[[], bool] = lambda: False
        # (ino, version): that version of a file is durable (peers/sender.py: its peers may drop their replicas)
        self.on_file_durable: Hook[[int, int]] = Hook()
        # before a file is made durable or published by a copy: stop writes the journal does not see
        # coming (the copy workers'); False if one may have changed the bytes uploaded (fs.py)
        self.stop_fast_writes: Callable[[int], bool] = lambda ino: True
        # flushes running (each poll renews its entry): path -> (until, monotonic; queued before, wall clock).
        # Their directory markers go out at once: only those under the path that were queued when it last asked,
        # so a save that starts right after a flush keeps its own markers (a temporary directory's) held back
        self.urgent_markers: dict[str, tuple[float, float]] = {}
        # keys this node deleted lately, with when: a listing that started before must not resurrect them
        self.recently_deleted: dict[str, float] = {}
        # objects ckptfs keeps inside a directory (a checkpoint's manifest...): they leave with it
        self.own_objects: Callable[[str], list[str]] = lambda path: []
        # renames so far: only a rename moves a file that exists, so a ticket taken since the last one
        # still names its file's path, and no other file can hold that name (no path walk per upload)
        self.renames = 0

    def renamed(self) -> None:
        """A rename is about to move entries (Tree.rename): tickets taken before it check their paths again."""
        self.renames += 1

    def _unmoved(self, ticket: UploadTicket) -> bool:
        """No rename since `ticket` was taken, and it still uploads under the key of the path it was taken at."""
        return ticket.renames == self.renames and ticket.key == ticket.named

    # ------------------------------------------------- what a tree change queues
    def marker_if_empty(self, ino: int) -> None:
        """An empty directory exists in the bucket only as a `dir/` marker object: queue one."""
        if ino == ROOT_INODE or self.journal.has_children(ino):
            return
        path = self.journal.path_of(ino)
        if path is not None:
            self.journal.queue_marker(self.keys.of(path) + "/")

    def drop_marker(self, row: Row) -> None:
        """A directory leaving its path: its `dir/` object must go, if the bucket may have one.

        A directory's state is DURABLE once the bucket holds anything under it
        (its marker, or a file's object). Deleting `dir/` also removes what some
        stores (SeaweedFS) keep of a directory after its last object is gone; it
        runs after the deletes of everything under it (see `ready_deletes`).
        """
        path = self.journal.path_of(row.ino)
        if path is not None and row.state == DURABLE:
            for name in self.own_objects(path):
                self.journal.queue_delete(self.keys.of(f"{path}/{name}"))
            self.journal.queue_delete(self.keys.of(path) + "/")

    def drop_object(self, row: Row) -> None:
        """The object of a file that leaves the tree must leave the bucket; an upload in flight is abandoned."""
        if row.remote_key:
            self.journal.queue_delete(row.remote_key, etag=row.etag)
        elif self.away() and (key := key_never_uploaded(self, row)) is not None:
            self.journal.queue_delete(key, etag=OWN_OBJECT_ONLY)  # what a takeover made of it, if any
        self.files.abandon_upload(row.ino)
        self.journal.forget_upload(row.ino)

    def requeue_moved(self, row: Row, left_while_away: str | None = None) -> None:
        """A moved file must end up under its new key; nothing to do if it was never uploaded.

        A durable file whose bytes are still exactly its object's is copied inside
        the store (no byte through this node, and it need not be cached); a file
        changed since is uploaded from the cache. Either way the old object is
        deleted only once the new one is complete, so a crash in between leaves
        both, never neither, and the next mount finishes the job.
        """
        self.backlog.changed(row.ino)  # counted under its new directories from now
        if left_while_away is not None:
            self.journal.queue_delete(left_while_away, after_ino=row.ino, etag=OWN_OBJECT_ONLY)
        if row.state == DIRTY and not row.remote_key and not row.copy_from:
            return  # not uploaded yet: it will go straight to the final key
        live = self.files.get(row.ino)
        if row.state == UPLOADING and not row.copy_from and not live.modified:
            if row.remote_key:  # an older version's object at the old key goes once the new one is complete
                self.journal.queue_delete(row.remote_key, after_ino=row.ino, etag=row.etag)
                self.journal.update(row.ino, remote_key=None)
            return  # its upload goes on under the old key and is copied when done (finish_upload)
        live.version += 1  # an upload under the old key in flight is abandoned
        unchanged = row.state == DURABLE and not live.modified
        copy_from = row.remote_key if unchanged else row.copy_from if not live.modified else None
        if row.remote_key:
            # the new object first, then delete the old one
            self.journal.queue_delete(row.remote_key, after_ino=row.ino, etag=row.etag)
        self.journal.update(row.ino, state=DIRTY, version=live.version, remote_key=None, copy_from=copy_from, closed_at=time.time())
        self.journal.forget_upload(row.ino)

    # ------------------------------------------------------------------ files
    def _size(self, e: Waiting) -> int:
        live = self.files.live.get(e.ino)
        return live.size if live is not None else e.size

    def _writers_hold(self, e: Waiting) -> bool:
        """Open for writing, and no flush asked for it: it goes once its last writer closes it."""
        live = self.files.live.get(e.ino)
        return live is not None and live.writers > 0 and not e.urgent

    def _as_pending(self, e: Waiting) -> Pending | None:
        path = self.journal.path_of(e.ino)
        return None if path is None else Pending(e.ino, self.keys.of(path), self._size(e), e.closed_at)

    def take(self, now: float, limit: int, busy_keys: set[str]) -> tuple[list[Pending], float | None]:
        """Up to `limit` files ready to upload, oldest close first, and when the next one becomes due.

        Each file returned is the drainer's until it hands it back (`upload_ended`). Costs
        the files changed since the last call plus the files returned, not the files waiting.
        """
        b = self.backlog
        b.reconcile()
        b.release_due(now)
        out: list[Pending] = []
        busy: list[Waiting] = []
        while len(out) < limit and (e := b.pop_ready()) is not None:
            if self._writers_hold(e):
                continue  # queued again when its last writer closes it (or a flush asks for it)
            if e.marker and b.blocking_in(e.parent):
                b.hold_marker(e)  # queued again once nothing else waits under its directory
                continue
            p = self._as_pending(e)
            if p is None:
                continue
            if p.key in busy_keys:
                busy.append(e)  # a delete or upload of the same key runs: after it
                continue
            b.take(e.ino)
            out.append(p)
        for e in busy:
            b.put_back(e)
        return out, b.next_due()

    def upload_ended(self, ino: int, retry_at: float = 0.0) -> None:
        """The drainer is done with `ino` (durable, failed, abandoned or gone); a failed one waits until `retry_at`."""
        self.backlog.give_back(ino, retry_at)

    def candidates(self, now: float, busy: set[int]) -> tuple[list[Pending], float | None]:
        """Every file ready to upload now, oldest close first, and when the next one becomes ready.

        A scan of the whole backlog that changes nothing, for inspection and tests; the drainer uses `take`.
        """
        b = self.backlog
        ready: list[Pending] = []
        next_at: float | None = None
        for e in b.entries():
            if e.ino in busy or b.is_taken(e.ino) or self._writers_hold(e) or (e.marker and b.blocking_in(e.parent)):
                continue
            due = b.due_at(e)
            if due > now:
                next_at = due if next_at is None else min(next_at, due)
                continue
            p = self._as_pending(e)
            if p is not None:
                ready.append(p)
        ready.sort(key=lambda p: p.closed_at)
        return ready, next_at

    def begin_upload(self, ino: int) -> UploadTicket | None:
        """Snapshot what is about to be uploaded; None if the file is gone or moved away."""
        row = self.journal.get(ino)
        if row is None or row.parent is None or row.state not in (DIRTY, UPLOADING):
            return None
        live = self.files.live.get(ino)
        if live is not None and live.modified:
            self.files.persist(ino, closed=live.writers == 0)
            row = self.journal.get(ino)
            assert row is not None
        path = self.journal.path_of(ino)
        if path is None:
            return None
        self.journal.update(ino, state=UPLOADING)
        self.backlog.changed(ino)
        version = live.version if live is not None else row.version
        key = self.keys.of(path)
        return UploadTicket(ino, version, row.size, key, row.closed_at or time.time(), row.copy_from, row.xxh3,
                            renames=self.renames, named=key)

    def bytes_current(self, ticket: UploadTicket) -> bool:
        """True while the file still exists with the bytes `ticket` uploads, wherever it is now, and still needs them
        uploaded: one made durable meanwhile by another node's upload (`durable_elsewhere`) does not."""
        row = self.journal.get(ticket.ino)
        if row is None or row.parent is None or row.state == DURABLE:
            return False
        live = self.files.live.get(ticket.ino)
        return (live.version if live is not None else row.version) == ticket.version

    def publishable(self, ticket: UploadTicket) -> bool:
        """True if the upload of `ticket` may go on: the file's bytes unchanged, and ticket.key its name or a
        name nothing here has now (a file renamed while it uploads keeps its upload; one whose old name was
        taken by another file does not: that file's upload owns the key)."""
        if not self.bytes_current(ticket):
            return False
        if self._unmoved(ticket):
            return True  # the file is at ticket.key: no other file has the name
        path = self.keys.path(ticket.key)
        owner = self.journal.resolve(path)
        return owner is None or owner.ino == ticket.ino

    def still_current(self, ticket: UploadTicket) -> bool:
        """True if publishing `ticket` now would publish the file's current bytes at its current key."""
        if not self.bytes_current(ticket):
            return False
        return self._unmoved(ticket) or self.journal.path_of(ticket.ino) == self.keys.path(ticket.key)

    def finish_upload(self, ticket: UploadTicket, etag: str, xxh3: str) -> bool:
        """The object at ticket.key is complete. Make the file durable (True), or clean up if it moved on.

        A file that was only renamed meanwhile has its bytes in that object: it is queued to be
        copied inside the store to its new key (`moved_meanwhile`); a file changed or removed
        has its upload dropped."""
        j = self.journal
        quiet = self.stop_fast_writes(ticket.ino)
        current = quiet and self.still_current(ticket)
        if not current and quiet and self.publishable(ticket):
            self.moved_meanwhile(ticket, xxh3)
            return False
        if current:
            with j.transaction():
                j.update(ticket.ino, state=DURABLE, etag=etag, xxh3=xxh3 or None, remote_key=ticket.key, copy_from=None, seen_at=time.time())
                j.ancestors_durable(ticket.ino)  # the bucket now holds something under them
                j.forget_upload(ticket.ino)
            self.backlog.changed(ticket.ino)
            self.on_durable(max(0.0, time.time() - ticket.closed_at))
            self.on_settled(ticket.key)
            self.on_file_durable(ticket.ino, ticket.version)
            self.space.freed()  # a durable file can be evicted to make room
            self._on_change()
            return True
        with j.transaction():
            row = j.get(ticket.ino)
            owner = j.resolve(self.keys.path(ticket.key))
            if owner is None or owner.ino != ticket.ino:
                j.queue_delete(ticket.key, etag=etag)  # a stale object under a name the file no longer has
            if row is not None and row.state == UPLOADING:
                j.update(ticket.ino, state=DIRTY)
            j.forget_upload(ticket.ino)
        self.backlog.changed(ticket.ino)
        self._on_change()
        return False

    def moved_meanwhile(self, ticket: UploadTicket, xxh3: str) -> None:
        """The file's bytes are complete at ticket.key, an old name: copy them to the new one, then delete the old key.

        Also the `dir/` keys of the old name's directories that no longer exist here: some stores
        (SeaweedFS) list a directory whose last object went until its `dir/` key is deleted too."""
        j = self.journal
        parts = self.keys.path(ticket.key).split("/")[:-1]
        old_dirs = []  # deepest first, up to the first that still exists here
        for depth in range(len(parts), 0, -1):
            row = j.resolve("/".join(parts[:depth]))
            if row is not None and row.is_dir:
                break
            old_dirs.append(self.keys.of("/".join(parts[:depth])) + "/")
        old_dirs = [key for key in old_dirs if not self.deletes.queued(key)]  # synced outside the transaction
        with j.transaction():
            j.update(ticket.ino, state=DIRTY, remote_key=None, copy_from=ticket.key, xxh3=xxh3 or None)
            j.forget_upload(ticket.ino)
            j.queue_delete(ticket.key, after_ino=ticket.ino)
            for key in old_dirs:
                j.queue_delete(key)
        self.backlog.changed(ticket.ino)
        self._on_change()

    def durable_elsewhere(self, ino: int, key: str, etag: str, xxh3: str) -> None:
        """Another node put exactly this file's bytes at `key` (a peer that took this node over, peers/reconcile.py):
        durable as if the drain had uploaded them, without an upload. An upload of it in flight is forgotten (the
        caller aborts it in the store)."""
        j = self.journal
        with j.transaction():
            j.update(ino, state=DURABLE, etag=etag, xxh3=xxh3 or None, remote_key=key, copy_from=None, seen_at=time.time())
            j.ancestors_durable(ino)
            j.forget_upload(ino)
        self.backlog.changed(ino)
        self.on_settled(key)
        self.space.freed()
        self._on_change()

    def replaced_elsewhere(self, ino: int, key: str, size: int, etag: str, xxh3: str | None, mtime: float) -> None:
        """The bucket holds other bytes at the file's `key`, written by another node while this one was taken over: the
        bucket wins. The row describes that object (durable, not cached: the next open fetches it) and the local copy
        is dropped, as when a listing finds an object replaced (merge.py)."""
        j = self.journal
        row = j.get(ino)
        if row is None:
            return
        mtime_ns = int(mtime * 1e9)
        with j.transaction():
            j.update(ino, state=DURABLE, size=size, etag=etag, xxh3=xxh3 or None, remote_key=key, copy_from=None, cached=0,
                     version=row.version + 1, mtime_ns=mtime_ns, ctime_ns=mtime_ns, seen_at=time.time())
            j.ancestors_durable(ino)
            j.forget_upload(ino)
        if row.cached:
            self.space.cache.remove(ino, row.size)  # the journal first: never a row that claims a copy that is gone
        self.files.live.pop(ino, None)
        self.backlog.changed(ino)
        self.on_settled(key)
        self.space.freed()
        self._on_change()

    def upload_failed(self, ino: int) -> None:
        row = self.journal.get(ino)
        if row is not None and row.state == UPLOADING:
            self.journal.update(ino, state=DIRTY)
            self.backlog.changed(ino)

    # --------------------------------------------------- deletions and markers
    def drop_delete(self, delete_id: int) -> None:
        """A queued delete or marker is done, moot or refused."""
        self.journal.drop_delete(delete_id)
        self.deletes.dropped(delete_id)

    def ready_deletes(self, busy_keys: set[str], limit: int | None = None, skip: Container[int] = ()) -> list[tuple[int, str]]:
        """Queued object deletions that may run now, oldest first, at most `limit`; drops those a live file has made moot.

        `skip`: ids the caller is running or holding back. Looks at the queued deletes up to the
        `limit`-th that may run, each in memory but for the one lookup of its key's owner.
        """
        out: list[tuple[int, str]] = []
        self.backlog.reconcile()
        for delete_id, key, after_ino in self.deletes:
            if limit is not None and len(out) >= limit:
                break
            if key in busy_keys or delete_id in skip:
                continue
            if after_ino is not None and self.backlog.waiting(after_ino):
                continue  # the new object first (a rename): the old one goes once it is complete
            owner = self.journal.resolve(self.keys.path(key))
            if key.endswith("/"):
                if owner is not None and owner.is_dir:
                    self.drop_delete(delete_id)  # the directory exists again: its marker stays
                    continue
                if self.deletes.any_below(key):
                    continue  # objects under it go first
            if owner is not None and owner.kind == "file":
                if owner.state == DURABLE and owner.remote_key == key:
                    self.drop_delete(delete_id)  # the live file's upload replaced the object
                continue  # its upload will replace the object; wait and see
            out.append((delete_id, key))
        return out

    def delete_done(self, delete_id: int, key: str) -> None:
        self.drop_delete(delete_id)
        now = time.time()
        self.recently_deleted.pop(key, None)
        self.recently_deleted[key] = now  # oldest first, so expired ones are found at the front
        self.on_settled(key)
        expired = []
        for k, at in self.recently_deleted.items():
            if now - at <= RECENT_DELETE_SECONDS:
                break
            expired.append(k)
        for k in expired:
            del self.recently_deleted[k]

    def ready_markers(self, now: float, busy_keys: set[str]) -> tuple[list[tuple[int, str]], float | None]:
        """Queued `dir/` markers that may be put now, and when the next one will be due.

        Drops those made moot (directory gone, no longer empty, or marked already).
        They wait `upload_delay` like files (a marker under a temporary directory as long as a file there,
        `temporary_hold_seconds`), so a `step.tmp/` renamed in time never reaches the bucket.
        """
        out = []
        next_at: float | None = None
        for marker_id, key, queued_at in self.journal.pending_markers():
            if key in busy_keys:
                continue
            row = self.journal.resolve(self.keys.path(key))
            if row is None or not row.is_dir or self.journal.has_children(row.ino):
                self.drop_delete(marker_id)
                continue
            path = self.keys.path(key).rstrip("/")
            due = queued_at + (max(self.cfg.upload_delay, self.backlog.temporary_hold) if self.backlog.in_temporary(path) else self.cfg.upload_delay)
            if due <= now or self._marker_urgent(path, queued_at):
                out.append((marker_id, key))
            else:
                next_at = due if next_at is None else min(next_at, due)
        return out, next_at

    def _marker_urgent(self, path: str, queued_at: float) -> bool:
        mono = time.monotonic()
        for flushed, (until, queued_before) in list(self.urgent_markers.items()):
            if mono >= until:
                del self.urgent_markers[flushed]
            elif queued_at <= queued_before and under(flushed, path):
                return True
        return False

    def marker_done(self, marker_id: int, key: str) -> None:
        with self.journal.transaction():
            self.drop_delete(marker_id)
            row = self.journal.resolve(self.keys.path(key))
            if row is not None and row.is_dir:
                self.journal.update(row.ino, state=DURABLE, seen_at=time.time())
            elif key not in {k for _, k, _ in self.journal.pending_deletes()}:
                # removed while its marker was being put (rmdir queued no delete: the bucket had nothing then)
                self.journal.queue_delete(key)

    # ------------------------------------------------------------------ flush
    def _waiting_under(self, path: str) -> list[Waiting]:
        row = self.journal.resolve(path)
        return [] if row is None else self.backlog.under(row.ino)

    def pending_under(self, path: str) -> tuple[int, int, int]:
        """(files, bytes, deletes) not yet durable at or below `path` (mount-relative)."""
        waiting = self._waiting_under(path)
        files, size = len(waiting), sum(self._size(e) for e in waiting)
        deletes = sum(1 for _, key, _ in self.deletes if under(path, self.keys.path(key)))
        deletes += sum(1 for _, key, _ in self.journal.pending_markers() if under(path, self.keys.path(key).rstrip("/")))
        return files, size, deletes

    def mark_urgent(self, path: str) -> None:
        self.urgent_markers[path] = (time.monotonic() + 2.0, time.time())
        for e in self._waiting_under(path):
            self.backlog.make_urgent(e)
        self._on_change()

    def stats(self) -> dict[str, float]:
        return queue_stats(self)


def queue_stats(q: "UploadQueue") -> dict[str, float]:
    """The queue's figures for `ckptfs status` and the metrics: what waits, its bytes and ages, the queued deletes.

    Read from the backlog's running figures (backlog.py) and corrected for the files whose in-memory size is ahead
    of the journal's: a cost in the files being written and those under temporary directories, not in the files waiting."""
    b = q.backlog
    b.reconcile()
    now = time.time()
    dirty_bytes = b.journal_bytes
    in_cache = dict(b.cached_bytes)  # bytes of those files held in the cache (a renamed remote file has none)
    for ino in list(q.files.unpersisted):
        live = q.files.live.get(ino)
        if live is None or not live.modified:
            q.files.unpersisted.discard(ino)
        e = b.entry(ino)
        if live is not None and e is not None:
            dirty_bytes += live.size - e.size
            if e.cached:
                in_cache[e.state] += live.size - e.size
    oldest_close = b.oldest_close()
    oldest = b.oldest_lagging_close()  # the drain's lag: files held in a temporary directory, as asked, do not lag
    held = 0  # under a temporary directory, not yet due
    for ino in b.temporaries:
        e = b.entry(ino)
        if e is None:
            continue
        if e.state != UPLOADING and b.due_at(e) > now:
            held += 1
        elif e.closed_at and (oldest is None or e.closed_at < oldest):
            oldest = e.closed_at
    return {
        "dirty_files": len(b),
        "dirty_bytes": dirty_bytes,
        "uploading_files": b.uploading,
        "temporary_held_files": held,
        "oldest_dirty_age_seconds": round(max(0.0, now - oldest), 3) if oldest else 0.0,
        "oldest_close_age_seconds": round(max(0.0, now - oldest_close), 3) if oldest_close else 0.0,  # on this node's disk alone since
        "cache_dirty_bytes": in_cache[DIRTY],
        "cache_uploading_bytes": in_cache[UPLOADING],
        "pending_deletes": len(q.deletes),
        "pending_markers": len(q.journal.pending_markers()),
    }


def keys_left_while_away(q: "UploadQueue", rows: list[Row]) -> dict[int, str]:
    """Before a rename: the keys files never uploaded here are about to leave, if a takeover may have uploaded them
    for this node meanwhile (`UploadQueue.away`); each gets an OWN_OBJECT_ONLY delete once the file is durable under
    its new key (`requeue_moved`). Nothing otherwise: no cost outside that window."""
    if not q.away():
        return {}
    return {row.ino: key for row in rows if not row.is_dir and (key := key_never_uploaded(q, row)) is not None}


def key_never_uploaded(q: "UploadQueue", row: Row) -> str | None:
    """The key of a file at its path now if this node never uploaded it (no object of its own it knows of): the one
    a takeover may have written for it while the node was away."""
    path = q.journal.path_of(row.ino) if not row.remote_key else None
    return None if path is None else q.keys.of(path)
