"""Retention on real mounts and a real S3 server (docs/lifecycle.md): plan, apply, restore, the grace period,
protected checkpoints kept, while a job keeps saving and two nodes are mounted; the schedule under a lease."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Mount, wait_for
from tests.integration.test_lifecycle import catalogue, cli_json, dcp_save

# Retention: store-side logic behind the control socket: the FUSE transport changes nothing here, so these tests run under the default one only
pytestmark = pytest.mark.one_transport

RETENTION = ".ckptfs-retention.json"

# a training job saving a checkpoint every half second until told to stop: two shards written in place and
# fsynced, then a `.metadata` via tmp + rename (PyTorch DCP's layout)
JOB = """
import os, sys, time
root, stop = sys.argv[1], sys.argv[2]
step = 0
while not os.path.exists(stop):
    step += 1
    d = os.path.join(root, f"step_{step}")
    os.makedirs(d)
    for r in range(2):
        with open(os.path.join(d, f"__{r}_0.distcp"), "wb") as f:
            f.write(bytes([step % 256]) * (50000 + r)); f.flush(); os.fsync(f.fileno())
    with open(os.path.join(d, ".metadata.tmp"), "wb") as f:
        f.write(b"meta %d" % step); f.flush(); os.fsync(f.fileno())
    os.rename(os.path.join(d, ".metadata.tmp"), os.path.join(d, ".metadata"))
    time.sleep(0.5)
