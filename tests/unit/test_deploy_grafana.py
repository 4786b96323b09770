"""deploy/grafana/ckptfs.json: a Grafana dashboard model whose every query uses only metrics ckptfs exports.

Grafana itself is not packaged for Debian, so the model is checked here field by field; the
Prometheus integration test runs every panel's query against a real server scraping a mount.
"""

from __future__ import annotations

import json

from tests.support.promql import ROOT, documented_metrics, metric_names, series_names

DASHBOARD = ROOT / "deploy" / "grafana" / "ckptfs.json"
PANEL_TYPES = {"row", "stat", "timeseries", "gauge", "bargauge", "table", "text", "heatmap"}


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dash: dict) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel, rows' nested panels included."""
    out = []
    for panel in dash["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            for target in p.get("targets", []):
                out.append((p["title"], target["expr"]))
    return out


def test_dashboard_model() -> None:
    dash = load()
    assert dash["title"] == "ckptfs" and dash["uid"] == "ckptfs"
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["type"] == "query" and instance["multi"] and instance["includeAll"]
    assert metric_names(instance["query"]["query"].replace("label_values(", "").split(",")[0]) == {"ckptfs_mount_info"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dash["panels"]:
        assert p["type"] in PANEL_TYPES, p["title"]
        pos = p["gridPos"]
        assert all(isinstance(pos[k], int) for k in "hwxy") and pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"], p["title"]
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]


def test_every_query_uses_exported_metrics_of_the_chosen_instances() -> None:
    exported = series_names(documented_metrics())
    qs = queries(load())
    assert len(qs) >= 20
    for title, expr in qs:
        used = metric_names(expr)
        assert used, f"{title}: {expr}"
        assert used <= exported, f"{title} uses {used - exported}, which ckptfs does not export"
        assert expr.count("{") == expr.count('instance=~"$instance"'), f"{title}: every selector filters on $instance"


def test_dashboard_shows_what_operators_watch() -> None:
    used = set().union(*(metric_names(expr) for _, expr in queries(load())))
    for metric in ("ckptfs_oldest_dirty_age_seconds", "ckptfs_dirty_bytes", "ckptfs_uploaded_bytes_total", "ckptfs_cache_bytes",
                   "ckptfs_cache_capacity_bytes", "ckptfs_upload_errors_total", "ckptfs_fuse_errors_total",
                   "ckptfs_stalled_writers", "ckptfs_cache_hits_total", "ckptfs_fetched_bytes_total", "up",
                   "ckptfs_checkpoints", "ckptfs_checkpoint_newest_committed_age_seconds", "ckptfs_drill_last_ok",
                   "ckptfs_drill_last_success_timestamp_seconds", "ckptfs_retention_deleted_total"):
        assert metric in used, metric
