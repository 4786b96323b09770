"""A checkpoint whose files became durable just before the daemon stopped is committed after the restart
(issue 35): the work left to commit is derived from the journal and the bucket, not from a file saved at
the right moment. And a checkpoint the bucket no longer holds is not listed as being written."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import ckptfs
from tests.conftest import Mount, mount_is_dead, wait_for, write_random

QUIET = 4  # checkpoint_quiet_seconds: small, so the test waits past it
FILES = {"model.safetensors": 3 << 20, "optimizer.pt": 1 << 20, "trainer_state.json": 300}


def save(step_dir: Path) -> dict[str, str]:
    """Three files, as a trainer writes a step: name -> sha256."""
    step_dir.mkdir(parents=True)
    return {name: write_random(step_dir / name, size, seed=i) for i, (name, size) in enumerate(FILES.items())}


def entries(m: Mount, path: str) -> dict[str, dict[str, Any]]:
    proc = m.cli("checkpoints", str(m.path / path), "--json")
    assert proc.returncode == 0, proc.stderr
    return {e["path"]: e for e in json.loads(proc.stdout)}


def strict_json(body: bytes) -> Any:
    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(body, parse_constant=refuse)


def assert_committed_after_restart(m: Mount, sums: dict[str, str]) -> None:
    committed = wait_for("run3/step_7 committed after the restart",
                         lambda: (e := entries(m, "run3").get("run3/step_7")) and e["state"] == "committed" and e, timeout=300)
    assert (committed["files"], committed["bytes"]) == (3, sum(FILES.values()))
    latest = ckptfs.latest(m.path / "run3")
    assert latest is not None and (latest.path, latest.step, latest.state) == (m.path / "run3/step_7", 7, "committed")
    body = m.s3.client().get_object(Bucket=m.bucket, Key=m.key("run3/step_7/.ckptfs-manifest.json"))["Body"].read()
    doc = strict_json(body)
    assert sorted(f["path"] for f in doc["files"]) == sorted(FILES)
    for name, digest in sums.items():
        assert m.object_sha256(f"run3/step_7/{name}") == digest


def test_checkpoint_written_right_before_an_unmount_is_committed_after_the_mount(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount("r", checkpoint_quiet_seconds=QUIET)
    sums = save(m.path / "run3/step_7")
    m.stop()  # right away: no flush, nothing waited for
    m.start()  # the same cache directory
    assert_committed_after_restart(m, sums)


def test_checkpoint_durable_when_the_daemon_is_killed_is_committed_after_the_mount(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount("k", checkpoint_quiet_seconds=QUIET)
    sums = save(m.path / "run3/step_7")
    m.flush("run3/step_7")  # durable in the bucket, not committed yet (quiet for less than QUIET)
    os.kill(m.status()["pid"], signal.SIGKILL)
    wait_for("the daemon gone", lambda: mount_is_dead(m.path), timeout=60)
    m.stop()
    m.start()
    assert_committed_after_restart(m, sums)


def test_checkpoint_gone_from_the_bucket_is_not_listed_as_writing(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount("g", checkpoint_quiet_seconds=3600)  # never committed by quiet during the test
    save(m.path / "runK/step_1")
    m.flush("runK/step_1")
    assert entries(m, "")["runK/step_1"]["state"] == "writing"  # in the bucket, waiting for quiet
    client = m.s3.client()

    def empty_bucket() -> None:
        for key in m.keys():
            client.delete_object(Bucket=m.bucket, Key=key)
        for folder in ("runK/step_1/", "runK/"):  # SeaweedFS keeps a folder after its last object: as a store without folders
            client.delete_object(Bucket=m.bucket, Key=m.key(folder))
        listed = client.list_objects_v2(Bucket=m.bucket, Prefix=m.key("runK/"), Delimiter="/")
        assert not listed.get("Contents") and not listed.get("CommonPrefixes"), listed

    empty_bucket()  # under the running mount: nothing written, open or uploading here, nothing in the bucket
    assert "runK/step_1" not in entries(m, "")
    m.stop()
    empty_bucket()
    m.start()  # the kept cache directory still knows the files it wrote
    assert "runK/step_1" not in entries(m, "")
    proc = m.cli("checkpoints", str(m.path))
    assert proc.returncode == 0, proc.stderr
    assert "runK" not in proc.stdout
