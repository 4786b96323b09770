"""Other nodes' replicas on this node's disk (docs/peers.md): `CACHE_DIR/peers/<owner>/<ino>` and their index
`CACHE_DIR/peers/replicas.db`.

Apart from the node's own files: outside `data/`, so the cache's clean-up of files no inode owns and its
eviction never see them, in a capacity of their own (`peer_capacity`; 0: a quarter of the cache file
system), and kept until the owner (or a sweep) says the file is durable. A seal is acknowledged only once
the data file and the index are on the disk (fsync of the file, of the index's WAL and of their directories), and once this
node's own xxh3-128 and BLAKE3 of the bytes it wrote equal the owner's (sealhash.py: bytes altered on the wire
cannot keep a BLAKE3): what a takeover later uploads is what the owner acknowledged. Bytes that arrive in order (each write continuing the replica's hashed prefix) are hashed as
they are written (`writing`); the seal reads from the disk only the rest, so a file streamed in order is not read
back. What the disk does to the bytes after they were written is the takeover's check (`verify`, from the disk). The index survives a restart of this daemon with the files; its commits reach the disk
together (`sync`) when a seal or a barrier is answered, not one fsync per entry.

A full disk or capacity is `ReplicaFull` (ENOSPC) and a failing one an OSError (EIO), both answered to the
owner by the listener; the index goes through `dbconnection.Connection`, which maps SQLite's full/failing
disk to those errnos.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from ..config import auto_min_free
from ..dbconnection import Connection
from ..peering import NODE_NAME
from ..upload import hash_range
from .sealhash import SealDigest, SealHash


_SCHEMA = """
CREATE TABLE IF NOT EXISTS replicas (
    owner TEXT NOT NULL, ino INTEGER NOT NULL, key TEXT NOT NULL, version INTEGER NOT NULL, size INTEGER NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0, xxh3 TEXT, copy_from TEXT, marker INTEGER NOT NULL DEFAULT 0,
    seq INTEGER NOT NULL DEFAULT 0, mtime REAL NOT NULL DEFAULT 0, checkpoint TEXT, seen TEXT,
    journal TEXT NOT NULL DEFAULT '', incarnation TEXT NOT NULL DEFAULT '', blake3 TEXT,
    PRIMARY KEY (owner, ino));
CREATE TABLE IF NOT EXISTS deletes (
    owner TEXT NOT NULL, op_id INTEGER NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, after_ino INTEGER,
    journal TEXT NOT NULL DEFAULT '', incarnation TEXT NOT NULL DEFAULT '', etag TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (owner, op_id));
CREATE TABLE IF NOT EXISTS checkpoints (
    owner TEXT NOT NULL, path TEXT NOT NULL, noted REAL NOT NULL,
    PRIMARY KEY (owner, path));
