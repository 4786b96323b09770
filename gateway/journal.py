"""The node's source of truth: a SQLite journal (WAL mode) in the cache directory.

Why SQLite: every metadata change (create, rename, state change) must be one
atomic, crash-safe transaction, and rename of a whole tree must be a single
commit. SQLite in WAL mode gives that with one file and no server.

Durability: every commit uses `synchronous=NORMAL`: COMMIT only write()s the WAL, so it
survives a crash of the daemon but not yet a power loss, and costs no fsync on the trio
thread. Requests that acknowledge durability to an application (`fsync`, `fsyncdir`)
`await durable()`, which fsyncs the `-wal` file in a worker thread (a limiter of its own) and
returns once an fsync that *started after the call* has finished, so every earlier commit
then survives power loss too. The trio thread goes on serving everything else meanwhile;
the SQLite connection itself is only ever used from the trio thread, only the fsync moves.
Why fsyncing the WAL from outside SQLite is enough (SQLite's own rules for NORMAL in WAL
mode): a checkpoint fsyncs the WAL before it copies frames into the database and fsyncs the
database after copying them all, and the WAL is restarted (its frames overwritten, or cut to
`journal_size_limit`) only after such a complete checkpoint. So at any moment a committed
transaction is either in the current WAL (made durable by our fsync, which flushes every
page written to that file before it started, on Linux whatever descriptor wrote them) or in
the already fsynced database. The WAL file is removed only when the last connection closes;
the first fsync of each WAL file (by inode) also fsyncs the database and the directory, so
a newly created file's name is durable too. Group commit: callers that arrive while an fsync
runs share the next one, so N writers fsyncing together cost about two fsyncs, not N.
`sync()` is the same fsync done blocking, for paths where nothing else waits on the trio
thread (opening the journal, recovery before the mount, the daemon's stop after unmount).
What stays on the trio thread: SQLite's own automatic checkpoint (every ~1000 WAL pages:
an fsync of the WAL and of the database) and the header sync when a new WAL cycle starts.

Inode numbers come from an AUTOINCREMENT key and are never reused, not even
after a restart: the kernel may still hold an old number in its caches.

A full disk: the journal shares the cache's file system, and a FUSE passthrough writer
(which the daemon cannot hold back) may fill it to the last block. So the journal keeps
`JOURNAL_RESERVE` bytes allocated in `journal.reserve`; a write that finds the disk full
gives the reserve up and is retried once (only where SQLite left nothing half done: a
statement outside a transaction, or a COMMIT whose transaction is still open), so closes,
fsyncs, uploads marked durable and unlinks that free space still commit. SQLite rolls a
transaction back when its COMMIT meets a full disk, so the reserve is given up *before* a
COMMIT once the disk has less than `JOURNAL_LOW_ROOM` free; a COMMIT that still fails
(something filled the disk faster) fails with `DiskFull`, and the next one has the room. The reserve is
taken back at the next `durable()` or `sync()` that finds the disk has room. With the reserve gone too,
the write fails with `DiskFull` (ENOSPC), never a half-applied change.

Every way a statement reaches SQLite goes through `_Connection`, which turns the disk's answers into
errnos: SQLITE_FULL is `DiskFull` (ENOSPC), SQLITE_IOERR is `JournalIOError` (EIO). A request gets
that errno; a background service (listing merge, eviction, drain) leaves the change for a later round.
`executemany` outside a transaction runs in one of its own, so a failure halfway undoes every row.
SQLite's automatic WAL checkpoint ignores a failed write by design (the WAL then just grows, on the
reserve); opening the journal on a full or failing disk raises `JournalError` naming the disk, not the
journal, as the problem.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import trio

from .dbconnection import Connection, DiskFull, JournalIOError, disk_full_message, open_failure  # noqa: F401 (for callers)

log = logging.getLogger(__name__)

ROOT_INODE = 1
SCHEMA_VERSION = 1

DIRTY = "dirty"
UPLOADING = "uploading"
DURABLE = "durable"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS inodes(
    ino        INTEGER PRIMARY KEY AUTOINCREMENT,
    parent     INTEGER,            -- NULL: unlinked while still open (an orphan)
    name       TEXT,
    kind       TEXT NOT NULL,      -- 'dir' | 'file'
    mode       INTEGER NOT NULL,
    uid        INTEGER NOT NULL,
    gid        INTEGER NOT NULL,
    size       INTEGER NOT NULL DEFAULT 0,
    mtime_ns   INTEGER NOT NULL,
    ctime_ns   INTEGER NOT NULL,
    version    INTEGER NOT NULL DEFAULT 0,   -- bumped on every change that needs a new upload
    state      TEXT,                         -- files: dirty | uploading | durable
    closed_at  REAL,                         -- wall time of the last close that left it dirty
    xxh3       TEXT,                         -- xxh3-128 of the durable bytes
    etag       TEXT,
    remote_key TEXT,                         -- object holding this file's durable bytes
    cached     INTEGER NOT NULL DEFAULT 1,   -- 0: the cache copy of a durable file was evicted
    atime      REAL,                         -- last open, for least-recently-used eviction
    copy_from  TEXT,                         -- durable file renamed: its bytes are this object (server-side copy)
    seen_at    REAL,                         -- wall time of the upload or listing that made this entry what it is (a listing confirming it unchanged writes nothing: namespace/merge.py)
    atime_ns   INTEGER,                      -- the POSIX atime (utimensat, relatime on open); NULL: the mtime
    UNIQUE(parent, name)
);
CREATE INDEX IF NOT EXISTS inodes_state ON inodes(state) WHERE state IS NOT NULL AND state != 'durable';
CREATE INDEX IF NOT EXISTS inodes_subdirs ON inodes(parent) WHERE kind = 'dir';
CREATE INDEX IF NOT EXISTS inodes_evictable ON inodes(COALESCE(atime, 0), ino)
    WHERE kind = 'file' AND state = 'durable' AND cached = 1 AND parent IS NOT NULL;
CREATE TABLE IF NOT EXISTS uploads(
    ino        INTEGER PRIMARY KEY,
    key        TEXT NOT NULL,
    upload_id  TEXT NOT NULL,
    part_size  INTEGER NOT NULL,
    size       INTEGER NOT NULL,
    xxh3       TEXT NOT NULL,
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS parts(
    ino         INTEGER NOT NULL,
    part_number INTEGER NOT NULL,
    etag        TEXT NOT NULL,
    crc32       TEXT NOT NULL,
    PRIMARY KEY(ino, part_number)
);
CREATE TABLE IF NOT EXISTS deletes(
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    key        TEXT NOT NULL,
    op         TEXT NOT NULL DEFAULT 'delete',  -- 'delete' | 'marker' (put an empty `dir/` object)
    after_ino  INTEGER,     -- wait until this inode is durable (or gone): rename = upload new, then delete old
    queued_at  REAL NOT NULL
);
"""


