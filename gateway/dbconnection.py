"""The journal's SQLite connection on a disk that can fill up or fail (see journal.py, "A full disk").

Every statement reaches SQLite through `Connection`, which answers the disk's failures with an errno
instead of a `sqlite3.OperationalError` that nobody on a request path or in a background service
expects: SQLITE_FULL is `DiskFull` (ENOSPC), SQLITE_IOERR is `JournalIOError` (EIO). A write that
failed whole on a full disk is retried once after the journal gives up its reserve.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable

from .sizes import fmt_bytes


class DiskFull(OSError):
    """The cache disk is full and the journal's reserve is spent: the change was not made."""

    def __init__(self) -> None:
        super().__init__(errno.ENOSPC, "cache disk full: the journal cannot be written")


class JournalIOError(OSError):
    """The cache disk failed a read or write of the journal (SQLITE_IOERR): the change was not made."""

    def __init__(self, detail: str) -> None:
        super().__init__(errno.EIO, f"cache disk I/O error: the journal cannot be used ({detail})")
        self.detail = detail


def open_failure(path: Path, e: OSError) -> str:
    """The one line that refuses a start whose journal cannot be opened on its disk: full (SQLite may say
    "disk I/O error" for a shared-memory file it cannot size on a full disk), or failing."""
    if isinstance(e, DiskFull) or disk_is_full(path.parent):
        return disk_full_message(path.parent)
    detail = e.detail if isinstance(e, JournalIOError) else e.strerror
    return f"journal {path} cannot be read or written ({detail}): check the cache disk (dmesg), then remount"


def disk_is_full(directory: Path | str) -> bool:
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def disk_full_message(directory: Path | str) -> str:
    """The one line that refuses a start on a full cache file system (the lock file, the journal's open)."""
    try:
        st = os.statvfs(directory)
        free = f"{fmt_bytes(st.f_bavail * st.f_frsize)} free"
    except OSError:
        free = "free space unknown"
    return (f"cache directory {directory}'s file system is full ({free}): free space on it (ckptfs needs room for its "
            "journal and the files being written) or use another --cache-dir")


def _disk_error(e: sqlite3.Error) -> OSError | None:
    """The errno a SQLite error stands for when the disk is the cause (full, failing); None otherwise."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is None:
        return None
    if code & 0xFF == sqlite3.SQLITE_FULL:
        return DiskFull()
    if code & 0xFF == sqlite3.SQLITE_IOERR:
        return JournalIOError(str(e))
    return None


class Connection(sqlite3.Connection):
    """A connection that meets a full disk by giving up the journal's reserve and retrying once, and that
    answers a full or failing disk with an errno (`DiskFull`, `JournalIOError`) on every path."""

    release_reserve: Callable[[], bool] = staticmethod(lambda: False)
    before_commit: Callable[[], None] = staticmethod(lambda: None)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        was_open = self.in_transaction
        if sql == "COMMIT":
            # SQLite rolls a transaction back when its COMMIT meets a full disk: the reserve must be given
            # up before that, not after (see Journal._room_for_commit)
            self.before_commit()
        try:
            return super().execute(sql, parameters)
        except sqlite3.DatabaseError as e:
            mapped = _disk_error(e)
            if not isinstance(mapped, DiskFull):
                if mapped is not None:
                    raise mapped from None
                raise
            # retry only a write that failed whole: outside a transaction SQLite rolled the statement
            # back; a COMMIT may be retried while its transaction is still open. Either way the disk is
            # full: the reserve goes, so the next change (a close, an unlink that frees space) commits.
            whole = not was_open or (sql == "COMMIT" and self.in_transaction)
            if not self.release_reserve() or not whole:
                raise DiskFull() from None
        try:
            return super().execute(sql, parameters)
        except sqlite3.DatabaseError as e:
            raise _disk_error(e) or e from None

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> sqlite3.Cursor:
        rows = list(seq_of_parameters)  # run twice when retried on the reserve
        if self.in_transaction:  # the caller's transaction: its rollback undoes every row on failure
            try:
                return super().executemany(sql, rows)
            except sqlite3.DatabaseError as e:
                raise _disk_error(e) or e from None
        # alone, each row would commit by itself: one transaction, so a failure halfway leaves no row changed
        for attempt in (1, 2):
            self.execute("BEGIN IMMEDIATE")
            try:
                cur = super().executemany(sql, rows)
            except sqlite3.DatabaseError as e:
                if self.in_transaction:
                    super().execute("ROLLBACK")
                mapped = _disk_error(e)
                if isinstance(mapped, DiskFull) and attempt == 1 and self.release_reserve():
                    continue
                raise mapped or e from None
            except BaseException:
                if self.in_transaction:
                    super().execute("ROLLBACK")
                raise
            try:
                self.execute("COMMIT")  # retried on the reserve like any COMMIT
            except BaseException:
                if self.in_transaction:
                    super().execute("ROLLBACK")
                raise
            return cur
        raise AssertionError("unreachable")

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        try:
            return super().executescript(sql_script)
        except sqlite3.DatabaseError as e:
            raise _disk_error(e) or e from None