"""
# columns added since the first release: an index of an existing cache gets them (ALTER TABLE), its rows tagged ''
# (no journal known: `records.same_journal` matches them with any, as that release did)
_ADDED = [("replicas", "seen", "TEXT"),
          ("replicas", "journal", "TEXT NOT NULL DEFAULT ''"), ("replicas", "incarnation", "TEXT NOT NULL DEFAULT ''"),
          ("deletes", "after_ino", "INTEGER"),
          ("deletes", "journal", "TEXT NOT NULL DEFAULT ''"), ("deletes", "incarnation", "TEXT NOT NULL DEFAULT ''"),
          ("deletes", "etag", "TEXT NOT NULL DEFAULT ''"), ("replicas", "blake3", "TEXT")]
_COLUMNS = ("owner, ino, key, version, size, sealed, xxh3, copy_from, marker, seq, mtime, checkpoint, seen, journal, incarnation, "
            "blake3")
# rows of `owner` whose journal is ? (or either is '': see records.same_journal)
_OF_JOURNAL = "owner = ? AND (? = '' OR journal = '' OR journal = ?)"


class ReplicaFull(OSError):
    """`peer_capacity` or the disk has no room for these bytes: the owner is told PeerFull."""

    def __init__(self, why: str) -> None:
        super().__init__(errno.ENOSPC, why)


class ReplicaIndexError(Exception):
    """replicas.db cannot be opened (the message is one line)."""


class ReplicaMismatch(Exception):
    """This node's xxh3 (or size) of a replica differs from the owner's at seal."""


class ReplicaUnknown(Exception):
    """A seal of a file the owner never sent an entry for."""


@dataclass
class ReplicaEntry:
    owner: str
    ino: int
    key: str
    version: int
    size: int
    sealed: bool
    xxh3: str | None
    copy_from: str | None
    marker: bool
    seq: int
    mtime: float
    checkpoint: str | None
    path: str  # its data file
    # the ETag of the object the owner last saw at `key` ("": none; None: an owner that did not say, an older release):
    # with the journal, `ino` and `version`, the provenance a takeover writes (publishing.py)
    seen: str | None = None
    journal: str = ""  # the owner's journal id and incarnation that sent it ("": an index of an earlier release)
    incarnation: str = ""
    blake3: str | None = None  # the owner's BLAKE3 of the sealed bytes (sealhash.py; None: sealed by an earlier release)


@dataclass
class ReplicaDelete:
    owner: str
    op_id: int
    key: str
    seq: int
    after_ino: int | None = None  # the file it waits for: a rename's old key goes once the file is durable under its new one
    journal: str = ""
    incarnation: str = ""
    etag: str = ""  # the object the owner deleted ('': not known, whatever is at the key)


@dataclass
class _Hashed:
    """The seal digests' state (sealhash.SealHash) of a replica's first `upto` bytes as written (fed as they arrived in order, or read at a seal): a
    later seal reads only the bytes past it. Any write or truncate below `upto` forgets it."""

    state: Any
    upto: int


def _check_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """An entry's meta as the owner sent it, its types checked (ValueError: the frame is malformed)."""
    def typed(name: str, kinds: tuple[type, ...], default: Any = ...) -> Any:
        value = meta.get(name, default)
        if value is ... or not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
            raise ValueError(f"entry field {name!r} missing or of the wrong type")
        return value
    return {"key": typed("key", (str,)), "version": typed("version", (int,)), "size": typed("size", (int,)),
            "copy_from": typed("copy_from", (str, type(None)), None), "marker": typed("marker", (bool,), False),
            "seq": typed("seq", (int,), 0), "mtime": float(typed("mtime", (int, float), 0.0)),
            "checkpoint": typed("checkpoint", (str, type(None)), None),
            "seen": typed("seen", (str, type(None)), None),
            "sealed": typed("sealed", (bool,), False), "xxh3": typed("xxh3", (str, type(None)), None)}


