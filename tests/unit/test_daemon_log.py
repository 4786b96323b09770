"""The daemon's log survives a log file it cannot write (cli/daemonlog.py): /dev/full says ENOSPC like a full cache disk.

Each line goes to the system log socket meanwhile (a datagram socket this test binds, as journald binds
/dev/log), is written to the log file in order once it takes writes again, and nothing is raised into the
caller nor printed as a traceback.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Iterator

import pytest

from ckptfs.cli.daemonlog import DaemonLogHandler


@pytest.fixture
def syslog(tmp_path: Path) -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(tmp_path / "dev-log"))
    s.settimeout(5)
    yield s
    s.close()


def logger_to(handler: logging.Handler) -> logging.Logger:
    log = logging.getLogger(f"test-daemon-log-{id(handler)}")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    return log


def test_a_full_log_disk_sends_lines_to_the_system_log_and_writes_them_later(tmp_path: Path, syslog: socket.socket,
                                                                            capfd: pytest.CaptureFixture[str]) -> None:
    full = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
    handler = DaemonLogHandler(full, syslog_address=str(tmp_path / "dev-log"))
    log = logger_to(handler)
    log.info("mounted")
    log.error("listing failed: %s", "no space left on the cache disk")
    log.info("bad %d format", "not a number")  # a caller's mistake costs neither the line nor a traceback
    assert handler.failed_writes == 3
    received = [syslog.recv(65536).decode() for _ in range(3)]
    assert received[0] == f"<30>ckptfs[{os.getpid()}]: INFO mounted"
    assert received[1] == f"<27>ckptfs[{os.getpid()}]: ERROR listing failed: no space left on the cache disk"
    assert "bad %d format" in received[2]

    # room again: the same descriptor now reaches a file with space
    log_file = tmp_path / "ckptfs.log"
    room = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(room, full)
    log.warning("space is back")
    lines = log_file.read_text().splitlines()
    assert lines[0].startswith("3 log lines could not be written here when they were logged (OSError: [Errno 28]")
    assert lines[1:3] == ["INFO mounted", "ERROR listing failed: no space left on the cache disk"]
    assert "bad %d format" in lines[3]
    assert lines[4] == "WARNING space is back"
    assert handler.held == []
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "Logging error" not in out + err
    os.close(room)
    os.close(full)


def test_without_a_system_log_the_lines_wait_in_memory_and_the_first_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                              capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("ckptfs.cli.daemonlog.HELD_LINES_MAX", 3)
    full = os.open("/dev/full", os.O_WRONLY)
    handler = DaemonLogHandler(full, syslog_address=str(tmp_path / "no-such-socket"))
    log = logger_to(handler)
    for i in range(5):
        log.error("line %d", i)
    room = os.open(tmp_path / "ckptfs.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(room, full)
    log.info("after")
    lines = (tmp_path / "ckptfs.log").read_text().splitlines()
    assert "5 log lines could not be written" in lines[0] and "but for 2 that did not fit in memory" in lines[0]
    assert lines[1:] == ["ERROR line 0", "ERROR line 1", "ERROR line 2", "INFO after"]  # the first say why: kept
    assert "Traceback" not in "".join(capfd.readouterr())
    os.close(room)
    os.close(full)


def test_a_closed_log_descriptor_raises_nothing(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    handler = DaemonLogHandler(w, syslog_address="")
    logger_to(handler).error("the descriptor is gone")  # EBADF: kept, not raised
    assert handler.failed_writes == 1 and len(handler.held) == 1
