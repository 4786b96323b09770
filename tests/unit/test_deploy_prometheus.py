"""deploy/prometheus: the alert rules load (promtool check rules), their unit tests pass (promtool test rules),
every alert is tested firing and not firing, and every expression uses only metrics ckptfs exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.promql import ROOT, documented_metrics, metric_names, series_names

RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "alerts_test.yml"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian package prometheus)")


def alerts() -> dict[str, str]:
    """alert name -> expr, from alerts.yml (kept to one-line expressions, so a line scan is exact)."""
    out: dict[str, str] = {}
    name = None
    for line in RULES.read_text().splitlines():
        if m := re.match(r"\s*- alert: (\w+)\s*$", line):
            name = m.group(1)
        elif (m := re.match(r"\s*expr: (.+)$", line)) and name:
            out[name] = m.group(1)
    return out


@needs_promtool
def test_promtool_check_rules() -> None:
    proc = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


@needs_promtool
def test_promtool_test_rules() -> None:
    proc = subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_tested_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    current = None
    for line in RULE_TESTS.read_text().splitlines():
        if m := re.match(r"\s*alertname: (\w+)", line):
            current = m.group(1)
        elif (m := re.match(r"\s*exp_alerts:\s*(\[\])?", line)) and current:
            (silent if m.group(1) else firing).add(current)
    names = set(alerts())
    assert names == {"CkptfsDown", "CkptfsDrainLagAboveSLO", "CkptfsUploadErrors", "CkptfsStoreRejectsCredentials",
                     "CkptfsCacheNearlyFull", "CkptfsWritersStalled", "CkptfsWritesRefused", "CkptfsServiceRestarts", "CkptfsNoCommittedCheckpoint",
                     "CkptfsDrillFailedOrTooOld",
                     "CkptfsReplicationLagHigh", "CkptfsReplicaUnreachable",
                     "CkptfsSingleCopyAgeHigh", "CkptfsPeerDown", "CkptfsPeerTakeoverOverdue", "CkptfsPeerDegradedWrites", "CkptfsPeerReplicasRefused"}
    assert names - firing == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested staying silent"


def test_alert_expressions_use_exported_metrics() -> None:
    exported = series_names(documented_metrics())
    for name, expr in alerts().items():
        used = metric_names(expr)
        assert used, name
        assert used <= exported, f"{name} uses {used - exported}, which ckptfs does not export"


def test_metric_name_extraction() -> None:
    expr = 'sum by (job, instance) (rate(ckptfs_uploaded_bytes_total{instance=~"$instance"}[$__rate_interval])) / on(instance) group_left ckptfs_mount_info offset 5m > 1e9'
    assert metric_names(expr) == {"ckptfs_uploaded_bytes_total", "ckptfs_mount_info"}
    assert metric_names('histogram_quantile(0.9, sum by (le) (rate(ckptfs_time_to_durable_seconds_bucket[5m])))') == {"ckptfs_time_to_durable_seconds_bucket"}