class ReplicaStore:
    def __init__(self, cfg: Any, cache_dir: str) -> None:
        self.root = Path(cache_dir) / "peers"
        self.root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)
        st = os.statvfs(self.root)
        fs_size = st.f_blocks * st.f_frsize
        self.capacity = cfg.peer_capacity if cfg.peer_capacity > 0 else fs_size // 4
        # the node's own cache keeps its reserve: replicas never take the disk below it
        self.min_free = cfg.cache_min_free if getattr(cfg, "cache_min_free", None) is not None else auto_min_free(fs_size)
        self._lock = threading.RLock()
        index = self.root / "replicas.db"
        try:
            self.db = sqlite3.connect(index, isolation_level=None, check_same_thread=False, factory=Connection)
            self.db.execute("PRAGMA journal_mode=WAL")
            # commits are not synced one by one (an entry, a delete: one fsync each would bound the files per second):
            # `sync` puts every change committed so far on the disk before a seal or barrier is acknowledged
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
            for table, column, decl in _ADDED:
                if column not in {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        except (OSError, sqlite3.Error) as e:
            raise ReplicaIndexError(f"the index of other nodes' replicas {index} cannot be opened ({e}): check the cache "
                                    "disk; moved aside, this node forgets the replicas it holds (their owners send them again)") from None
        self._bytes: dict[tuple[str, int], int] = {}  # bytes each replica's data file takes (its size)
        self._fds: dict[tuple[str, int], int] = {}
        self._hashed: dict[tuple[str, int], _Hashed] = {}
        self._sealed = {(o, i) for o, i in self.db.execute("SELECT owner, ino FROM replicas WHERE sealed = 1")}
        self._scan()

    def _scan(self) -> None:
        """Account the files the index names; remove those it does not (a connection lost before the entry)."""
        known = {(o, i) for o, i in self.db.execute("SELECT owner, ino FROM replicas")}
        for owner_dir in os.scandir(self.root):
            if not owner_dir.is_dir(follow_symlinks=False):
                continue
            for f in os.scandir(owner_dir.path):
                try:
                    ident = (owner_dir.name, int(f.name))
                except ValueError:
                    continue
                if ident in known:
                    self._bytes[ident] = f.stat().st_size
                else:
                    os.unlink(f.path)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self.db.close()

    # -- what the takeover reads ------------------------------------------------------------------------

    def path(self, owner: str, ino: int) -> str:
        return str(self.root / owner / str(ino))

    def _tagged(self, owner: str, journal: str | None, keep_incarnation: str | None) -> tuple[str, tuple[Any, ...]]:
        """The WHERE clause (and its values) of `owner`'s rows of `journal` (None: any), but those `keep_incarnation` sent."""
        j = journal or ""
        return (_OF_JOURNAL + " AND incarnation != ?",
                (owner, j, j, "\0" if keep_incarnation is None else keep_incarnation))

    def owners(self) -> list[str]:
        with self._lock:
            rows = self.db.execute("SELECT owner FROM replicas UNION SELECT owner FROM deletes "
                                   "UNION SELECT owner FROM checkpoints ORDER BY 1").fetchall()
        return [r[0] for r in rows]

    def checkpoints(self, owner: str) -> list[str]:
        """Checkpoints of `owner` whose files this node held until they were durable, not known to be committed: the
        owner's tracker commits them once quiet; if the owner is lost first, its taker does (`Takeover.finish`)."""
        with self._lock:
            rows = self.db.execute("SELECT path FROM checkpoints WHERE owner = ? ORDER BY path", (owner,)).fetchall()
        return [r[0] for r in rows]

    def note_checkpoint(self, owner: str, path: str, at: float) -> None:
        with self._lock:
            self.db.execute("INSERT OR REPLACE INTO checkpoints (owner, path, noted) VALUES (?, ?, ?)", (owner, path, at))

    def forget_checkpoints(self, before: float, owner: str | None = None) -> int:
        """Notes older than `before` dropped (their owner, alive that long after, committed them itself); how many."""
        with self._lock:
            if owner is None:
                cur = self.db.execute("DELETE FROM checkpoints WHERE noted < ?", (before,))
            else:
                cur = self.db.execute("DELETE FROM checkpoints WHERE owner = ? AND noted < ?", (owner, before))
            return cur.rowcount

    def _entry(self, row: tuple[Any, ...]) -> ReplicaEntry:
        (owner, ino, key, version, size, sealed, xxh3, copy_from, marker, seq, mtime, checkpoint, seen, journal, incarnation,
         blake3) = row
        return ReplicaEntry(owner, ino, key, version, size, bool(sealed), xxh3, copy_from, bool(marker), seq, mtime,
                            checkpoint, self.path(owner, ino), seen, journal, incarnation, blake3)

    def entries(self, owner: str, journal: str | None = None) -> list[ReplicaEntry]:
        """`owner`'s entries in its order; with `journal`: only those that journal's incarnations sent (a takeover of
        one incarnation of a node never takes another's, nor an owner back with a new journal the old one's)."""
        where, args = self._tagged(owner, journal, None)
        with self._lock:
            rows = self.db.execute(f"SELECT {_COLUMNS} FROM replicas WHERE {where} ORDER BY seq, ino", args).fetchall()
        return [self._entry(r) for r in rows]

    def entry(self, owner: str, ino: int) -> ReplicaEntry | None:
        with self._lock:
            row = self.db.execute(f"SELECT {_COLUMNS} FROM replicas WHERE owner = ? AND ino = ?", (owner, ino)).fetchone()
        return None if row is None else self._entry(row)

    def deletes(self, owner: str, journal: str | None = None) -> list[ReplicaDelete]:
        where, args = self._tagged(owner, journal, None)
        with self._lock:
            rows = self.db.execute(f"SELECT owner, op_id, key, seq, after_ino, journal, incarnation, etag FROM deletes WHERE {where} "
                                   "ORDER BY seq, op_id", args).fetchall()
        return [ReplicaDelete(*r) for r in rows]

    def held_bytes(self, owner: str | None = None) -> int:
        with self._lock:
            return sum(n for (o, _), n in self._bytes.items() if owner is None or o == owner)

    def verify(self, entry: ReplicaEntry) -> bool:
        """The data file's xxh3-128 and BLAKE3 equal the entry's, as the owner sealed it (blocking: run it in a thread).
        An entry renamed from a durable file (`copy_from`) with no data file holds no bytes to check: True."""
        if entry.xxh3 is None:
            return False
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except FileNotFoundError:
            return entry.copy_from is not None or entry.size == 0 and entry.xxh3 == xxhash.xxh3_128_hexdigest(b"")
        try:
            if os.fstat(fd).st_size != entry.size:
                return False
            h = SealHash()
            _hash_range(fd, h, 0, entry.size)
            mine = h.digest()
            return mine.xxh3 == entry.xxh3 and (entry.blake3 is None or mine.blake3 == entry.blake3)
        finally:
            os.close(fd)

    # -- dropping ----------------------------------------------------------------------------------------

    def drop(self, owner: str, ino: int) -> None:
        with self._lock:
            self._forget_file(owner, ino)  # first: on a disk left full by replicas the index cannot change before
            self.db.execute("DELETE FROM replicas WHERE owner = ? AND ino = ?", (owner, ino))
            self._sealed.discard((owner, ino))

    def _forget_file(self, owner: str, ino: int) -> None:
        fd = self._fds.pop((owner, ino), None)
        if fd is not None:
            os.close(fd)
        self._hashed.pop((owner, ino), None)
        self._bytes.pop((owner, ino), None)
        try:
            os.unlink(self.path(owner, ino))
        except FileNotFoundError:
            pass

    def drop_owner(self, owner: str, journal: str | None = None, keep_incarnation: str | None = None) -> None:
        """Drop `owner`'s replicas: all of them, or (`journal`) only those its incarnations of that journal sent, but
        (`keep_incarnation`) those of an incarnation the listener admits now: a takeover or a sweep drops what the
        incarnation it judged sent, never what a newer one sent since."""
        everything = journal is None and keep_incarnation is None
        where, args = self._tagged(owner, journal, keep_incarnation)
        with self._lock:
            inos = [r[0] for r in self.db.execute(f"SELECT ino FROM replicas WHERE {where}", args)]
            if everything:  # files the index does not name (a connection lost before the entry) too
                inos = sorted(set(inos) | {k[1] for k in self._bytes if k[0] == owner} | {k[1] for k in self._fds if k[0] == owner})
            # the files first: on a disk left full by replicas the index cannot change before
            for ino in inos:
                self._forget_file(owner, ino)
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute(f"DELETE FROM replicas WHERE {where}", args)
                self.db.execute(f"DELETE FROM deletes WHERE {where}", args)
                if everything:
                    self.db.execute("DELETE FROM checkpoints WHERE owner = ?", (owner,))
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
            self._sealed -= {(owner, ino) for ino in inos}
            left = self.db.execute("SELECT 1 FROM replicas WHERE owner = ? LIMIT 1", (owner,)).fetchone()
            if left is None and NODE_NAME.fullmatch(owner):
                try:
                    for f in os.scandir(self.root / owner):
                        os.unlink(f.path)
                    os.rmdir(self.root / owner)
                except FileNotFoundError:
                    pass

    # -- what the listener applies (an owner's frames, in order) -------------------------------------------

    def put_entry(self, owner: str, ino: int, meta: dict[str, Any], journal: str = "", incarnation: str = "") -> None:
        """Upsert a file's entry, tagged with the journal and incarnation that sent it. A new version is not sealed
        until the owner seals it; neither is an entry that replaces another journal's (an inode number of a new
        journal names another file). ValueError: malformed.

        An entry renamed from a durable file (`copy_from`) that the owner sends `sealed` is sealed as it arrives, with
        the object's xxh3: its bytes are the bucket's, there is nothing here to check (and what this node held of an
        earlier version is dropped). The owner counts it only once a barrier after it was answered (on the disk)."""
        m = _check_meta(meta)
        if m["copy_from"] is not None and m["sealed"]:
            with self._lock:
                self._forget_file(owner, ino)
                self.db.execute(f"INSERT OR REPLACE INTO replicas ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                                (owner, ino, m["key"], m["version"], m["size"], m["xxh3"], m["copy_from"], m["marker"],
                                 m["seq"], m["mtime"], m["checkpoint"], m["seen"], journal, incarnation))
                self._sealed.add((owner, ino))
            return
        with self._lock:
            row = self.db.execute("SELECT version, sealed, size, copy_from, journal FROM replicas WHERE owner = ? AND ino = ?",
                                  (owner, ino)).fetchone()
            # only write and truncate frames change a replica's bytes, and they unseal it first: a sealed replica
            # given a new version of the same size (a close or fsync that changed no byte) holds that version's bytes.
            # Not one sealed as a renamed durable file (it holds no bytes, and the file's are now to be sent), nor
            # one another journal sent
            sealed = bool(row and row[1] and row[2] == m["size"] and (row[3] is None or m["copy_from"] is not None)
                          and (not journal or row[4] == journal))
            if not sealed:
                self._sealed.discard((owner, ino))
            self.db.execute(
                f"INSERT OR REPLACE INTO replicas ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, "
                "(SELECT xxh3 FROM replicas WHERE owner = ? AND ino = ? AND sealed = 1 AND size = ?), ?, ?, ?, ?, ?, ?, ?, ?, "
                "(SELECT blake3 FROM replicas WHERE owner = ? AND ino = ? AND sealed = 1 AND size = ?))",
                (owner, ino, m["key"], m["version"], m["size"], sealed, owner, ino, m["size"], m["copy_from"],
                 m["marker"], m["seq"], m["mtime"], m["checkpoint"], m["seen"], journal, incarnation, owner, ino, m["size"]))

    def is_sealed(self, owner: str, ino: int) -> bool:
        return (owner, ino) in self._sealed

    def unseal(self, owner: str, ino: int) -> None:
        """Record the replica unsealed (on the disk) before its bytes change. Blocking: run it in a thread."""
        with self._lock:
            self.db.execute("UPDATE replicas SET sealed = 0 WHERE owner = ? AND ino = ?", (owner, ino))
            self._sealed.discard((owner, ino))
        self.sync()

    def sync(self) -> None:
        """Every change committed so far on the disk: the index's WAL (and the directory naming it) fsynced."""
        for name in ("replicas.db-wal", "replicas.db", "."):
            try:
                fd = os.open(self.root / name, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _fd(self, owner: str, ino: int) -> int:
        fd = self._fds.get((owner, ino))
        if fd is None:
            (self.root / owner).mkdir(mode=0o700, exist_ok=True)
            fd = os.open(self.path(owner, ino), os.O_RDWR | os.O_CREAT, 0o600)
            self._fds[(owner, ino)] = fd
            self._bytes.setdefault((owner, ino), os.fstat(fd).st_size)
        return fd

    def room(self) -> int:
        """Bytes replicas may still add: the capacity left, and the disk above the cache's reserve."""
        st = os.statvfs(self.root)
        with self._lock:
            held = sum(self._bytes.values())
        return min(self.capacity - held, st.f_bavail * st.f_frsize - self.min_free)

    def reserve(self, owner: str, ino: int, end: int) -> int:
        """Make room for the replica to reach `end` bytes (ReplicaFull if there is none); returns its fd."""
        with self._lock:
            fd = self._fd(owner, ino)
            grow = end - self._bytes.get((owner, ino), 0)
            if grow > 0:
                room = self.room()
                if grow > room:
                    raise ReplicaFull(f"replicas of other nodes would pass peer_capacity ({self.capacity} bytes) "
                                      f"or the cache disk's reserve: {max(room, 0)} bytes left, {grow} needed")
                self._bytes[(owner, ino)] = end
            return fd

    def wrote(self, owner: str, ino: int, offset: int) -> None:
        """Bytes were written at `offset`: a hash state past it no longer holds."""
        with self._lock:
            hashed = self._hashed.get((owner, ino))
            if hashed is not None and offset < hashed.upto:
                del self._hashed[(owner, ino)]

    def writing(self, owner: str, ino: int, offset: int) -> "_Hashed | None":
        """Bytes are about to be written at `offset` (what `wrote` forgets, forgotten). Returns the hash state to feed
        them to, in order, as they are written, when they continue the replica's hashed prefix (or start the file
        over at 0): the seal then reads from the disk only what was not streamed in order. The caller updates the
        state and its `upto` after each write that reached the file, and stops at the first one that did not."""
        with self._lock:
            self.wrote(owner, ino, offset)
            if offset == 0:
                self._hashed[(owner, ino)] = _Hashed(SealHash(), 0)
            hashed = self._hashed.get((owner, ino))
            return hashed if hashed is not None and hashed.upto == offset else None

    def truncate(self, owner: str, ino: int, size: int) -> None:
        with self._lock:
            fd = self.reserve(owner, ino, size)
            os.ftruncate(fd, size)
            self._bytes[(owner, ino)] = size
            self.wrote(owner, ino, size)

    def seal(self, owner: str, ino: int, version: int, size: int, xxh3: str, blake3: str | None = None) -> str:
        """Make the replica durable and check it: fsync the data, hash what was not hashed as it arrived from the disk,
        compare with the owner's xxh3 and BLAKE3 (None: an owner of an earlier release sent none), record it sealed (committed, fsynced). Raises ReplicaMismatch, ReplicaUnknown, OSError.
        Blocking: run it in a thread. An entry renamed from a durable file (`copy_from`) with no bytes sent is
        sealed as metadata: its bytes are in the bucket already."""
        entry = self.entry(owner, ino)
        if entry is None:
            raise ReplicaUnknown(f"no entry for inode {ino} of {owner}")
        if entry.copy_from is not None and (owner, ino) not in self._bytes:
            mine = SealDigest(xxh3, blake3 or "")
        else:
            with self._lock:
                fd = self._fd(owner, ino)
            os.fsync(fd)
            on_disk = os.fstat(fd).st_size
            if on_disk != size:
                raise ReplicaMismatch(f"the peer holds {on_disk} bytes of inode {ino}, the owner sealed {size}")
            mine = self._hash(owner, ino, fd, size)
            with self._lock:  # a sealed replica is read again only by a takeover or a later write
                fd = self._fds.pop((owner, ino), None)
                if fd is not None:
                    os.close(fd)
            dir_fd = os.open(self.root / owner, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)  # the file's name is durable too
            finally:
                os.close(dir_fd)
        if mine.xxh3 != xxh3:
            raise ReplicaMismatch(f"the peer's xxh3 of inode {ino} ({size} bytes) is {mine.xxh3}, the owner's {xxh3}")
        if blake3 is not None and mine.blake3 != blake3:  # bytes altered that the xxh3 let through: never an accident
            raise ReplicaMismatch(f"the peer's BLAKE3 of inode {ino} ({size} bytes) differs from the owner's (its xxh3 "
                                  "matches: bytes altered on the way?)")
        with self._lock:
            self.db.execute("UPDATE replicas SET sealed = 1, xxh3 = ?, blake3 = ?, version = ?, size = ? WHERE owner = ? AND ino = ?",
                            (mine.xxh3, blake3, version, size, owner, ino))
            self._sealed.add((owner, ino))
        self.sync()
        return mine.xxh3

    def _hash(self, owner: str, ino: int, fd: int, size: int) -> SealDigest:
        with self._lock:
            hashed = self._hashed.pop((owner, ino), None)
        if hashed is None or hashed.upto > size:
            hashed = _Hashed(SealHash(), 0)
        _hash_range(fd, hashed.state, hashed.upto, size)
        hashed.upto = size
        with self._lock:
            self._hashed[(owner, ino)] = hashed
        return hashed.state.copy().digest()

    def forget(self, owner: str, ino: int, version: int | None, journal: str = "") -> None:
        """The owner's file is durable (or removed) at `version`: drop the replica unless it holds a newer one, or
        one another journal of the owner sent (a new incarnation with an empty journal forgets what it does not
        list: never its predecessor's files, which its inode numbers do not name). A durable file's checkpoint is
        noted: not committed yet as far as this node knows, and if the owner is lost before it commits it, nothing
        else would remember it (the owner's tracker state is gone with it)."""
        with self._lock:
            row = self.db.execute("SELECT version, checkpoint, sealed, journal FROM replicas WHERE owner = ? AND ino = ?",
                                  (owner, ino)).fetchone()
            if row is not None and journal and row[3] and row[3] != journal:
                return
            if version is None or row is None or row[0] <= version:
                if row is not None and row[1] and row[2]:
                    self.note_checkpoint(owner, row[1], time.time())
                self.drop(owner, ino)

    def add_delete(self, owner: str, op_id: int, key: str, seq: int, after_ino: int | None = None, journal: str = "",
                   incarnation: str = "", etag: str = "") -> None:
        with self._lock:
            self.db.execute("INSERT OR REPLACE INTO deletes (owner, op_id, key, seq, after_ino, journal, incarnation, etag) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (owner, op_id, key, seq, after_ino, journal, incarnation, etag))

    def drop_delete(self, owner: str, op_id: int, journal: str = "") -> None:
        with self._lock:
            j = journal or ""
            self.db.execute(f"DELETE FROM deletes WHERE {_OF_JOURNAL} AND op_id = ?", (owner, j, j, op_id))

    def holdings(self, owner: str, journal: str | None = None) -> list[dict[str, Any]]:
        """What this node holds of `owner`'s journal (None: any): an owner back with a new journal is not told of its
        predecessor's files, so it never sends a forget for them."""
        return [{"ino": e.ino, "version": e.version, "size": e.size, "sealed": e.sealed, "xxh3": e.xxh3}
                for e in self.entries(owner, journal)]


def _hash_range(fd: int, h: Any, start: int, end: int) -> None:
    if hash_range(h, fd, start, end) != end - start:
        raise OSError(errno.EIO, f"replica file shorter than {end} bytes")
