"""What `ckptfs status` and `ckptfs flush` print, from the daemon's answers (no mount needed)."""

from __future__ import annotations

import io
from typing import Any

from ckptfs.cli.display import FlushProgress, fmt_duration, make_console, plural, status_lines
from ckptfs.drain import Throughput

MiB = 1 << 20


def screen(st: dict[str, Any]) -> str:
    return "\n".join(line.plain for line in status_lines(st))


def test_plural_and_durations() -> None:
    assert plural(1, "file") == "1 file"
    assert plural(0, "file") == "0 files"
    assert plural(2, "stale directory", "stale directories") == "2 stale directories"
    assert [fmt_duration(s) for s in (0.2, 42, 185, 7380, 90000)] == ["0s", "42s", "3m 05s", "2h 03m", "1d 1h"]


BUSY = {
    "version": "1.2.3", "mountpoint": "/mnt/ckpt", "source": "s3://b/p", "pid": 42, "uptime_seconds": 3700,
    "dirty_files": 1, "dirty_bytes": 100 * MiB, "uploading_files": 1, "oldest_dirty_age_seconds": 12,
    "dirty_bytes_in_bucket": 40 * MiB, "upload_bytes_per_second": 10 * MiB, "upload_rate_window_seconds": 30,
    "drain_eta_seconds": 6.0, "parts_in_flight": 1, "uploaded_bytes_total": 0, "uploaded_files_total": 0,
    "cache_used_bytes": 100 * MiB, "cache_capacity_bytes": 1024 * MiB, "cache_dirty_bytes": 0, "cache_uploading_bytes": 100 * MiB,
    "stalled_writers": 1, "upload_errors_total": 1, "listing_errors_total": 2,
    "last_error": "PUT p/x: SlowDown", "last_error_age_seconds": 75.0, "open_for_writing": ["step_1/model.pt"],
}


def test_status_screen_busy_mount() -> None:
    text = screen(BUSY)
    assert text.splitlines()[0].startswith("ckptfs 1.2.3  /mnt/ckpt ← s3://b/p")
    assert "1 dirty file (100.0 MiB) not in the bucket" in text and "1 open for writing" in text
    assert "10.0 MiB/s" in text and "ETA 6s for 60.0 MiB" in text and "1 part in flight" in text
    assert "1 writer stalled" in text
    assert "1 upload error · 2 listing errors" in text
    assert "1m 15s ago: PUT p/x: SlowDown" in text
    assert "1 files" not in text and "1 parts" not in text and "1 writers" not in text


def test_status_screen_idle_mount_and_old_error() -> None:
    st = {**BUSY, "dirty_files": 0, "dirty_bytes": 0, "dirty_bytes_in_bucket": 0, "drain_eta_seconds": 0.0, "parts_in_flight": 0,
          "stalled_writers": 0, "upload_errors_total": 0, "listing_errors_total": 0, "uploaded_files_total": 1,
          "uploaded_bytes_total": 100 * MiB, "last_error_age_seconds": 3 * 3600.0}
    text = screen(st)
    assert "nothing dirty" in text and "ETA" not in text
    assert "uploaded 100.0 MiB (1 file)" in text
    assert "errors   none" in text
    assert "SlowDown" not in text  # a last error from hours ago is not news


def test_status_screen_stale_directories_and_unknown_eta() -> None:
    text = screen({**BUSY, "stale_directories": 1, "drain_eta_seconds": None, "upload_bytes_per_second": 0})
    assert "1 stale directory" in text
    assert "ETA unknown" in text
    assert "stale" not in screen({k: v for k, v in BUSY.items() if k != "stale_directories"})  # missing counts as 0


def test_flush_progress_moves_within_one_file() -> None:
    """A single large file: parts already in the bucket count, so progress moves before the file is durable."""
    out = io.StringIO()
    p = FlushProgress("mnt/big", make_console(out))
    for uploaded in (0, 25, 50, 75):
        p.update({"files": 1, "bytes": 100 * MiB, "deletes": 0, "uploaded_bytes": uploaded * MiB, "upload_bytes_per_second": 5 * MiB})
    lines = out.getvalue().splitlines()
    assert lines[0] == "ckptfs: flush mnt/big: 0 B of 100.0 MiB durable (0%), 5.0 MiB/s, ETA 20s, 1 file left"
    assert lines[-1] == "ckptfs: flush mnt/big: 75.0 MiB of 100.0 MiB durable (75%), 5.0 MiB/s, ETA 5s, 1 file left"
    assert "\x1b[" not in out.getvalue()  # not a terminal: no colour, no cursor moves


