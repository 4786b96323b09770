"""Lifecycle metrics: the catalogue summarised (by state, newest committed, last verify, protected).

The summary comes from the last walk of the bucket's catalogue: one every
`SCAN_SECONDS` in the background, and one whenever `ckptfs checkpoints` lists
the whole mount; the scrape itself makes no request. Registered on the
daemon's Prometheus registry; every metric is in docs/metrics.md.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .catalogue import STATES
from .context import Context

SCAN_SECONDS = 60.0


def summarize(entries: list[dict[str, Any]]) -> dict[str, Any]:
    count = {s: 0 for s in STATES}
    size = {s: 0 for s in STATES}
    newest: dict[str, Any] | None = None
    verified: dict[str, Any] | None = None
    for e in entries:
        count[e["state"]] = count.get(e["state"], 0) + 1
        size[e["state"]] = size.get(e["state"], 0) + int(e["bytes"])
        if e["committed"] and (newest is None or e["step"] > newest["step"]):
            newest = e
        v = e.get("last_verify")
        if v and (verified is None or v.get("at", 0) > verified.get("at", 0)):
            verified = v
    return {"at": time.time(), "count": count, "bytes": size, "protected": sum(1 for e in entries if e["protected"]),
            "newest_step": newest["step"] if newest else 0, "newest_committed_at": newest["committed_at"] if newest else 0.0,
            "last_verify": verified}


class LifecycleCollector(Collector):
    def __init__(self, lc: Context) -> None:
        self.lc = lc

    def collect(self):  # type: ignore[no-untyped-def]
        lc = self.lc
        s = lc.summary
        by_state = GaugeMetricFamily("ckptfs_checkpoints", "Checkpoints in the bucket under the mount, by state (from the last catalogue walk).", labels=["state"])
        size = GaugeMetricFamily("ckptfs_checkpoint_bytes", "Bytes of those checkpoints, by state.", labels=["state"])
        for state in STATES:
            by_state.add_metric([state], float(s.get("count", {}).get(state, 0)))
            size.add_metric([state], float(s.get("bytes", {}).get(state, 0)))
        yield by_state
        yield size
        g = GaugeMetricFamily("ckptfs_checkpoints_protected", "Protected (golden) checkpoints.")
        g.add_metric([], float(s.get("protected", 0)))
        yield g
        g = GaugeMetricFamily("ckptfs_checkpoint_newest_committed_step", "Step of the newest committed checkpoint; 0 if none.")
        g.add_metric([], float(s.get("newest_step", 0)))
        yield g
        at = float(s.get("newest_committed_at", 0) or 0)
        g = GaugeMetricFamily("ckptfs_checkpoint_newest_committed_age_seconds", "Seconds since the newest committed checkpoint was committed; 0 if none.")
        g.add_metric([], max(0.0, time.time() - at) if at else 0.0)
        yield g
        verify = lc.last_verify if lc.last_verify and (not s.get("last_verify") or lc.last_verify["at"] >= s["last_verify"].get("at", 0)) else s.get("last_verify")
        g = GaugeMetricFamily("ckptfs_checkpoint_last_verify_timestamp_seconds", "When the most recent verify of any checkpoint ran (Unix time); 0 if never.")
        g.add_metric([], float(verify["at"]) if verify else 0.0)
        yield g
        g = GaugeMetricFamily("ckptfs_checkpoint_last_verify_whole", "1 if the most recent verify found its checkpoint whole, 0 if not (or never verified).")
        g.add_metric([], 1.0 if verify and verify.get("outcome") == "whole" else 0.0)
        yield g
        g = GaugeMetricFamily("ckptfs_retention_lease_held", "1 while this node holds the retention lease (runs retention on the schedule).")
        g.add_metric([], 1.0 if lc.retention_lease is not None and lc.retention_lease.valid() else 0.0)
        yield g
        g = GaugeMetricFamily("ckptfs_retention_last_run_timestamp_seconds", "When retention last ran on this node (Unix time); 0 if never.")
        g.add_metric([], float(lc.retention_stats["last_run"]))
        yield g
        last = lc.drill_record.get("last") or {}
        success = lc.drill_record.get("last_success") or {}
        for name, value, doc in (
            ("ckptfs_drill_last_timestamp_seconds", last.get("at", 0), "When the most recent recovery drill (ckptfs drill, any node) started (Unix time); 0 if none."),
            ("ckptfs_drill_last_success_timestamp_seconds", success.get("at", 0), "When the most recent successful drill started (Unix time); 0 if none."),
            ("ckptfs_drill_last_ok", 1 if last.get("outcome") == "ok" else 0, "1 if the most recent drill succeeded (restored whole, command exited 0), 0 if it failed or none ran."),
            ("ckptfs_drill_last_duration_seconds", last.get("seconds", 0), "Seconds the most recent drill took: restore and deep verify, plus the user's command."),
            ("ckptfs_drill_last_restore_bytes_per_second", last.get("bytes_per_second", 0), "Restore throughput of the most recent drill (bytes downloaded and verified per second)."),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value or 0))
            yield g
        c = CounterMetricFamily("ckptfs_drills", "Drills run by this node, by outcome.", labels=["outcome"])
        for outcome in ("ok", "failed"):
            c.add_metric([outcome], float(lc.drills_total[outcome]))
        yield c
        g = GaugeMetricFamily("ckptfs_checkpoint_catalogue_timestamp_seconds", "When the catalogue behind these metrics was last read from the bucket (Unix time); 0 if not yet.")
        g.add_metric([], float(s.get("at", 0)))
        yield g
        for name, value, doc in (
            ("ckptfs_checkpoint_commits", lc.tracker.commits_total, "Manifests written by this node (commits and new generations)."),
            ("ckptfs_checkpoint_commit_errors", lc.tracker.commit_errors_total, "Automatic commits that failed and will be retried."),
            ("ckptfs_protection_refusals", lc.guard.refused_total, "Changes refused with EPERM because the checkpoint is protected."),
            ("ckptfs_retention_expired", lc.retention_stats["expired"], "Checkpoints retention on this node marked expiring."),
            ("ckptfs_retention_deleted", lc.retention_stats["deleted"], "Checkpoints retention on this node deleted (grace period over)."),
            ("ckptfs_retention_deleted_bytes", lc.retention_stats["deleted_bytes"], "Bytes of the checkpoints retention on this node deleted."),
            ("ckptfs_retention_errors", lc.retention_stats["errors"], "Scheduled retention runs that failed on this node (each is retried)."),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c
