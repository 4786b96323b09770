"""Moving old checkpoints to a cold target by the daemon itself (tier_move_target; docs/lifecycle.md,
"Moving to a cold target"), on two real SeaweedFS servers: the primary (which answers lifecycle
transitions with 501) and a second one standing for the cold store. Ages are made short through the
config; nothing is timed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from typing import Any

import pytest

from tests.conftest import Mount, mount_is_dead, wait_for
from tests.integration.test_replication import body, commit, objects, shard, start, write_config
from tests.support.faultproxy import FaultProxy

# Moving checkpoints to a cold target: store-side logic behind the control socket: the FUSE transport
# changes nothing here, so these tests run under the default one only
pytestmark = pytest.mark.one_transport

MiB = 1 << 20
MANIFEST = ".ckptfs-manifest.json"
MOVED = ".ckptfs-moved.json"


def move_options(**extra: Any) -> dict[str, Any]:
    # the age is set per test; passes every second; a lease a restarted node takes over soon; files copied as they are
    # (these tests read them back byte for byte on the target; test_coldcompress.py moves them compressed)
    return {"metadata_ttl": 0, "tier_move_target": "cold", "tier_move_interval": 1, "replication_lease_ttl": 10,
            "replication_read_timeout": 5, "checkpoint_quiet_seconds": 3600, "cold_compression": "none", **extra}


def entries(m: Mount) -> dict[str, dict[str, Any]]:
    proc = m.cli("checkpoints", str(m.path), "--json")
    assert proc.returncode == 0, proc.stderr
    return {e["path"]: e for e in json.loads(proc.stdout)}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hot_keys(m: Mount, rel: str) -> list[str]:
    return sorted(k for k in m.keys() if k.startswith(m.key(rel + "/")))


def test_old_checkpoint_moves_verified_protected_and_young_stay_and_restore_brings_it_back(make_mount, second_s3, second_bucket, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path / "cold.toml", {"cold": {"source": f"s3://{second_bucket}/c", "endpoint_url": second_s3.endpoint_url}})
    a = make_mount("a", start=False, **move_options(tier_move_after=3600, tier_transitions="30:STANDARD_IA"))
    start(a, config)
    want: dict[str, dict[str, bytes]] = {}
    for step in (1, 2, 3):
        d = a.path / "run" / f"step_{step}"
        d.mkdir(parents=True)
        want[f"run/step_{step}"] = {"model.bin": shard(d / "model.bin", 3 * MiB + step, step),
                                    "optim/rank0.bin": (d / "optim").mkdir() or shard(d / "optim" / "rank0.bin", 20 * MiB + 7, 10 + step)}
        commit(a, f"run/step_{step}")
    proc = a.cli("protect", str(a.path / "run/step_2"), "--reason", "golden")
    assert proc.returncode == 0, proc.stderr
    # a checkpoint uploaded by another tool: no digests in its manifest, so a copy could not be verified: it stays
    a.s3.client().put_object(Bucket=a.bucket, Key=a.key("run/step_4/model.bin"), Body=b"u" * 1000)
    commit(a, "run/step_4")

    # the store cannot do transitions: one line naming what, and that the daemon moves instead
    proc = a.cli("lifecycle", "apply", str(a.path))
    err = proc.stderr.strip()
    assert proc.returncode == 1 and "\n" not in err, err
    assert "does not support lifecycle" in err and "transitions" in err and "501" in err and "cold target cold" in err, err

    # young (committed less than tier_move_after ago): a pass runs and moves nothing
    wait_for("a mover pass", lambda: a.status()["tier_move"]["last_run"] > 0, timeout=120)
    first = a.status()["tier_move"]["last_run"]
    wait_for("another mover pass", lambda: a.status()["tier_move"]["last_run"] > first, timeout=120)
    assert all(e["storage_class"] == "STANDARD" and not e["moved"] for e in entries(a).values())
    assert not objects(second_s3, second_bucket)
    a.stop()

    # now they are old: step_1 and step_3 move; step_2 is protected and stays
    a.options["tier_move_after"] = 1
    start(a, config)
    wait_for("step_1 and step_3 moved", lambda: {p for p, e in entries(a).items() if e["storage_class"] == "moved:cold"} == {"run/step_1", "run/step_3"},
             timeout=300)
    listed = entries(a)
    for p in ("run/step_1", "run/step_3"):
        e = listed[p]
        assert e["state"] == "committed" and e["location"] == "cold" and e["moved"]["state"] == "moved" and e["hot_files"] == 0
        assert e["files"] == 2 and e["bytes"] == sum(len(v) for v in want[p].values())
        # on the cold target, byte for byte; on the primary, only the manifest and the record
        for name, data in want[p].items():
            assert sha(body(second_s3, second_bucket, f"c/{p}/{name}")) == sha(data), name
        assert f"c/{p}/{MANIFEST}" in objects(second_s3, second_bucket)
        assert {a.key(f"{p}/{MANIFEST}"), a.key(f"{p}/{MOVED}")} <= set(hot_keys(a, p))
        assert not [k for k in hot_keys(a, p) if not k.rsplit("/", 1)[-1].startswith(".ckptfs") and not k.endswith("/")], hot_keys(a, p)
    assert listed["run/step_2"]["storage_class"] == "STANDARD" and not listed["run/step_2"]["moved"]
    assert listed["run/step_4"]["storage_class"] == "STANDARD" and not listed["run/step_4"]["moved"]
    assert not objects(second_s3, second_bucket, "c/run/step_2/")
    # what a user sees in the mount: the directory is there, its files are not
    assert sorted(os.listdir(a.path / "run" / "step_1")) == []
    assert sorted(os.listdir(a.path / "run" / "step_2")) == ["model.bin", "optim"]
    # the checkpoints table, usage, verify, status
    table = a.cli("checkpoints", str(a.path)).stdout
    assert f"run/step_1: moved to cold target cold (s3://{second_bucket}/c) since" in table and f"`ckptfs restore {a.path / 'run/step_1'}`" in table, table  # pasteable from here
    u = json.loads(a.cli("usage", str(a.path), "--json").stdout)
    moved_bytes = sum(len(v) for p in ("run/step_1", "run/step_3") for v in want[p].values())
    assert u["by_class"]["moved:cold"]["bytes"] == moved_bytes and u["by_class"]["moved:cold"]["objects"] == 4
    proc = a.cli("verify", str(a.path / "run/step_1"))
    assert proc.returncode != 0 and "\n" not in proc.stderr.strip()
    assert "cold target cold" in proc.stderr and "--target cold" in proc.stderr and "ckptfs restore" in proc.stderr, proc.stderr
    proc = a.cli("verify", str(a.path / "run/step_1"), "--target", "cold", "--deep")
    assert proc.returncode == 0, proc.stderr
    st = a.status()["tier_move"]
    assert st["moved_total"] == 2 and st["moved_bytes_total"] == moved_bytes and st["errors_total"] == 0
    assert "cold tier" in a.cli("status", str(a.path)).stdout
    # a new commit of the moved directory is refused with the way out
    proc = a.cli("checkpoint", "commit", str(a.path / "run/step_1"))
    assert proc.returncode != 0 and "ckptfs restore" in proc.stderr, proc.stderr

    # restore: copied back, verified, hot again; the files read back right through the mount
    a.stop()
    a.options["tier_move_after"] = 3600  # so it stays hot after the restore while we read it
    start(a, config)
    proc = a.cli("restore", str(a.path / "run/step_1"))
    assert proc.returncode == 0, proc.stderr
    assert "brought back from cold target cold" in proc.stdout and "copying back from cold target cold" in proc.stderr, (proc.stdout, proc.stderr)
    e = entries(a)["run/step_1"]
    assert e["storage_class"] == "STANDARD" and e["moved"]["state"] == "restored" and e["hot_files"] == 2
    for name, data in want["run/step_1"].items():
        assert sha((a.path / "run" / "step_1" / name).read_bytes()) == sha(data), name
    assert not objects(second_s3, second_bucket, "c/run/step_1/")  # the cold copy is gone
    proc = a.cli("verify", str(a.path / "run/step_1"), "--deep")
    assert proc.returncode == 0, proc.stderr
    assert a.status()["tier_move"]["restored_total"] == 1
    audit = a.cli("audit", str(a.path), "--json")
    actions = [ev["action"] for ev in json.loads(audit.stdout)]
    assert actions.count("move") == 2 and "restore-from-cold" in actions


def test_killed_mid_move_loses_nothing_resumes_and_retention_deletes_on_the_cold_target(make_mount, second_s3, second_bucket, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proxy = FaultProxy(second_s3.s3_port)
    proxy.set_mode("pass", rate=3 * MiB)  # slow enough to catch the move half-way
    try:
        config = write_config(tmp_path / "cold.toml", {"cold": {"source": f"s3://{second_bucket}", "endpoint_url": proxy.url}})
        a = make_mount("a", start=False, **move_options(tier_move_after=3600, replication_part_size="5MiB",
                                                         replication_parts_in_flight=2, replication_read_timeout=60))
        start(a, config)
        step = a.path / "step_5"
        step.mkdir()
        want = {f"r{r}.bin": shard(step / f"r{r}.bin", 2 * MiB + r, r) for r in range(6)}
        want["big.bin"] = shard(step / "big.bin", 12 * MiB + 5, 99)
        commit(a, "step_5")
        a.stop()
        a.options["tier_move_after"] = 1
        start(a, config)
        files_on_cold = lambda: {k for k in objects(second_s3, second_bucket) if not k.rsplit("/", 1)[-1].startswith(".ckptfs")}  # noqa: E731
        wait_for("some files on the cold target", lambda: len(files_on_cold()) >= 2, timeout=240)
        os.kill(a.status()["pid"], signal.SIGKILL)
        wait_for("daemon gone", lambda: mount_is_dead(a.path), timeout=60)
        a.stop()
        # nothing lost: every file still on the primary, byte for byte; the record says moving
        client = a.s3.client()
        for name, data in want.items():
            assert sha(client.get_object(Bucket=a.bucket, Key=a.key(f"step_5/{name}"))["Body"].read()) == sha(data), name
        rec = json.loads(client.get_object(Bucket=a.bucket, Key=a.key(f"step_5/{MOVED}"))["Body"].read())
        assert rec["state"] == "moving" and rec["target"] == "cold"
        assert f"step_5/{MANIFEST}" not in objects(second_s3, second_bucket)  # the cold copy is visibly incomplete

        proxy.set_mode("pass", rate=0)
        start(a, config)  # same node back: takes the lease once its dead self's expires, and finishes the move
        wait_for("step_5 moved", lambda: entries(a)["step_5"]["storage_class"] == "moved:cold", timeout=300)
        for name, data in want.items():
            assert sha(body(second_s3, second_bucket, f"step_5/{name}")) == sha(data), name
        assert not [k for k in hot_keys(a, "step_5") if not k.rsplit("/", 1)[-1].startswith(".ckptfs") and not k.endswith("/")]
        assert not second_s3.client().list_multipart_uploads(Bucket=second_bucket).get("Uploads")

        # retention lets it go: marked expiring, then deleted, on the cold target too
        d = a.path / "step_6"
        d.mkdir()
        shard(d / "model.bin", MiB, 6)
        commit(a, "step_6")
        a.stop()
        a.options.update(retention_keep_last=1, retention_min_age=0, retention_grace=0, tier_move_after=3600)
        start(a, config)
        for _ in range(2):  # expire, then delete (grace 0)
            proc = a.cli("retention", "apply", str(a.path), "--json")
            assert proc.returncode == 0, proc.stderr
        assert "step_5" not in entries(a)
        assert not objects(second_s3, second_bucket, "step_5/")
        assert not [k for k in a.keys() if k.startswith(a.key("step_5/"))]
        deleted = [ev for ev in json.loads(a.cli("audit", str(a.path), "--json").stdout) if ev["action"] == "delete"]
        assert deleted and deleted[-1]["path"] == "step_5" and deleted[-1].get("cold_target") == "cold"
    finally:
        proxy.close()
