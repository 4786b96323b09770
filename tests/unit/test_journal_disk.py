"""The journal on a full or failing disk (issue 34 item 2): every write path answers with an errno and leaves
nothing half applied. SQLITE_FULL without filling a disk: `PRAGMA max_page_count` caps the database."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import pytest

from ckptfs.journal import DIRTY, DURABLE, JOURNAL_RESERVE, ROOT_INODE, DiskFull, Journal


def capped(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    pages = j.db.execute("PRAGMA page_count").fetchone()[0]
    j.db.execute(f"PRAGMA max_page_count = {pages}")
    return j


ROWS = [(f"n{i}-" + "x" * 300, "file", 0o644, 0, 0, 1, 1) for i in range(300)]
INSERT = "INSERT INTO inodes(parent, name, kind, mode, uid, gid, mtime_ns, ctime_ns) VALUES (1, ?, ?, ?, ?, ?, ?, ?)"


def test_executemany_alone_on_a_full_journal_is_enospc_and_changes_no_row(tmp_path: Path) -> None:
    j = capped(tmp_path)
    with pytest.raises(DiskFull) as e:
        j.db.executemany(INSERT, ROWS)
    assert e.value.errno == errno.ENOSPC
    assert not j.db.in_transaction
    assert j.children(ROOT_INODE) == []  # not the first rows committed one by one and the rest lost
    assert os.stat(tmp_path / "journal.reserve").st_size == 0  # given up for the next change, retried once


def test_executemany_in_a_transaction_on_a_full_journal_rolls_all_of_it_back(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    with j.transaction():
        a = j.insert(ROOT_INODE, "a", "file", 0o644, 0, 0, DURABLE)
    pages = j.db.execute("PRAGMA page_count").fetchone()[0]
    j.db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(DiskFull):
        with j.transaction():
            j.update(a.ino, state=DIRTY)
            j.update(a.ino, seen_at=123.0)
            j.db.executemany(INSERT, ROWS)
    got = j.get(a.ino)
    assert got is not None and got.state == DURABLE and got.seen_at != 123.0
    assert [r.name for r in j.children(ROOT_INODE)] == ["a"]


def test_executemany_alone_commits_every_row_when_there_is_room(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    j.db.executemany(INSERT, (r for r in ROWS[:5]))  # a generator: read once, kept for a retry
    assert len(j.children(ROOT_INODE)) == 5
    assert os.stat(tmp_path / "journal.reserve").st_size == JOURNAL_RESERVE


def test_a_disk_io_error_is_eio_and_a_full_disk_enospc() -> None:
    from ckptfs.dbconnection import _disk_error

    for code, want in ((sqlite3.SQLITE_IOERR_WRITE, errno.EIO), (sqlite3.SQLITE_IOERR_FSYNC, errno.EIO),
                       (sqlite3.SQLITE_FULL, errno.ENOSPC)):
        e = sqlite3.OperationalError("disk")
        e.sqlite_errorcode = code
        mapped = _disk_error(e)
        assert isinstance(mapped, OSError) and mapped.errno == want
    other = sqlite3.OperationalError("no such table")
    other.sqlite_errorcode = sqlite3.SQLITE_ERROR
    assert _disk_error(other) is None