EVICTION_BATCH = 64  # evictable files read at once: an eviction rarely needs more victims than this

JOURNAL_RESERVE = 8 << 20  # room kept for the journal on a full disk: a WAL cycle (~4 MiB) and then some
JOURNAL_LOW_ROOM = 2 << 20  # less free than this, and the reserve is given up before a COMMIT


class JournalError(Exception):
    """The journal cannot be used (corrupt, foreign, newer schema); message is one line."""


@dataclass
class _Round:
    """One fsync of the WAL shared by every `durable()` caller that joined it before it started."""

    done: trio.Event = field(default_factory=trio.Event)
    error: OSError | None = None


@dataclass
class Row:
    ino: int
    parent: int | None
    name: str | None
    kind: str
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    ctime_ns: int
    version: int
    state: str | None
    closed_at: float | None
    xxh3: str | None
    etag: str | None
    remote_key: str | None
    cached: int = 1
    atime: float | None = None
    copy_from: str | None = None
    seen_at: float | None = None
    atime_ns: int | None = None

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"


@dataclass
class UploadRecord:
    ino: int
    key: str
    upload_id: str
    part_size: int
    size: int
    xxh3: str
    started_at: float
    parts: dict[int, tuple[str, str]]  # part number -> (etag, crc32)


_COLUMNS = "ino, parent, name, kind, mode, uid, gid, size, mtime_ns, ctime_ns, version, state, closed_at, xxh3, etag, remote_key, cached, atime, copy_from, seen_at, atime_ns"

