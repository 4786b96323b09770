"""The daemon's log handler: a line that cannot be written is kept and sent elsewhere, never lost, never raised.

The daemon logs to its stderr: the journal under systemd, `CACHE_DIR/ckptfs.log` with `--daemon`. That
file is on the cache disk, which can fill up (another process on the node writes to it) or fail (EIO),
and the lines written then are the ones that say what went wrong. `logging.StreamHandler` would hand the
error to `Handler.handleError`, which prints a traceback to the same stderr that just failed, and the
line is gone. Here a line that cannot be written (ENOSPC, EIO, anything) is

* sent to the system log instead (`/dev/log`: journald under systemd, rsyslog elsewhere; the same
  priorities as on the journal stream), when there is one;
* kept in memory (up to `HELD_LINES_MAX` lines; past that the newest are counted, not kept: the first say
  why), and written to stderr, in order, before the next line once stderr takes writes again;

and nothing is ever raised into the daemon. Lines are written with one `os.write` each, unbuffered, so a
failed write leaves no half-flushed buffer behind.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys

HELD_LINES_MAX = 10_000
SYSLOG_ADDRESS = "/dev/log"
SYSLOG_FACILITY_DAEMON = 3
PRIORITIES = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class DaemonLogHandler(logging.Handler):
    def __init__(self, fd: int = 2, syslog_address: str = SYSLOG_ADDRESS, ident: str = "ckptfs") -> None:
        super().__init__()
        self.fd = fd
        self.syslog_address = syslog_address
        self.ident = ident
        self.held: list[bytes] = []  # lines stderr did not take, oldest first
        self.dropped = 0  # lines past HELD_LINES_MAX while stderr failed
        self.failed_writes = 0  # lines stderr did not take when they were logged, since the start
        self.last_error = ""  # why the last write failed (for the note written once stderr works again)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception as e:  # noqa: BLE001 - a bad format string must not cost the line
            line = f"{record.levelname} {record.name}: {record.msg!r} {record.args!r} (could not format: {e!r})"
        data = (line + "\n").encode("utf-8", "backslashreplace")
        if self.held and not self._write_held():
            self._hold(data, record.levelno, line)
            return
        try:
            self._write(data)
        except Exception as e:  # noqa: BLE001 - ENOSPC, EIO, a closed descriptor: the line goes elsewhere
            self.last_error = f"{type(e).__name__}: {e}"
            self._hold(data, record.levelno, line)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """Never a traceback on the stderr that just failed (logging's default): emit handles every error itself."""

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def _hold(self, data: bytes, levelno: int, line: str) -> None:
        self.failed_writes += 1
        self._to_syslog(levelno, line)
        if len(self.held) < HELD_LINES_MAX:
            self.held.append(data)
        else:
            self.dropped += 1

    def _write_held(self) -> bool:
        """Write what stderr refused before, oldest first; True once all of it is written."""
        try:
            note = (f"{len(self.held) + self.dropped} log lines could not be written here when they were logged "
                    f"({self.last_error}); they follow")
            if self.dropped:
                note += f", but for {self.dropped} that did not fit in memory"
            self._write((note + "\n").encode())
            while self.held:
                self._write(self.held[0])
                self.held.pop(0)
            self.dropped = 0
            return True
        except Exception:  # noqa: BLE001 - still failing: keep them
            return False

    def _to_syslog(self, levelno: int, line: str) -> None:
        """The line to the system log (journald reads /dev/log), if the node has one; silently not otherwise."""
        if not self.syslog_address or not os.path.exists(self.syslog_address):
            return
        priority = SYSLOG_FACILITY_DAEMON * 8 + PRIORITIES.get(levelno, 6)
        line = re.sub(r"^<\d>", "", line)  # the journal stream's priority prefix (JournalFormatter): syslog has its own
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.settimeout(1.0)
                s.connect(self.syslog_address)
                s.send(f"<{priority}>{self.ident}[{os.getpid()}]: {line}".encode("utf-8", "backslashreplace")[:65000])
        except OSError:
            pass


def stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        return 2
