"""`make stop` deletes the local S3 server's data; `make stop KEEP=1` (dev_s3.py stop --keep-data) keeps it for the next start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.support.seaweed import DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY, make_client


def dev_s3(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "dev_s3.py"), *args], capture_output=True, text=True, timeout=180)


def client(state: Path):  # type: ignore[no-untyped-def]
    return make_client((state / "endpoint").read_text().strip(), DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY)


def test_stop_keep_data_then_start_serves_the_same_objects(tmp_path: Path) -> None:
    state = tmp_path / "s3"
    try:
        started = dev_s3("start", "--dir", str(state), "--bucket", "ckpt")
        assert started.returncode == 0, started.stderr
        # what `make run` shows: one line saying where it runs, not the endpoint on a bare line before it
        endpoint = (state / "endpoint").read_text().strip()
        assert started.stdout == "" and started.stderr.startswith(f"dev S3 started at {endpoint} ("), started
        assert len(started.stderr.splitlines()) == 1, started.stderr
        assert dev_s3("status", "--dir", str(state)).stdout == endpoint + "\n"  # for scripts
        client(state).put_object(Bucket="ckpt", Key="step_1/model.pt", Body=b"weights")

        kept = dev_s3("stop", "--dir", str(state), "--keep-data")
        assert kept.returncode == 0, kept.stderr
        assert "kept" in kept.stderr and (state / "data").is_dir()
        assert dev_s3("status", "--dir", str(state)).returncode == 1  # stopped

        assert dev_s3("start", "--dir", str(state), "--bucket", "ckpt").returncode == 0
        assert client(state).get_object(Bucket="ckpt", Key="step_1/model.pt")["Body"].read() == b"weights"

        gone = dev_s3("stop", "--dir", str(state))
        assert gone.returncode == 0, gone.stderr
        assert not state.exists()  # without --keep-data the data is deleted
    finally:
        dev_s3("stop", "--dir", str(state))