# columns added after schema 1 was first released: (table, column, declaration)
_ADDED_COLUMNS = [
    ("inodes", "copy_from", "TEXT"),
    ("inodes", "seen_at", "REAL"),
    ("deletes", "op", "TEXT NOT NULL DEFAULT 'delete'"),
    ("inodes", "atime_ns", "INTEGER"),
    ("deletes", "etag", "TEXT"),  # the object the delete is for (its ETag when queued): conditional with peers
]


# deletes.etag of a delete queued for a key a file that this node never uploaded left (removed or renamed) while a
# takeover may have been uploading the node's files for it (peers: its lease not valid): the object there, if it is a
# version of that file by provenance, goes; anything else stays (drainfence.py, peers/takeover.py)
OWN_OBJECT_ONLY = "ckptfs:own-object-only"


def new_journal_id() -> str:
    return uuid.uuid4().hex


def journal_id_of(journal: "Journal") -> str:
    """The journal's identity: random, made with the journal and kept in it. A node that comes back under its name
    with another journal (an empty cache directory: a replaced disk, a rescheduled pod) is another incarnation of
    the node, and must not be taken for the one whose files its peers hold (docs/peers.md, identity). A journal of
    an earlier release has none yet: it gets one now, once. Also the journal of provenance (publishing.py): an inode
    number and a version mean something only within one journal."""
    row = journal.db.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
    if row is not None:
        return str(row[0])
    ident = new_journal_id()
    with journal.transaction():
        journal.db.execute("INSERT INTO meta(key, value) VALUES ('journal_id', ?)", (ident,))
    journal.sync()
    return ident


