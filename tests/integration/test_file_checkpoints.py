"""Checkpoints saved as one file (docs/lifecycle.md, "Checkpoints saved as one file") on a real mount and
two real S3 servers: Lightning's `epoch=E-step=S.ckpt` saved three times is listed with its steps,
committed, verified, protected, replicated, retained, and its own objects leave with it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import xxhash

from tests.conftest import Mount, wait_for
from tests.integration.test_lifecycle import catalogue, cli_json, expect_eperm
from tests.integration.test_replication import caught_up, objects, replica_options, start, write_config

# store-side logic behind the control socket: the FUSE transport changes nothing here
pytestmark = pytest.mark.one_transport

CKPTS = "lightning_logs/version_0/checkpoints"


def name(step: int) -> str:
    return f"epoch=0-step={step}.ckpt"


def own(kind: str, step: int) -> str:
    """ckptfs's object `kind` (manifest, protected, ...) of the file checkpoint of `step`: a sibling named after it."""
    return f"{CKPTS}/.ckptfs-{kind}.{name(step)}.json"


def test_lightning_file_checkpoints_are_committed_verified_protected_replicated_and_retained(make_mount, second_s3, second_bucket, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path / "replicas.toml", {"dr": {"source": f"s3://{second_bucket}/copy", "endpoint_url": second_s3.endpoint_url}})
    a: Mount = make_mount("a", start=False, checkpoint_quiet_seconds=1, retention_keep_last=1, retention_min_age=0,
                          retention_grace=2, **replica_options())
    start(a, config)
    (a.path / CKPTS).mkdir(parents=True)
    saved = {}
    for step in (1, 2, 3):
        saved[step] = os.urandom(300_000 + step)
        with open(a.path / CKPTS / name(step), "wb") as f:
            f.write(saved[step])
            f.flush()
            os.fsync(f.fileno())

    # listed with their steps and committed once quiet, each with a manifest next to it
    paths = {step: f"{CKPTS}/{name(step)}" for step in saved}
    wait_for("three file checkpoints committed", lambda: all(
        catalogue(a, CKPTS).get(p, {}).get("state") == "committed" for p in paths.values()), timeout=120)
    seen = catalogue(a, CKPTS)
    assert [(seen[paths[s]]["step"], seen[paths[s]]["kind"], seen[paths[s]]["files"], seen[paths[s]]["bytes"]) for s in saved] == [
        (s, "file", 1, len(saved[s])) for s in saved]
    doc = json.loads(a.s3.client().get_object(Bucket=a.bucket, Key=a.key(own("manifest", 3)))["Body"].read())
    assert (doc["path"], doc["step"]) == (paths[3], 3)
    assert [(f["path"], f["key"], f["size"], f["xxh3"]) for f in doc["files"]] == [
        (name(3), a.key(paths[3]), len(saved[3]), xxhash.xxh3_128(saved[3]).hexdigest())]
    assert sorted(os.listdir(a.path / CKPTS)) == sorted(name(s) for s in saved)  # the manifests are hidden

    # verified, deep
    proc = a.cli("verify", str(a.path / paths[3]), "--deep")
    assert proc.returncode == 0 and f"{paths[3]} is whole" in proc.stdout, proc.stdout + proc.stderr

    # protected: the file can be neither changed nor removed through the mount
    assert a.cli("protect", str(a.path / paths[1]), "--reason", "golden").returncode == 0
    assert catalogue(a, CKPTS)[paths[1]]["state"] == "protected"
    expect_eperm(os.unlink, a.path / paths[1])
    expect_eperm(open, a.path / paths[1], "r+b")
    expect_eperm(os.rename, a.path / paths[1], a.path / CKPTS / "kept.ckpt")
    assert (a.path / paths[1]).read_bytes() == saved[1]
    b: Mount = make_mount("b", metadata_ttl=0)  # another node learns it from its listing of the directory
    assert sorted(os.listdir(b.path / CKPTS)) == sorted(name(s) for s in saved)
    expect_eperm(os.unlink, b.path / paths[1])
    expect_eperm(open, b.path / paths[1], "wb")
    b.stop()

    # replicated with its manifest and protection; verified on the target
    wait_for("three file checkpoints on dr", lambda: caught_up(a, "dr", 3), timeout=180)
    want = {f"copy/{paths[s]}" for s in saved} | {f"copy/{own('manifest', s)}" for s in saved} | {f"copy/{own('protected', 1)}"}
    wait_for("the protection on dr too", lambda: set(objects(second_s3, second_bucket, "copy/" + CKPTS + "/")) == want, timeout=120)
    proc = a.cli("verify", str(a.path / paths[2]), "--target", "dr", "--deep")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # retention keeps the protected and the newest; step 2 goes after the grace period, from the replica too
    plan = {d["path"]: d for d in cli_json(a, "retention", "apply", str(a.path))}
    assert [plan[paths[s]]["action"] for s in saved] == ["keep", "delete", "keep"]
    wait_for("grace over, step 2 deleted", lambda: (
        cli_json(a, "retention", "apply", str(a.path)) and not any(paths[2] in k or name(2) in k for k in a.keys())), timeout=60)
    wait_for("step 2 deleted on dr", lambda: not any(name(2) in k for k in objects(second_s3, second_bucket, "copy/")), timeout=180)
    assert sorted(catalogue(a, CKPTS)) == [paths[1], paths[3]]
    wait_for("the mount's next listing drops it", lambda: sorted(os.listdir(a.path / CKPTS)) == [name(1), name(3)], timeout=60)

    # a file checkpoint removed through the mount takes its own objects with it
    os.unlink(a.path / paths[3])
    wait_for("step 3's manifest gone with it", lambda: not any(name(3) in k for k in a.keys()), timeout=120)
    assert a.key(own("manifest", 1)) in a.keys() and a.key(own("protected", 1)) in a.keys()
