"""A real Prometheus server scrapes a live mount while a file drains, with the alert rules loaded.

The drain-lag series is queried back through Prometheus' HTTP API: it rose while the file
waited, and fell to 0 once the file was durable (whose bytes in the bucket are checked). Every
alert rule is loaded and evaluated without error, and every query of the Grafana dashboard
runs against the recorded data.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Mount, write_random, wait_for
from tests.support.promql import ROOT
from tests.support.seaweed import free_port
from tests.unit.test_deploy_grafana import load as load_dashboard
from tests.unit.test_deploy_grafana import queries as dashboard_queries
from tests.unit.test_deploy_prometheus import alerts

# A Prometheus server scraping the daemon: the FUSE transport changes nothing here, so these tests run under the default one only
pytestmark = pytest.mark.one_transport

MiB = 1 << 20


class Prometheus:
    """A Prometheus server on 127.0.0.1, with its config and storage in a temporary directory."""

    def __init__(self, workdir: Path, targets: list[str]) -> None:
        self.workdir = workdir
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
            "scrape_configs": [{"job_name": "ckptfs", "static_configs": [{"targets": targets}]}],
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=self.log, cwd=workdir, start_new_session=True,
        )
        wait_for("prometheus answers /-/ready", self._ready)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {(self.workdir / 'prometheus.log').read_text()}")
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        body = json.loads(urllib.request.urlopen(url, timeout=30).read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus_for(tmp_path: Path):  # type: ignore[no-untyped-def]
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (Debian package prometheus)")
    servers: list[Prometheus] = []

    def start(targets: list[str]) -> Prometheus:
        workdir = tmp_path / f"prometheus-{len(servers)}"
        workdir.mkdir()
        servers.append(Prometheus(workdir, targets))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_prometheus_records_the_drain_lag_of_a_draining_file(make_mount, prometheus_for) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(start=False, upload_delay=3600)  # the file waits until flushed
    m.metrics_port = free_port()
    m.start()
    instance = f"127.0.0.1:{m.metrics_port}"
    prom = prometheus_for([instance])
    wait_for("prometheus scrapes the mount", lambda: prom.query('up{job="ckptfs"} == 1'))

    (m.path / "step_1").mkdir()
    digest = write_random(m.path / "step_1" / "model.bin", 8 * MiB, seed=100)
    lagging = wait_for("a scrape sees the file waiting", lambda: prom.query('ckptfs_oldest_dirty_age_seconds{job="ckptfs"} > 0'))
    assert lagging[0]["metric"]["instance"] == instance
    assert prom.query('ckptfs_dirty_bytes{job="ckptfs"}')[0]["value"][1] == str(8 * MiB)

    m.flush()
    assert m.object_sha256("step_1/model.bin") == digest
    wait_for("a scrape sees the drain done", lambda: prom.query('ckptfs_oldest_dirty_age_seconds{job="ckptfs"} == 0'))

    # the lag series as Prometheus stored it: non-zero while the file waited, 0 now
    peak = prom.query('max_over_time(ckptfs_oldest_dirty_age_seconds{job="ckptfs"}[10m])')
    assert float(peak[0]["value"][1]) > 0
    uploaded = prom.query('ckptfs_uploaded_bytes_total{job="ckptfs"}')
    assert float(uploaded[0]["value"][1]) == 8 * MiB

    # every alert rule is loaded and evaluates without error against real data
    def rules_evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") and r["health"] != "unknown" for r in rules) else None

    rules = wait_for("prometheus evaluates the alert rules", rules_evaluated)
    assert sorted(r["name"] for r in rules) == sorted(alerts())
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    assert not any(r["state"] == "firing" for r in rules), "a healthy mount fires no alert"

    # every dashboard query runs; the key panels have data for this instance
    for title, expr in dashboard_queries(load_dashboard()):
        promql = expr.replace("$instance", instance.replace(".", "\\\\.")).replace("$__rate_interval", "1m")
        result = prom.query(promql)  # a syntax error fails in api()
        if title in ("Drain lag", "Dirty bytes and files", "Upload throughput", "Cache use by state", "Upload errors"):
            assert result, f"{title}: {promql} returned nothing"