class Journal:
    def __init__(self, path: Path, bucket: str, prefix: str) -> None:
        self.path = path
        try:
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, factory=Connection)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=OFF")
            ok = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                raise JournalError(f"journal {path} is corrupt ({ok}): move it aside and remount (unuploaded data in it would be lost)")
            self.db.executescript(_SCHEMA)
            self._add_columns()
        except (DiskFull, JournalIOError) as e:
            raise JournalError(open_failure(path, e)) from None
        except sqlite3.DatabaseError as e:
            raise JournalError(f"journal {path} cannot be opened ({e}): move it aside and remount") from None
        self._depth = 0
        self._load_uploads()
        self._fsyncs = trio.CapacityLimiter(1)  # its own thread: workers stuck on a hung store never delay it
        self._running_round: _Round | None = None  # the fsync running now
        self._next_round: _Round | None = None  # the one that starts after it; callers arriving now share it
        self._synced_wal_ino: int | None = None  # the WAL file whose directory entry is known durable
        self.reserve_path = path.with_name("journal.reserve")
        self.reserved = self._take_reserve()
        self.db.release_reserve = self._release_reserve  # type: ignore[attr-defined]
        self.db.before_commit = self._room_for_commit  # type: ignore[attr-defined]
        try:
            self._bind(bucket, prefix)
        except (DiskFull, JournalIOError) as e:
            raise JournalError(open_failure(path, e)) from None

    def _take_reserve(self) -> bool:
        """Allocate JOURNAL_RESERVE bytes in journal.reserve (True), unless the disk cannot spare them."""
        fd = os.open(self.reserve_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, JOURNAL_RESERVE)
            return True
        except OSError:
            os.ftruncate(fd, 0)
            return False
        finally:
            os.close(fd)

    def _release_reserve(self) -> bool:
        if not self.reserved:
            return False
        os.truncate(self.reserve_path, 0)
        self.reserved = False
        log.warning("cache disk full: gave up the journal's reserve (%d MiB) so the journal can still be written; "
                    "it is taken back once the disk has room", JOURNAL_RESERVE >> 20)
        return True

    def _room_for_commit(self) -> None:
        """Give the reserve up before a COMMIT that the disk may not have room for: SQLite answers a COMMIT that
        meets a full disk by rolling the whole transaction back, which nothing could retry. A statvfs per commit
        (~2 us) while the reserve is held; none once it is gone."""
        if self.reserved:
            st = os.statvfs(self.reserve_path.parent)
            if st.f_bavail * st.f_frsize < JOURNAL_LOW_ROOM:
                self._release_reserve()

    def _retake_reserve(self) -> None:
        st = os.statvfs(self.reserve_path.parent)
        if st.f_bavail * st.f_frsize > 2 * JOURNAL_RESERVE:
            self.reserved = self._take_reserve()

    def _add_columns(self) -> None:
        """Bring a journal written by an earlier 0.x release up to date (columns only ever get added)."""
        for table, column, decl in _ADDED_COLUMNS:
            have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")

    def _bind(self, bucket: str, prefix: str) -> None:
        """A journal belongs to one bucket and prefix; reusing it elsewhere would upload to the wrong place."""
        meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        self.bound_now = not meta  # this start bound it: `discard` may undo that if the mount never comes up
        if not meta:
            ident = new_journal_id()
            with self.transaction():
                self.db.executemany(
                    "INSERT INTO meta(key, value) VALUES (?, ?)",
                    [("schema", str(SCHEMA_VERSION)), ("bucket", bucket), ("prefix", prefix), ("created", str(time.time())),
                     ("journal_id", ident)],
                )
                now = time.time_ns()
                self.db.execute(
                    "INSERT INTO inodes(ino, parent, name, kind, mode, uid, gid, mtime_ns, ctime_ns) "
                    "VALUES (?, NULL, NULL, 'dir', ?, 0, 0, ?, ?)",
                    (ROOT_INODE, 0o40755, now, now),
                )
            self.sync()
            self.journal_id = ident
            return
        if meta.get("schema") != str(SCHEMA_VERSION):
            raise JournalError(f"journal {self.path} has schema {meta.get('schema')}, this ckptfs understands {SCHEMA_VERSION}: use the matching ckptfs version")
        if (meta.get("bucket"), meta.get("prefix")) != (bucket, prefix):
            where = f"s3://{meta.get('bucket')}/{meta.get('prefix')}".rstrip("/")
            raise JournalError(
                f"cache dir belongs to {where}, not s3://{bucket}/{prefix}".rstrip("/")
                + ": use another --cache-dir, or mount that source to drain it first"
            )
        self.journal_id = journal_id_of(self)

    def close(self) -> None:
        self.db.close()

    def holds_work(self) -> bool:
        """True while anything here is not in the bucket yet (files to upload, deletes, `dir/` markers)."""
        return bool(self.pending_files() or self.pending_deletes() or self.pending_markers())

    def discard(self) -> None:
        """Close and remove this journal (and its reserve): for a start that bound it and then failed, holding no
        work, so the cache directory stays free for any bucket and prefix."""
        self.db.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self.reserve_path.unlink(missing_ok=True)

    # ------------------------------------------------------------ transactions
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic change; nested uses join the outer transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
            self._depth = 0
            self.db.execute("COMMIT")
        except BaseException:
            self._depth = 0
            try:
                if self.db.in_transaction:  # SQLite may have rolled it back itself (a full disk)
                    self.db.execute("ROLLBACK")
                self._load_uploads()  # what the rollback undid
            except (OSError, sqlite3.Error) as e:  # a failing disk: the first error is the one to report
                log.error("journal: rolling back after a failed change also failed: %s", e)
            raise

    def sync(self) -> None:
        """Make every earlier commit survive power loss, blocking the calling thread.

        Only where nothing else waits on the trio thread (open, recovery, stop after unmount);
        requests await `durable()` instead."""
        if not self.reserved:
            self._retake_reserve()
        self._fsync_files()

    async def durable(self) -> None:
        """Make every commit made before this call survive power loss, off the trio thread.

        Returns once an fsync of the WAL that started after the call has finished (callers
        arriving while one runs share the next: group commit). Raises OSError if it failed."""
        if not self.reserved:
            self._retake_reserve()
        rnd = self._next_round
        if rnd is not None:  # not started yet, so it starts after our commits: share it
            await rnd.done.wait()
        else:
            rnd = self._next_round = _Round()
            # shielded: the callers sharing this round wait on it, and the fsync cannot be abandoned anyway
            with trio.CancelScope(shield=True):
                try:
                    if self._running_round is not None:  # it may have started before our commits: one at a time
                        await self._running_round.done.wait()
                    self._next_round, self._running_round = None, rnd
                    await trio.to_thread.run_sync(self._fsync_files, limiter=self._fsyncs)
                except OSError as e:
                    rnd.error = e
                except BaseException:
                    rnd.error = OSError(errno.EIO, "Input/output error")  # nobody sharing it may take it as done
                    raise
                finally:
                    if self._running_round is rnd:
                        self._running_round = None
                    if self._next_round is rnd:
                        self._next_round = None
                    rnd.done.set()
        if rnd.error is not None:
            raise OSError(rnd.error.errno, f"fsync of the journal failed: {rnd.error.strerror}")

    def _fsync_files(self) -> None:
        """fsync the WAL (in a worker thread for `durable()`); the database and directory too for a new WAL file."""
        wal = f"{self.path}-wal"
        ino: int | None = None
        try:
            fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # no WAL (yet): everything is in the database file
            pass
        else:
            try:
                ino = os.fstat(fd).st_ino
                os.fsync(fd)
            finally:
                os.close(fd)
        if ino is None or ino != self._synced_wal_ino:
            for path, flags in ((self.path, os.O_RDONLY), (self.path.parent, os.O_RDONLY | os.O_DIRECTORY)):
                fd = os.open(path, flags | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self._synced_wal_ino = ino

    # ------------------------------------------------------------------ inodes
    def get(self, ino: int) -> Row | None:
        r = self.db.execute(f"SELECT {_COLUMNS} FROM inodes WHERE ino = ?", (ino,)).fetchone()
        return Row(*r) if r else None

    def lookup(self, parent: int, name: str) -> Row | None:
        r = self.db.execute(f"SELECT {_COLUMNS} FROM inodes WHERE parent = ? AND name = ?", (parent, name)).fetchone()
        return Row(*r) if r else None

    def children(self, parent: int, offset: int = 0, limit: int = -1) -> list[Row]:
        """`parent`'s entries by name: all, or `limit` of them from the `offset`-th (a page of a readdir)."""
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM inodes WHERE parent = ? ORDER BY name LIMIT ? OFFSET ?",
                               (parent, limit, offset)).fetchall()
        return [Row(*r) for r in rows]

    def subdirs(self, parent: int) -> int:
        """How many directories `parent` holds (a directory's link count is 2 plus this): counted on an
        index of directories alone, so a getattr of a directory of many files costs no more than of an empty one."""
        return self.db.execute("SELECT COUNT(*) FROM inodes WHERE parent = ? AND kind = 'dir'", (parent,)).fetchone()[0]

    def has_children(self, parent: int) -> bool:
        return self.db.execute("SELECT 1 FROM inodes WHERE parent = ? LIMIT 1", (parent,)).fetchone() is not None

    def insert(self, parent: int, name: str, kind: str, mode: int, uid: int, gid: int, state: str | None, **fields: object) -> Row:
        now = time.time_ns()
        values: dict[str, object] = dict(parent=parent, name=name, kind=kind, mode=mode, uid=uid, gid=gid, mtime_ns=now,
                                         ctime_ns=now, state=state, version=1 if kind == "file" else 0, seen_at=time.time())
        values.update(fields)
        values.setdefault("atime_ns", values["mtime_ns"])
        cur = self.db.execute(
            f"INSERT INTO inodes({', '.join(values)}) VALUES ({', '.join('?' * len(values))})", tuple(values.values())
        )
        row = self.get(cur.lastrowid)
        assert row is not None
        return row

    def update(self, ino: int, **fields: object) -> None:
        if not fields:
            return
        cols = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE inodes SET {cols} WHERE ino = ?", (*fields.values(), ino))

    def delete(self, ino: int) -> None:
        with self.transaction():
            self.db.execute("DELETE FROM inodes WHERE ino = ?", (ino,))
            self.forget_upload(ino)

    def ancestors_durable(self, ino: int) -> None:
        """Mark every directory above `ino` (the root aside) durable, in one statement that writes only those that were not."""
        self.db.execute(
            """WITH RECURSIVE up(i) AS (SELECT parent FROM inodes WHERE ino = ?
                 UNION ALL SELECT inodes.parent FROM inodes JOIN up ON inodes.ino = up.i WHERE inodes.parent IS NOT NULL)
               UPDATE inodes SET state = ? WHERE ino IN (SELECT i FROM up) AND ino != ? AND state IS NOT ?""",
            (ino, DURABLE, ROOT_INODE, DURABLE),
        )

    def descendants(self, ino: int) -> list[Row]:
        """Every inode below `ino` (not `ino` itself)."""
        rows = self.db.execute(
            f"""WITH RECURSIVE sub(i) AS (SELECT ino FROM inodes WHERE parent = ?
                 UNION ALL SELECT inodes.ino FROM inodes JOIN sub ON inodes.parent = sub.i)
               SELECT {_COLUMNS} FROM inodes WHERE ino IN (SELECT i FROM sub)""",
            (ino,),
        ).fetchall()
        return [Row(*r) for r in rows]

    def parent_of(self, ino: int) -> int | None:
        """The directory holding `ino`; None for the root, an orphan or an inode that is gone."""
        r = self.db.execute("SELECT parent FROM inodes WHERE ino = ?", (ino,)).fetchone()
        return r[0] if r else None

    def is_ancestor(self, ancestor: int, ino: int) -> bool:
        """True if `ancestor` is `ino` or one of its parents."""
        cur: int | None = ino
        while cur is not None:
            if cur == ancestor:
                return True
            cur = self.parent_of(cur)
        return False

    def path_of(self, ino: int) -> str | None:
        """'a/b/c' relative to the mount root; None for an orphan; '' for the root."""
        names: list[str] = []
        cur = ino
        while cur != ROOT_INODE:
            r = self.db.execute("SELECT parent, name FROM inodes WHERE ino = ?", (cur,)).fetchone()
            if r is None or r[0] is None:
                return None
            names.append(r[1])
            cur = r[0]
        return "/".join(reversed(names))

    def resolve(self, path: str) -> Row | None:
        """The live inode at a mount-relative path, if any."""
        row = self.get(ROOT_INODE)
        for part in [p for p in path.split("/") if p]:
            if row is None or not row.is_dir:
                return None
            row = self.lookup(row.ino, part)
        return row

    def pending_files(self) -> list[Row]:
        """Files not yet durable (dirty or uploading), orphans included."""
        rows = self.db.execute(
            f"SELECT {_COLUMNS} FROM inodes WHERE kind = 'file' AND state IN ('dirty', 'uploading')"
        ).fetchall()
        return [Row(*r) for r in rows]

    def written_here(self, after_ino: int, limit: int) -> list[tuple[int, int, str, float]]:
        """Files in the tree that a close on this node left to upload (now or once): (ino, parent, name, closed_at),
        in inode order after `after_ino`, `limit` at a time. A restart derives the checkpoints still to commit from
        them (lifecycle/tracker.py); pages keep each read short on a journal of millions of files."""
        return [(r[0], r[1], r[2], r[3]) for r in self.db.execute(
            "SELECT ino, parent, name, closed_at FROM inodes WHERE ino > ? AND kind = 'file' AND closed_at IS NOT NULL "
            "AND parent IS NOT NULL ORDER BY ino LIMIT ?", (after_ino, limit))]

    def evictable(self, after: tuple[float, int] | None = None, limit: int = EVICTION_BATCH) -> list[Row]:
        """Durable files with a local copy, least recently used first: up to `limit` of them, from just
        after the position `after` ((atime, ino) of the last one a caller took) or from the start.

        Read in order on the partial index `inodes_evictable` (the same WHERE, the same order), so one
        batch costs the same whether the cache holds a thousand clean copies or a million: an eviction
        runs on the trio thread, several times a second when the cache is full."""
        where = ("SELECT {cols} FROM inodes INDEXED BY inodes_evictable WHERE kind = 'file' AND state = 'durable' "
                 "AND cached = 1 AND parent IS NOT NULL AND {bound} ORDER BY {order} LIMIT ?").replace("{cols}", _COLUMNS)
        in_order = where.replace("{order}", "COALESCE(atime, 0), ino")
        if after is None:
            rows = self.db.execute(in_order.replace("{bound}", "1"), (limit,)).fetchall()
        else:  # two searches of the index: the rest of the files used at that same time, then the later ones
            same_time = where.replace("{order}", "ino").replace("{bound}", "COALESCE(atime, 0) = ? AND ino > ?")
            rows = self.db.execute(same_time, (*after, limit)).fetchall()
            if len(rows) < limit:
                rows += self.db.execute(in_order.replace("{bound}", "COALESCE(atime, 0) > ?"), (after[0], limit - len(rows))).fetchall()
        return [Row(*r) for r in rows]

    def evictable_in_order(self) -> Iterator[Row]:
        """Every evictable file, least recently used first, read one batch at a time as the caller goes on:
        one that stops after the first few reads one batch. Files the caller evicts meanwhile are not
        seen twice (each batch starts after the last row handed out)."""
        after: tuple[float, int] | None = None
        while True:
            batch = self.evictable(after)
            yield from batch
            if len(batch) < EVICTION_BATCH:
                return
            last = batch[-1]
            after = (last.atime or 0, last.ino)

    def orphans(self) -> list[Row]:
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM inodes WHERE parent IS NULL AND ino != ?", (ROOT_INODE,)).fetchall()
        return [Row(*r) for r in rows]

    def all_inodes(self) -> list[int]:
        return [r[0] for r in self.db.execute("SELECT ino FROM inodes")]

    # ----------------------------------------------------------------- uploads
    def _load_uploads(self) -> None:
        """Which inodes have rows in `uploads` or `parts` (read at open and after a rollback): a file
        that never had a multipart upload costs no DELETE when it becomes durable or goes away."""
        self._with_uploads = {r[0] for r in self.db.execute("SELECT ino FROM uploads UNION SELECT ino FROM parts")}

    def start_upload(self, rec: UploadRecord) -> None:
        with self.transaction():
            self.forget_upload(rec.ino)
            self._with_uploads.add(rec.ino)
            self.db.execute(
                "INSERT INTO uploads(ino, key, upload_id, part_size, size, xxh3, started_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (rec.ino, rec.key, rec.upload_id, rec.part_size, rec.size, rec.xxh3, rec.started_at),
            )

    def record_part(self, ino: int, part_number: int, etag: str, crc32: str) -> None:
        self._with_uploads.add(ino)
        self.db.execute(
            "INSERT OR REPLACE INTO parts(ino, part_number, etag, crc32) VALUES (?, ?, ?, ?)",
            (ino, part_number, etag, crc32),
        )

    def upload_of(self, ino: int) -> UploadRecord | None:
        r = self.db.execute(
            "SELECT ino, key, upload_id, part_size, size, xxh3, started_at FROM uploads WHERE ino = ?", (ino,)
        ).fetchone()
        if r is None:
            return None
        parts = {n: (e, c) for n, e, c in self.db.execute("SELECT part_number, etag, crc32 FROM parts WHERE ino = ?", (ino,))}
        return UploadRecord(*r, parts=parts)

    def all_uploads(self) -> list[UploadRecord]:
        inos = [r[0] for r in self.db.execute("SELECT ino FROM uploads")]
        return [u for u in (self.upload_of(i) for i in inos) if u is not None]

    def forget_upload(self, ino: int) -> None:
        if ino not in self._with_uploads:
            return
        self.db.execute("DELETE FROM uploads WHERE ino = ?", (ino,))
        self.db.execute("DELETE FROM parts WHERE ino = ?", (ino,))
        self._with_uploads.discard(ino)

    # ----------------------------------------------------------------- deletes
    def queue_delete(self, key: str, after_ino: int | None = None, etag: str | None = None) -> None:
        """`etag`: the object to delete, as this node last saw it (a delete then removes only that object, never one
        another node wrote at the key since: drainfence.py); None: whatever is there; or OWN_OBJECT_ONLY."""
        self.db.execute("INSERT INTO deletes(key, after_ino, queued_at, etag) VALUES (?, ?, ?, ?)",
                        (key, after_ino, time.time(), etag or None))

    def delete_etag(self, delete_id: int) -> str | None:
        """The ETag a queued delete is for (queue_delete), None when it is for whatever is at its key."""
        row = self.db.execute("SELECT etag FROM deletes WHERE id = ?", (delete_id,)).fetchone()
        return row[0] if row is not None else None

    def queue_marker(self, key: str) -> None:
        """Put an empty `dir/` object so that an empty directory survives in the bucket."""
        self.db.execute("INSERT INTO deletes(key, op, queued_at) VALUES (?, 'marker', ?)", (key, time.time()))

    def pending_deletes(self) -> list[tuple[int, str, int | None]]:
        return self.deletes_after(0)

    def deletes_after(self, last_id: int) -> list[tuple[int, str, int | None]]:
        """Object deletions queued with an id above `last_id`, oldest first."""
        return list(self.db.execute("SELECT id, key, after_ino FROM deletes WHERE op = 'delete' AND id > ? ORDER BY id", (last_id,)))

    def deletes_present(self, ids: set[int]) -> set[int]:
        """Which of `ids` are still queued (deletes or markers)."""
        found: set[int] = set()
        batch = list(ids)
        for i in range(0, len(batch), 500):
            chunk = batch[i:i + 500]
            found.update(r[0] for r in self.db.execute(f"SELECT id FROM deletes WHERE id IN ({', '.join('?' * len(chunk))})", chunk))
        return found

    def pending_markers(self) -> list[tuple[int, str, float]]:
        return list(self.db.execute("SELECT id, key, queued_at FROM deletes WHERE op = 'marker' ORDER BY id"))

    def pending_keys(self) -> set[str]:
        """Keys this node is about to delete or rewrite: a listing must not bring them back."""
        return {r[0] for r in self.db.execute("SELECT key FROM deletes")}

    def drop_delete(self, delete_id: int) -> None:
        self.db.execute("DELETE FROM deletes WHERE id = ?", (delete_id,))