print(step)
"""


def keys_under(m: Mount, ckpt: str) -> list[str]:
    return [k for k in m.keys() if k.startswith(m.key(ckpt + "/"))]


def plan(m: Mount, path: str = "") -> dict[str, dict[str, Any]]:
    return {d["path"]: d for d in cli_json(m, "retention", "plan", str(m.path / path))}


def apply(m: Mount, path: str = "") -> dict[str, dict[str, Any]]:
    return {d["path"]: d for d in cli_json(m, "retention", "apply", str(m.path / path))}


def committed_steps(m: Mount, path: str) -> list[int]:
    return sorted(e["step"] for e in catalogue(m, path).values() if e["committed"])


def test_retention_while_a_job_keeps_saving_on_two_nodes(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    policy = {"retention_keep_last": 2, "retention_keep_every_steps": 4, "retention_min_age": 0, "retention_grace": 15,
              "checkpoint_quiet_seconds": 1}
    a: Mount = make_mount("a", **policy)  # the job's node; lists with the default TTL (5 s)
    b: Mount = make_mount("b", metadata_ttl=0, **policy)  # the operator's node
    (a.path / "run").mkdir()
    stop = tmp_path / "stop"
    job = subprocess.Popen([sys.executable, "-c", JOB, str(a.path / "run"), str(stop)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_for("run/ on B", lambda: (b.path / "run").is_dir(), timeout=60)  # once A's first upload under it is in
        wait_for("steps 1-6 committed", lambda: set(range(1, 7)) <= set(committed_steps(b, "run")), timeout=180)
        assert b.cli("protect", str(b.path / "run/step_2"), "--reason", "golden").returncode == 0

        # plan: what it keeps and why, changing nothing
        before = keys_under(a, "run/step_1") + keys_under(a, "run/step_3")
        p = plan(b, "run")
        assert (p["run/step_1"]["action"], p["run/step_3"]["action"]) == ("delete", "delete")
        assert p["run/step_2"]["action"] == "keep" and p["run/step_2"]["reason"] == "protected: golden"
        assert p["run/step_4"]["action"] == "keep" and p["run/step_4"]["reason"] == "kept by every 4 steps"
        newest = max(d["step"] for d in p.values() if d["state"] in ("committed", "protected"))
        assert p[f"run/step_{newest}"]["action"] == "keep"
        for d in p.values():
            assert isinstance(d["reason"], str) and d["action"] in ("keep", "delete")
            if d["state"] == "writing":
                assert d["action"] == "keep" and d["reason"].startswith("not committed"), d
        assert keys_under(a, "run/step_1") + keys_under(a, "run/step_3") == before
        assert all(e["state"] != "expiring" for e in catalogue(b, "run").values())

        # apply: they become expiring, still listed and readable on both nodes
        done = apply(b, "run")
        assert (done["run/step_1"].get("done"), done["run/step_3"].get("done")) == ("expiring", "expiring")
        grace_ends = done["run/step_1"]["delete_after"]
        assert done["run/step_2"]["action"] == "keep" and done["run/step_4"]["action"] == "keep"
        # the newest committed one was verified first (shallow), by retention itself
        verified = [e for e in catalogue(b, "run").values() if e["last_verify"]]
        assert verified and all(e["last_verify"]["outcome"] == "whole" for e in verified)
        seen = catalogue(a, "run")
        assert (seen["run/step_1"]["state"], seen["run/step_3"]["state"]) == ("expiring", "expiring")
        assert (a.path / "run/step_1/__0_0.distcp").read_bytes() == bytes([1]) * 50000
        assert RETENTION not in os.listdir(a.path / "run/step_1")  # ckptfs's own mark is hidden
        again = apply(b, "run")
        if time.time() < grace_ends:  # a noisy machine may take the whole grace period to get here
            assert again["run/step_1"]["phase"] == "wait" and keys_under(a, "run/step_1")

        # restore takes one back; retention keeps it from then on
        proc = a.cli("retention", "restore", str(a.path / "run/step_3"), "--reason", "needed for a bisect")
        assert proc.returncode == 0 and "run/step_3 restored" in proc.stdout, proc.stderr
        assert catalogue(b, "run")["run/step_3"]["state"] == "committed"
        assert plan(b, "run")["run/step_3"]["reason"].startswith("restored by")
        proc = a.cli("retention", "restore", str(a.path / "run/step_3"))
        assert proc.returncode == 0 and "not expiring; nothing changed" in proc.stdout

        # after the grace period the next apply deletes step_1, leaving nothing in the bucket
        wait_for("grace over", lambda: time.time() > grace_ends + 0.5, timeout=60)
        done = apply(b, "run")
        assert done["run/step_1"].get("done") == "deleted", done["run/step_1"]
        assert keys_under(a, "run/step_1") == []
        listed = a.s3.client().list_objects_v2(Bucket=a.bucket, Prefix=a.key("run/"), Delimiter="/")
        assert a.key("run/step_1/") not in [p["Prefix"] for p in listed.get("CommonPrefixes", [])]
        # node A has it mounted: it disappears there after its listing TTL
        wait_for("step_1 gone on A", lambda: not (a.path / "run/step_1").exists(), timeout=60)
        for kept in ("run/step_2", "run/step_3", "run/step_4"):
            assert keys_under(a, kept), kept
    finally:
        stop.touch()
        out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err  # the job never saw an error while retention ran beside it
    last = int(out.strip())
    wait_for("the job's last step committed", lambda: last in committed_steps(b, "run"), timeout=120)
    p = plan(b, "run")
    assert p[f"run/step_{last}"]["action"] == "keep"
    events = [(e["action"], e["path"]) for e in cli_json(b, "audit", str(b.path / "run"))]
    assert ("expire", "run/step_1") in events and ("restore", "run/step_3") in events and ("delete", "run/step_1") in events
    assert events.index(("expire", "run/step_1")) < events.index(("delete", "run/step_1"))


def test_scheduled_retention_runs_on_one_node_under_the_lease(make_mount) -> None:  # type: ignore[no-untyped-def]
    policy = {"retention_keep_last": 1, "retention_min_age": 0, "retention_grace": 0, "retention_interval": 1,
              "metadata_ttl": 0}
    a: Mount = make_mount("a", **policy)
    b: Mount = make_mount("b", **policy)
    for step in (1, 2, 3, 4):
        dcp_save(a.path / f"step_{step}", ranks=2, size=1000)
        assert a.cli("checkpoint", "commit", str(a.path / f"step_{step}")).returncode == 0
        if step == 2:  # while it is the newest, so the schedule cannot have let it go yet
            assert a.cli("protect", str(a.path / "step_2"), "--reason", "milestone").returncode == 0
    wait_for("steps 1 and 3 deleted", lambda: not keys_under(a, "step_1") and not keys_under(a, "step_3"), timeout=120)
    assert keys_under(a, "step_2") and keys_under(a, "step_4")

    lease = json.loads(a.s3.client().get_object(Bucket=a.bucket, Key=a.key(".ckptfs/leases/retention.json"))["Body"].read())
    pids = {a.status()["pid"]: a, b.status()["pid"]: b}
    holder = pids[lease["holder"]["pid"]]
    other = b if holder is a else a
    assert lease["expires_at"] > lease["renewed_at"]
    # the other node's apply is refused while the holder keeps its lease, naming the holder
    proc = other.cli("retention", "apply", str(other.path))
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "holds the retention lease" in proc.stderr and f"pid {lease['holder']['pid']}" in proc.stderr
    # each checkpoint went through each phase once: never two nodes at once
    events = [(e["action"], e["path"]) for e in cli_json(a, "audit", str(a.path)) if e["action"] in ("expire", "delete")]
    assert sorted(events) == [("delete", "step_1"), ("delete", "step_3"), ("expire", "step_1"), ("expire", "step_3")]


def test_plan_and_apply_of_one_checkpoint_judge_it_within_its_series(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(retention_keep_last=1, retention_min_age=0, retention_grace=3600)
    for step in (1, 2):
        dcp_save(m.path / f"run/step_{step}", ranks=1, size=1000)
        assert m.cli("checkpoint", "commit", str(m.path / f"run/step_{step}")).returncode == 0
    # step_1 alone is not the newest of its series: narrowing PATH to it does not make it one
    p = plan(m, "run/step_1")
    assert list(p) == ["run/step_1"] and p["run/step_1"]["action"] == "delete"
    done = apply(m, "run/step_1")
    assert list(done) == ["run/step_1"] and done["run/step_1"]["done"] == "expiring"
    assert catalogue(m, "run")["run/step_2"]["state"] == "committed"
    proc = m.cli("checkpoints", str(m.path / "run"))
    assert proc.returncode == 0 and "expiring" in proc.stdout and "deleted" in proc.stdout  # the note (wrapped in 80 columns)
    for args, message in [(("retention", "plan", str(m.path / "nope")), "no such file or directory"),
                          (("retention", "restore", str(m.path / "run")), "run is not a checkpoint")]:
        proc = m.cli(*args)
        assert proc.returncode != 0 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_checkpoints_drained_between_two_tracker_ticks_are_still_committed(make_mount) -> None:  # type: ignore[no-untyped-def]
    # found by the job test above: a small checkpoint written and uploaded between two ticks of the tracker
    # (every quiet/4 s, at most 5 s) was never committed, so retention had to keep it forever. With a quiet
    # period of 20 s the ticks are 5 s apart and each of these saves is durable within a fraction of that:
    # before the fix nearly every one of them was missed
    m: Mount = make_mount(checkpoint_quiet_seconds=20)
    for step in (1, 2, 3):
        d = m.path / f"step_{step}"
        d.mkdir()
        (d / "model.pt").write_bytes(b"x" * step)
        m.flush()
    wait_for("all three committed", lambda: committed_steps(m, "") == [1, 2, 3], timeout=120)
