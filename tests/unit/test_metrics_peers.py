"""The peer-durability metrics as a scrape serves them, from a daemon status with a fake `Peers.status()` in it:
the single-copy window always, the `ckptfs_peer_*` metrics only with durability = peer, each as docs/metrics.md lists
it (the live-mount test in tests/integration/test_metrics.py covers the rest of the table, without peers)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ckptfs.metrics import FuseCounters, Metrics
from tests.support.promql import documented_metrics

STATUS: dict[str, Any] = {
    "single_copy_bytes": 7 << 20, "single_copy_oldest_age_seconds": 42.5, "peer_replica_bytes": 123,
    "peer_takeovers_total": 1, "peer_degraded_writes_total": 2, "peer_replicated_bytes_total": 1 << 20,
    "peers": [{"node": "node-c", "addr": "10.0.0.7:7470", "state": "down", "lag_seconds": None},
              {"node": "node-b", "addr": "10.0.0.6:7470", "state": "live", "lag_seconds": 0.5}],
    "membership": {"backend": "bucket", "stale_seconds": 2.0, "requests": {"list": 30, "get": 61, "put": 31, "delete": 0}},
}


def scrape(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_peer_metrics_are_served_with_durability_peer_as_documented() -> None:
    metrics = Metrics(lambda: STATUS, FuseCounters(), peers=True)
    text = scrape(metrics)
    got = samples(text)
    assert got[("ckptfs_single_copy_bytes", ())] == 7 << 20
    assert got[("ckptfs_single_copy_oldest_age_seconds", ())] == 42.5
    assert got[("ckptfs_peer_up", (("peer", "node-b"),))] == 1 and got[("ckptfs_peer_up", (("peer", "node-c"),))] == 0
    assert got[("ckptfs_peer_replication_lag_seconds", (("peer", "node-b"),))] == 0.5
    assert ("ckptfs_peer_replication_lag_seconds", (("peer", "node-c"),)) not in got  # never connected: unknown, not 0
    assert got[("ckptfs_peer_replica_bytes", ())] == 123
    assert got[("ckptfs_peer_takeovers_total", ())] == 1
    assert got[("ckptfs_peer_degraded_writes_total", ())] == 2
    assert got[("ckptfs_peer_replicated_bytes_total", ())] == 1 << 20
    assert got[("ckptfs_membership_requests_total", (("backend", "bucket"), ("kind", "get")))] == 61

    served = {f.name if f.type != "counter" else f.name + "_total": f for f in text_string_to_metric_families(text)
              if f.name.startswith(("ckptfs_peer_", "ckptfs_single_copy_", "ckptfs_membership_"))}
    documented = {k: v for k, v in documented_metrics().items()
                  if k.startswith(("ckptfs_peer_", "ckptfs_single_copy_", "ckptfs_membership_"))}
    assert sorted(served) == sorted(documented), "docs/metrics.md (peer durability) and /metrics differ"
    for name, family in served.items():
        kind, labels = documented[name]
        assert family.type == kind, name
        assert {k for s in family.samples for k in s.labels} == {x.strip(" `") for x in labels.split(",") if x.strip()}, name
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus); the rest was checked")
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0 and lint.stdout.strip() == "" and lint.stderr.strip() == "", lint.stdout + lint.stderr


def test_with_durability_local_only_the_single_copy_window_is_served() -> None:
    metrics = Metrics(lambda: {**STATUS, "peers": []}, FuseCounters())
    names = {f.name for f in text_string_to_metric_families(scrape(metrics))}
    assert {"ckptfs_single_copy_bytes", "ckptfs_single_copy_oldest_age_seconds"} <= names
    assert not {n for n in names if n.startswith("ckptfs_peer_")}
