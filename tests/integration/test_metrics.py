"""The /metrics of a live mount: every metric documented, Prometheus conventions (promtool), and the numbers a user reads."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Mount, sha256_file, wait_for, write_random
from tests.support.promql import documented_metrics
from tests.support.seaweed import free_port
from tests.unit.test_httpserver import closed_by_server

MiB = 1 << 20


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def test_every_metric_documented_and_lint_clean(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(start=False, upload_delay=3600)
    m.metrics_port = free_port()
    m.start()
    digest = write_random(m.path / "dirty.bin", 5 * MiB, seed=90)
    text = scrape(m.metrics_port)
    # the file waits for its upload delay: its bytes are dirty in the cache
    assert value(text, "ckptfs_cache_bytes", state="dirty") == 5 * MiB
    assert value(text, "ckptfs_dirty_bytes") == 5 * MiB
    if m.status()["passthrough"]:  # the kernel wrote the cache file itself: no WRITE reached us
        assert value(text, "ckptfs_fuse_requests_total", op="write") == 0
    else:
        assert value(text, "ckptfs_fuse_requests_total", op="write") >= 5
    with pytest.raises(FileNotFoundError):
        (m.path / "missing").stat()
    m.flush()
    assert m.object_sha256("dirty.bin") == digest
    # a read of the local copy is a hit; after eviction the read comes from the bucket: a miss
    assert sha256_file(m.path / "dirty.bin") == digest
    evict = m.cli("evict", str(m.path / "dirty.bin"))
    assert evict.returncode == 0, evict.stderr
    assert sha256_file(m.path / "dirty.bin") == digest
    text = scrape(m.metrics_port)
    assert value(text, "ckptfs_uploaded_bytes_total") == 5 * MiB
    assert value(text, "ckptfs_cache_bytes", state="dirty") == 0
    assert value(text, "ckptfs_cache_bytes", state="uploading") == 0
    assert value(text, "ckptfs_cache_bytes", state="clean") == value(text, "ckptfs_cache_used_bytes") == 5 * MiB
    assert value(text, "ckptfs_cache_hits_total") >= 1
    assert value(text, "ckptfs_cache_misses_total") == 1
    assert value(text, "ckptfs_fetched_bytes_total") == 5 * MiB
    assert value(text, "ckptfs_evicted_bytes_total") == 5 * MiB
    assert value(text, "ckptfs_fuse_errors_total", op="lookup", errno="ENOENT") >= 1
    assert value(text, "ckptfs_mount_info", source=f"s3://{m.bucket}/{m.prefix}", mountpoint=str(m.path),
                 version=value_label(text, "ckptfs_mount_info", "version")) == 1

    # docs/metrics.md lists exactly what is served, with the right types and labels
    # (the replication metrics are served only with [replica.NAME] targets: test_replication checks them;
    # the peer metrics, membership's among them, only with durability = peer)
    documented = {k: v for k, v in documented_metrics().items()
                  if not k.startswith(("ckptfs_replication_", "ckptfs_peer_", "ckptfs_membership_"))}
    served = {f.name if f.type != "counter" else f.name + "_total": f for f in text_string_to_metric_families(text)}
    assert sorted(served) == sorted(documented), "docs/metrics.md and /metrics differ"
    for name, family in served.items():
        kind, labels = documented[name]
        assert family.type == kind, name
        served_labels = {k for s in family.samples for k in s.labels if k != "le"}
        assert served_labels == {label.strip(" `") for label in labels.split(",") if label.strip() and label.strip(" `") != "le"}, name

    # Prometheus' own linter
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus); the rest was checked")
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0 and lint.stdout.strip() == "" and lint.stderr.strip() == "", lint.stdout + lint.stderr


def test_single_copy_window_with_durability_local(make_mount) -> None:  # type: ignore[no-untyped-def]
    """With durability = local every acknowledged byte not yet in the bucket exists on this node only: the window
    opens when a save returns and closes when the drain has the bytes. No peer is listed or measured, and a wait for
    level replicated is refused in one line, by the CLI and the API alike."""
    import ckptfs

    m: Mount = make_mount(start=False, upload_delay=3600)
    m.metrics_port = free_port()
    m.start()
    text = scrape(m.metrics_port)
    assert value(text, "ckptfs_single_copy_bytes") == 0
    assert value(text, "ckptfs_single_copy_oldest_age_seconds") == 0
    (m.path / "step_1").mkdir()
    digest = write_random(m.path / "step_1" / "model.pt", 3 * MiB, seed=91)  # written, fsynced, closed: acknowledged
    text = scrape(m.metrics_port)
    assert value(text, "ckptfs_single_copy_bytes") == 3 * MiB
    assert not [f.name for f in text_string_to_metric_families(text) if f.name.startswith("ckptfs_peer_")]
    wait_for("the single-copy window to age", lambda: value(scrape(m.metrics_port), "ckptfs_single_copy_oldest_age_seconds") > 0, timeout=60)
    st = m.status()
    assert st["durability"] == "local" and st["peers"] == [] and st["peer_state"] is None
    assert st["single_copy_bytes"] == 3 * MiB and st["single_copy_oldest_age_seconds"] > 0

    refused = m.cli("flush", "--level", "replicated", str(m.path / "step_1"), "--timeout", "60", timeout=90)
    assert refused.returncode == 1 and refused.stdout == "", refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1 and "level replicated needs durability = peer" in refused.stderr, refused.stderr
    with pytest.raises(ckptfs.CkptfsError, match="level replicated needs durability = peer, and this mount has durability = local"):
        ckptfs.wait_durable(m.path / "step_1", timeout=60, level="replicated")

    m.flush()  # level durable: the drain uploads it
    assert m.object_sha256("step_1/model.pt") == digest
    text = scrape(m.metrics_port)
    assert value(text, "ckptfs_single_copy_bytes") == 0
    assert value(text, "ckptfs_single_copy_oldest_age_seconds") == 0


def value_label(text: str, name: str, label: str) -> str:
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == name:
                return s.labels[label]
    raise AssertionError(f"{name} not served")



@pytest.mark.one_transport
@pytest.mark.parametrize("page", ["page_off", "page_on"])
def test_one_server_caps_connections_and_disconnects_a_trickling_client(make_mount, page: str) -> None:  # type: ignore[no-untyped-def]
    # a read timeout far beyond the test: only the cap can close the idle connections below
    m: Mount = make_mount(start=False, metrics_read_timeout=600, **({"ui_enabled": "true"} if page == "page_on" else {}))
    m.metrics_port = free_port()
    m.start()
    pid = m.status()["pid"]
    # the same text format with the page on and off
    with urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=60) as r:
        assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = r.read().decode()
    assert value(text, "ckptfs_dirty_files") == 0 and "ckptfs_mount_info" in text
    if page == "page_on":
        assert urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/ui/", timeout=60).status == 200

    # more idle connections than the cap (64): the daemon closes the oldest, its descriptors stay bounded
    before = len(os.listdir(f"/proc/{pid}/fd"))
    flood = [socket.create_connection(("127.0.0.1", m.metrics_port)) for _ in range(300)]
    try:
        assert "ckptfs_dirty_files" in scrape(m.metrics_port)  # accepted after every connection of the flood
        assert len(os.listdir(f"/proc/{pid}/fd")) <= before + 64 + 16  # 16: the store's connections, ...
        digest = write_random(m.path / "during.bin", 1 * MiB, seed=96)
        assert sha256_file(m.path / "during.bin") == digest
        wait_for("the daemon to close the oldest idle connections", lambda: sum(map(closed_by_server, flood)) >= 300 - 64, timeout=120)
    finally:
        for s in flood:
            s.close()
    m.flush()
    assert m.object_sha256("during.bin") == digest

    # a client trickling its request one byte a second is disconnected after metrics_read_timeout
    m.stop()
    m.options["metrics_read_timeout"] = 2
    m.start()
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: " + b"t" * 300 + b"\r\n\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", m.metrics_port)) as s:
        for byte in request:
            try:
                s.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            if closed_by_server(s):
                break
            time.sleep(1)
    assert sent < 120, f"still connected after trickling {sent} bytes, one a second"