def test_flush_progress_starts_from_what_is_in_the_bucket_and_never_goes_back() -> None:
    out = io.StringIO()
    p = FlushProgress("m", make_console(out))
    p.update({"files": 1, "bytes": 100 * MiB, "deletes": 0, "uploaded_bytes": 40 * MiB, "upload_bytes_per_second": 0})
    assert (p.completed, p.total) == (40 * MiB, 100 * MiB)
    # a second file joins the flush: the total grows, what is durable stays
    p.update({"files": 2, "bytes": 150 * MiB, "deletes": 0, "uploaded_bytes": 40 * MiB, "upload_bytes_per_second": 0})
    assert (p.completed, p.total) == (40 * MiB, 150 * MiB)
    assert out.getvalue().splitlines()[0].endswith("40.0 MiB of 100.0 MiB durable (40%), 0 B/s, ETA unknown, 1 file left")


def test_throughput_counts_only_time_spent_sending() -> None:
    now = [0.0]
    t = Throughput(window=30, clock=lambda: now[0])
    assert t.rate() == 0.0
    t.started()
    now[0] = 4.0
    t.add(40 * MiB)
    t.stopped()
    assert t.rate() == 10 * MiB
    now[0] = 20.0  # idle since: the idle time does not dilute the figure
    assert t.rate() == 10 * MiB
    t.started()
    now[0] = 30.0  # sending for 10 s without finishing anything (a stuck store)
    assert t.rate() == 40 * MiB / 14
    now[0] = 40.0  # the completed part left the window
    assert t.rate() == 0.0


def test_status_screen_names_the_services_that_restarted() -> None:
    running = {"state": "running", "restarts": 0, "last_error": None}
    calm = {"control": running, "drainer": running, "listings": running}
    assert "services all 3 running, none restarted" in screen({**BUSY, "services": calm})
    troubled = {**calm, "drainer": {"state": "restarting", "restarts": 3, "last_error": "RuntimeError: boom"},
                "listings": {"state": "running", "restarts": 1, "last_error": "KeyError: 'x'"}}
    line = next(l for l in screen({**BUSY, "services": troubled}).splitlines() if l.startswith("services"))
    assert line == "services drainer restarting (3 restarts): RuntimeError: boom · listings running again (1 restart): KeyError: 'x' · 1 other running"
    assert "services" not in screen(BUSY)  # an older daemon says nothing about them


PEERS = {"node": "node-a", "durability": "peer", "peer_state": "live", "single_copy_bytes": 0, "single_copy_oldest_age_seconds": 0,
         "peers": [{"node": "node-b", "addr": "10.0.0.6:7470", "state": "live", "lag_seconds": 2.4},
                   {"node": "node-c", "addr": "10.0.0.7:7470", "state": "down", "lag_seconds": None}],
         "peer_replica_bytes": 3 * MiB, "peer_takeovers_total": 1, "peer_degraded_writes_total": 0}


def test_status_screen_lists_the_peers_and_the_single_copy_window() -> None:
    text = screen({**BUSY, **PEERS})
    peers = next(line for line in text.splitlines() if line.startswith("peers"))
    assert peers == ("peers    node-a live · node-b live (lag 2s) · node-c down · nothing single-copy · holding 3.0 MiB for others · "
                     "1 takeover")
    degraded = screen({**BUSY, **PEERS, "peer_state": "fenced", "peers": [], "single_copy_bytes": 5 * MiB,
                       "single_copy_oldest_age_seconds": 130, "peer_degraded_writes_total": 2, "peer_takeovers_total": 0})
    assert ("peers    node-a fenced · no peer known · 5.0 MiB single-copy for 2m 10s · 2 writes acknowledged without a peer · "
            "holding 3.0 MiB for others") in degraded
    # durability = local: no peers line (the drain line says what is on this node only)
    assert "peers" not in screen({**BUSY, "durability": "local", "peers": [], "single_copy_bytes": 100 * MiB})


def test_flush_progress_of_level_replicated_counts_toward_replicated_without_an_upload_rate() -> None:
    out = io.StringIO()
    progress = FlushProgress("/mnt/ckpt/step_1", make_console(out), level="replicated")
    progress.update({"files": 2, "bytes": 8 * MiB, "deletes": 0})
    progress.update({"files": 0, "bytes": 0, "deletes": 0})
    assert out.getvalue().splitlines() == [
        "ckptfs: flush /mnt/ckpt/step_1: 0 B of 8.0 MiB replicated (0%), 2 files left",
        "ckptfs: flush /mnt/ckpt/step_1: 8.0 MiB of 8.0 MiB replicated (100%), 0 files left",
    ]


def test_a_flush_with_nothing_left_prints_no_progress() -> None:
    """Issue 43: `flush --level replicated` of a replicated file printed `0 B of 0 B replicated (100%), 0 files left`."""
    out = io.StringIO()
    progress = FlushProgress("/mnt/ckpt/step_1", make_console(out), level="replicated")
    progress.update({"files": 0, "bytes": 0, "deletes": 0})
    progress.update({"files": 0, "bytes": 0, "deletes": 0})
    assert out.getvalue() == ""
