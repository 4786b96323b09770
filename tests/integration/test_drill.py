"""Recovery drills (`ckptfs drill`, docs/lifecycle.md) on a real mount and a real S3 server: restored from the
bucket (not the node's warm cache), verified deep, the user's command run on it, the outcome in every node's metrics."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import Mount
from tests.integration.test_lifecycle import dcp_save
from tests.integration.test_metrics import scrape, value
from tests.support.seaweed import free_port

# Drills: store-side logic behind the control socket: the FUSE transport changes nothing here, so these tests run under the default one only
pytestmark = pytest.mark.one_transport

MiB = 1 << 20

# the user's load check: every file the job saved is there with its bytes
CHECK = """
import hashlib, json, os, sys
path, expected = sys.argv[1], json.load(open(sys.argv[2]))
got = {n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest() for n in os.listdir(path)}
assert os.environ["CKPTFS_DRILL_PATH"] == path
sys.exit(0 if got == expected else 3)
"""


def metrics_mount(make_mount, name: str) -> Mount:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(name, start=False, read_range_size="256KiB", read_concurrency=3)
    m.metrics_port = free_port()
    m.start()
    return m


def test_drill_restores_from_the_bucket_verifies_and_runs_the_command(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a = metrics_mount(make_mount, "a")
    b = metrics_mount(make_mount, "b")
    dcp_save(a.path / "run/step_1", ranks=2, size=1 * MiB)
    files = dcp_save(a.path / "run/step_2", ranks=3, size=2 * MiB + 5)
    for step in ("run/step_1", "run/step_2"):
        assert a.cli("checkpoint", "commit", str(a.path / step)).returncode == 0
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps({n: hashlib.sha256(body).hexdigest() for n, body in files.items()}))
    check = tmp_path / "check.py"
    check.write_text(CHECK)
    import sys

    # on node B, which never read these files: the drill goes around its cache, not through it
    proc = b.cli("drill", str(b.path / "run"), "--exec", f"{sys.executable} {check} {{path}} {expected}", "--json")
    assert proc.returncode == 0, proc.stderr
    text = scrape(b.metrics_port)  # type: ignore[arg-type]
    assert value(text, "ckptfs_fetched_bytes_total") == 0 and value(text, "ckptfs_cache_used_bytes") == 0
    result = json.loads(proc.stdout)
    assert (result["path"], result["step"], result["outcome"], result["verify"]) == ("run/step_2", 2, "ok", "whole")
    assert (result["files"], result["bytes"]) == (len(files), sum(map(len, files.values())))
    assert result["exec"]["exit_code"] == 0 and result["restore_seconds"] > 0 and result["bytes_per_second"] > 0
    assert not os.path.exists(result["dir"]), "the restored copy is removed afterwards"

    # a failing load command fails the drill
    proc = a.cli("drill", str(a.path / "run/step_1"), "--exec", "exit 7", "--keep")
    assert proc.returncode == 1 and "command exited 7" in proc.stdout and "drill FAILED" in proc.stdout

    kept = next((a.cache_dir / "drills").iterdir())  # --keep: the restored copy stays, whole
    assert (kept / "__0_0.distcp").stat().st_size == 1 * MiB

    # bytes replaced in the bucket behind ckptfs's back (the same size): the drill restores them, finds
    # them changed against the manifest, fails, and does not run the user's command on them
    shard = a.key("run/step_2/__1_0.distcp")
    client = a.s3.client()
    client.put_object(Bucket=a.bucket, Key=shard, Body=os.urandom(len(files["__1_0.distcp"])))
    proc = a.cli("drill", str(a.path / "run"), "--exec", "touch should-not-run", "--json")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["outcome"], result["verify"], result["changed"], result["exec"]) == ("failed", "broken", ["__1_0.distcp"], None)
    assert not (Path.cwd() / "should-not-run").exists()

    # the outcome is in the metrics, on both nodes (the record is in the bucket)
    assert b.cli("checkpoints", str(b.path)).returncode == 0  # a walk of the whole mount refreshes the catalogue
    for m in (a, b):
        text = scrape(m.metrics_port)  # type: ignore[arg-type]
        assert value(text, "ckptfs_drill_last_ok") == 0
        assert value(text, "ckptfs_drill_last_success_timestamp_seconds") > 0
        assert value(text, "ckptfs_drill_last_timestamp_seconds") > value(text, "ckptfs_drill_last_success_timestamp_seconds")
        assert value(text, "ckptfs_drill_last_duration_seconds") > 0
    text = scrape(a.metrics_port)  # type: ignore[arg-type]
    assert (value(text, "ckptfs_drills_total", outcome="ok"), value(text, "ckptfs_drills_total", outcome="failed")) == (0, 2)
    assert value(text, "ckptfs_drill_last_restore_bytes_per_second") > 0


def test_drill_errors_are_one_line(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()
    (m.path / "empty").mkdir()
    (m.path / "step_3").mkdir()
    (m.path / "step_3/x").write_bytes(b"x")
    for args, message in [
        (("drill", str(m.path / "empty")), "no committed checkpoint under empty"),
        (("drill", str(m.path / "step_3")), "step_3 is not committed"),
        (("drill", str(m.path / "missing")), "no such file or directory"),
    ]:
        proc = m.cli(*args)
        assert proc.returncode != 0
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not any((m.cache_dir / "drills").glob("*")), "nothing restored is left behind"
