"""Replication of committed checkpoints to a second store (docs/replication.md), on two real SeaweedFS
servers standing for two regions: DCP saves from two nodes, server-side copies on one endpoint, a
crash mid-copy and its resume, a target stopped and back, a corrupted replica, protection, a
read-only mount of the replica, and the metrics against docs/metrics.md."""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import json
import os
import signal
import sys
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
import xxhash

from ckptfs.client import one_reply
from ckptfs.config import Config
from ckptfs.lifecycle.manifest import read_manifest
from ckptfs.lifecycle.copier import Job, PartBuffers, Slots, copy_checkpoint
from ckptfs.store import Store

from tests.conftest import Mount, delete_bucket, mount_is_dead, run_cli, wait_for, write_random
from tests.integration.test_lifecycle import dcp_save
from tests.support.faultproxy import FaultProxy
from tests.support.seaweed import SeaweedServer, free_port

# Replication: store-side logic behind the control socket: the FUSE transport changes nothing here, so these tests run under the default one only
pytestmark = pytest.mark.one_transport

MiB = 1 << 20
MANIFEST = ".ckptfs-manifest.json"
PROTECTED = ".ckptfs-protected.json"


# ------------------------------------------------------------------ helpers
def write_config(path: Path, targets: dict[str, dict[str, str]]) -> str:
    lines = []
    for name, table in targets.items():
        lines.append(f"[replica.{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def start(m: Mount, config: str) -> None:
    run_cli(*m.mount_args(), "--config", config, env=m.env, timeout=120, check=True)


def status(m: Mount) -> dict[str, dict[str, Any]]:
    proc = m.cli("replicate", "status", str(m.path), "--json", timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return {t["name"]: t for t in json.loads(proc.stdout)}


def caught_up(m: Mount, name: str, replicated: int) -> bool:
    t = status(m)[name]
    return t["replicated"] == replicated and t["pending"] == 0 and t["error"] is None and t["unsurveyed_commits"] == 0


def on_target(m: Mount, ck: str, name: str = "dr") -> str:
    """Where checkpoint `ck` stands on replica `name`: `replicate_status` with its path, as the catalogue page asks."""
    targets = one_reply(m.path, {"cmd": "replicate_status", "path": ck})["targets"]
    return next(t["checkpoint"] for t in targets if t["name"] == name)


def objects(server: SeaweedServer, bucket: str, prefix: str = "") -> dict[str, dict[str, Any]]:
    out = {}
    for page in server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o
    return out


def body(server: SeaweedServer, bucket: str, key: str) -> bytes:
    return server.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def replica_options(**extra: Any) -> dict[str, Any]:
    return {"replication_interval": 1, "replication_lease_ttl": 10, "replication_read_timeout": 3, **extra}


def commit(m: Mount, rel: str) -> None:
    proc = m.cli("checkpoint", "commit", str(m.path / rel))
    assert proc.returncode == 0, proc.stderr


def shard(path: Path, size: int, seed: int) -> bytes:
    data = xxhash.xxh3_128(str(seed).encode()).digest() * (size // 16) + b"x" * (size % 16)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return data


# ------------------------------------------------------------------ tests
def test_dcp_checkpoints_from_two_nodes_replicated_streamed_and_server_side(make_mount, second_s3, second_bucket, s3, tmp_path) -> None:  # type: ignore[no-untyped-def]
    local_bucket = s3.make_bucket(f"loc-{uuid.uuid4().hex[:12]}")
    try:
        config = write_config(tmp_path / "replicas.toml", {
            "dr": {"source": f"s3://{second_bucket}/copy", "endpoint_url": second_s3.endpoint_url},
            "near": {"source": f"s3://{local_bucket}", "endpoint_url": s3.endpoint_url, "select": "every:200"},
            "gone": {"source": f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}", "endpoint_url": second_s3.endpoint_url},
            "down": {"source": "s3://whatever", "endpoint_url": f"http://127.0.0.1:{free_port()}"},
        })
        a = make_mount("a", start=False, metadata_ttl=0, **replica_options())
        b = make_mount("b", start=False, metadata_ttl=0, **replica_options())
        start(a, config)
        start(b, config)
        # one DCP step written by two nodes: ranks 0-1 on a, 2-3 on b, `.metadata` last (a)
        step = a.path / "run" / "step_100"
        step.mkdir(parents=True)
        a.flush()  # the directory is in the bucket: b sees it
        want = {f"__{r}_0.distcp": shard((a.path if r < 2 else b.path) / "run/step_100" / f"__{r}_0.distcp", 3 * MiB + r, r)
                for r in range(4)}
        a.flush()
        b.flush()
        want[".metadata"] = json.dumps({"ranks": 4}).encode()
        (step / ".metadata").write_bytes(want[".metadata"])
        commit(a, "run/step_100")
        files200 = dcp_save(a.path / "run" / "step_200", ranks=2, size=20 * MiB + 3)  # multipart-sized shards
        commit(a, "run/step_200")

        wait_for("step_100 and step_200 on dr", lambda: caught_up(a, "dr", 2), timeout=180)
        wait_for("step_200 on near", lambda: caught_up(a, "near", 1), timeout=180)
        # only one node copied (the lease): the other surveys the same state, at its own next survey
        wait_for("b surveys both steps on dr", lambda: caught_up(b, "dr", 2), timeout=180)
        sa, sb = status(a), status(b)
        copied = sa["dr"]["copied_objects_total"] + sb["dr"]["copied_objects_total"]
        assert copied == len(want) + len(files200)
        assert 0 in (sa["dr"]["copied_objects_total"], sb["dr"]["copied_objects_total"])
        # the streamed copy's memory: part buffers of replication_part_size, at most replication_parts_in_flight
        assert 0 < max(sa["dr"]["buffer_bytes_peak"], sb["dr"]["buffer_bytes_peak"]) <= 8 * 16 * MiB
        # the copies: same bytes, the manifest's xxh3 in their metadata, the manifest last and pointing at them
        dr = objects(second_s3, second_bucket)
        for name, data in want.items():
            key = f"copy/run/step_100/{name}"
            assert body(second_s3, second_bucket, key) == data
            head = second_s3.client().head_object(Bucket=second_bucket, Key=key)
            assert head["Metadata"]["xxh3"] == xxhash.xxh3_128(data).hexdigest()
        doc = json.loads(body(second_s3, second_bucket, f"copy/run/step_100/{MANIFEST}"))
        primary = json.loads(body(s3, a.bucket, a.key(f"run/step_100/{MANIFEST}")))
        assert doc["replicated_from"]["etag"] == a.s3.client().head_object(Bucket=a.bucket, Key=a.key(f"run/step_100/{MANIFEST}"))["ETag"].strip('"')
        assert (doc["step"], doc["generation"], doc["node"]) == (primary["step"], primary["generation"], primary["node"])
        for f in doc["files"]:
            assert f["key"] == f"copy/run/step_100/{f['path']}" and f["etag"] == dr[f["key"]]["ETag"].strip('"')
        assert dr[f"copy/run/step_100/{MANIFEST}"]["LastModified"] >= max(dr[f"copy/run/step_100/{n}"]["LastModified"] for n in want)
        # every:200 on the same endpoint: step_200 only, copied inside the store
        assert sa["near"]["server_side_objects_total"] + sb["near"]["server_side_objects_total"] == len(files200)
        assert sa["dr"]["server_side_objects_total"] + sb["dr"]["server_side_objects_total"] == 0
        near = objects(s3, local_bucket)
        assert sorted(near) == sorted([f"run/step_200/{n}" for n in files200] + [f"run/step_200/{MANIFEST}"])
        assert body(s3, local_bucket, "run/step_200/__1_0.distcp") == files200["__1_0.distcp"]
        # the targets that refuse or are down: one clear line each, lag, and nothing else held up
        assert "bucket" in sa["gone"]["error"] and "does not exist" in sa["gone"]["error"] and sa["gone"]["pending"] == 2
        assert "cannot reach" in sa["down"]["error"] and sa["down"]["lag_seconds"] > 0 and not sa["down"]["reachable"]
        proc = a.cli("replicate", "status", str(a.path))
        assert proc.returncode == 1 and "gone" in proc.stdout and "does not exist" in proc.stdout
        assert "Traceback" not in proc.stderr

        # verify on the replica: whole; then an object corrupted on the replica is found
        proc = a.cli("verify", str(a.path / "run/step_100"), "--target", "dr", "--deep")
        assert proc.returncode == 0, proc.stderr
        assert "is whole (deep, on replica dr)" in proc.stdout
        bad = bytearray(want["__2_0.distcp"])
        bad[1000] ^= 0xFF
        second_s3.client().put_object(Bucket=second_bucket, Key="copy/run/step_100/__2_0.distcp", Body=bytes(bad))
        proc = a.cli("verify", str(a.path / "run/step_100"), "--target", "dr")
        assert proc.returncode == 1 and "changed: __2_0.distcp" in proc.stderr
        proc = a.cli("verify", str(a.path / "run/step_100"), "--target", "nowhere")
        assert proc.returncode != 0 and "no replica target 'nowhere'" in proc.stderr and "Traceback" not in proc.stderr

        # protection on the primary goes to every target, even one whose select does not take the step
        proc = a.cli("protect", str(a.path / "run/step_100"), "--reason", "golden: eval 0.91")
        assert proc.returncode == 0, proc.stderr
        wait_for("step_100 protected on near", lambda: caught_up(a, "near", 2), timeout=180)
        wait_for("step_100 protected on dr", lambda: caught_up(a, "dr", 2), timeout=180)
        assert f"run/step_100/{PROTECTED}" in objects(s3, local_bucket)
        assert json.loads(body(second_s3, second_bucket, f"copy/run/step_100/{PROTECTED}"))["reason"] == "golden: eval 0.91"
        # the primary's copy is kept (EPERM on delete), and the replica's copy is whole again
        with pytest.raises(OSError) as e:
            os.unlink(a.path / "run/step_100/__0_0.distcp")
        assert e.value.errno == errno.EPERM
        # the corrupted object is not what the manifest says: the next copy (manifest changed: protected) fixed it
        assert body(second_s3, second_bucket, "copy/run/step_100/__2_0.distcp") == want["__2_0.distcp"]
    finally:
        delete_bucket(s3.client(), local_bucket)


def test_mount_of_the_replica_is_read_only_and_serves_its_checkpoints(make_mount, second_s3, second_bucket, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path / "replicas.toml", {"dr": {"source": f"s3://{second_bucket}/copy", "endpoint_url": second_s3.endpoint_url}})
    a = make_mount("a", start=False, **replica_options())
    start(a, config)
    files = dcp_save(a.path / "step_7", ranks=2, size=2 * MiB)
    commit(a, "step_7")
    wait_for("step_7 on dr", lambda: caught_up(a, "dr", 1), timeout=180)
    # a mount of the replica's bucket, read-only
    r = Mount(second_s3, second_bucket, "copy", tmp_path / "replica-mnt", tmp_path / "replica-cache", {"read_only": "true"})
    r.path.mkdir()
    r.cache_dir.mkdir()
    r.start()
    try:
        assert sorted(os.listdir(r.path / "step_7")) == sorted(files)
        for name, data in files.items():
            assert (r.path / "step_7" / name).read_bytes() == data
        proc = r.cli("checkpoints", str(r.path), "--json")
        assert proc.returncode == 0, proc.stderr
        [entry] = json.loads(proc.stdout)
        assert (entry["path"], entry["state"], entry["files"]) == ("step_7", "committed", len(files))
        proc = r.cli("verify", str(r.path / "step_7"), "--deep")
        assert proc.returncode == 0, proc.stderr
        for change in (lambda: open(r.path / "step_7" / "new", "wb"), lambda: os.unlink(r.path / "step_7" / ".metadata"),
                       lambda: os.mkdir(r.path / "x"), lambda: os.rename(r.path / "step_7", r.path / "step_8"),
                       lambda: os.truncate(r.path / "step_7" / ".metadata", 0)):
            with pytest.raises(OSError) as e:
                change()
            assert e.value.errno == errno.EROFS
        proc = r.cli("protect", str(r.path / "step_7"), "--reason", "x")
        assert proc.returncode != 0 and "read-only" in proc.stderr
    finally:
        r.stop()


def test_crash_mid_copy_resumes_without_copying_finished_objects_again(make_mount, second_s3, second_bucket, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proxy = FaultProxy(second_s3.s3_port)
    proxy.set_mode("pass", rate=3 * MiB)  # slow enough to catch the copy half-way
    try:
        config = write_config(tmp_path / "replicas.toml", {"dr": {"source": f"s3://{second_bucket}", "endpoint_url": proxy.url}})
        # (a 5 MiB part through the throttled proxy takes seconds: a read timeout long enough for it)
        a = make_mount("a", start=False, **replica_options(replication_part_size="5MiB", replication_parts_in_flight=2,
                                                             replication_read_timeout=60))
        start(a, config)
        step = a.path / "step_5"
        step.mkdir()
        want = {f"__{r}_0.distcp": shard(step / f"__{r}_0.distcp", 2 * MiB + r, r) for r in range(8)}
        want["big.distcp"] = shard(step / "big.distcp", 12 * MiB + 5, 99)  # streamed as a multipart upload
        (step / ".metadata").write_bytes(b"{}")
        want[".metadata"] = b"{}"
        commit(a, "step_5")

        def finished() -> dict[str, Any]:
            objs = objects(second_s3, second_bucket)
            return {k: o for k, o in objs.items() if not k.endswith(MANIFEST)} if MANIFEST not in "".join(objs) else {}

        done_before = wait_for("some objects copied, not all", lambda: (lambda f: f if len(f) >= 3 else None)(finished()), timeout=180)
        pid = a.status()["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for("daemon gone", lambda: mount_is_dead(a.path), timeout=60)
        done_before = finished() or done_before  # what was there when it died
        assert f"step_5/{MANIFEST}" not in objects(second_s3, second_bucket)  # visibly incomplete
        assert len(done_before) < len(want)
        a.stop()
        proxy.set_mode("pass", rate=0)
        start(a, config)  # same cache dir: the node comes back; it takes its dead self's lease once expired
        wait_for("step_5 on dr", lambda: caught_up(a, "dr", 1), timeout=240)
        after = objects(second_s3, second_bucket)
        for key, o in done_before.items():
            assert after[key]["LastModified"] == o["LastModified"] and after[key]["ETag"] == o["ETag"], key
        t = status(a)["dr"]
        # an object whose last bytes were on their way when the daemon died may have landed after the look above
        assert t["skipped_objects_total"] >= len(done_before)
        assert t["copied_objects_total"] + t["skipped_objects_total"] == len(want)
        assert t["copied_objects_total"] >= 1
        for name, data in want.items():
            assert hashlib.sha256(body(second_s3, second_bucket, f"step_5/{name}")).digest() == hashlib.sha256(data).digest()
        assert not second_s3.client().list_multipart_uploads(Bucket=second_bucket).get("Uploads")
        proc = a.cli("verify", str(a.path / "step_5"), "--target", "dr", "--deep")
        assert proc.returncode == 0, proc.stderr
    finally:
        proxy.close()


def test_target_stopped_lag_grows_then_catches_up_and_the_mount_carries_on(make_mount, tmp_path) -> None:  # type: ignore[no-untyped-def]
    other = SeaweedServer(tmp_path / "region3")
    other.start()
    try:
        second_bucket = other.make_bucket(f"dr-{uuid.uuid4().hex[:12]}")
        config = write_config(tmp_path / "replicas.toml", {"dr": {"source": f"s3://{second_bucket}", "endpoint_url": other.endpoint_url}})
        a = make_mount("a", start=False, metrics_addr=f"127.0.0.1:{free_port()}", **replica_options())
        start(a, config)
        dcp_save(a.path / "step_1", ranks=2, size=MiB)
        commit(a, "step_1")
        wait_for("step_1 on dr", lambda: caught_up(a, "dr", 1), timeout=180)
        other.pause()
        try:
            files = dcp_save(a.path / "step_2", ranks=2, size=MiB)
            commit(a, "step_2")  # the primary's commit is not held up by the stopped target
            first = wait_for("dr unreachable", lambda: (lambda t: t if t["error"] and t["pending"] == 1 else None)(status(a)["dr"]), timeout=180)
            assert not first["reachable"] and first["bytes_behind"] == sum(map(len, files.values()))
            wait_for("lag grows", lambda: status(a)["dr"]["lag_seconds"] > first["lag_seconds"], timeout=60)
            # the mount, its drain and the lifecycle on the primary carry on meanwhile
            digest = write_random(a.path / "step_2" / "late.bin", MiB, seed=3)
            a.flush()
            assert a.object_sha256("step_2/late.bin") == digest
            proc = a.cli("checkpoints", str(a.path), "--json")
            assert proc.returncode == 0 and {e["path"] for e in json.loads(proc.stdout)} == {"step_1", "step_2"}
            from tests.integration.test_metrics import scrape, value

            text = scrape(int(a.options["metrics_addr"].rsplit(":", 1)[1]))
            assert value(text, "ckptfs_replication_lag_seconds", target="dr") > 0
            assert value(text, "ckptfs_replication_target_up", target="dr") == 0
            assert value(text, "ckptfs_replication_checkpoints", target="dr", state="pending") == 1
        finally:
            other.resume()
        commit(a, "step_2")  # late.bin: a new generation, replicated as such
        wait_for("dr caught up", lambda: caught_up(a, "dr", 2), timeout=240)
        t = status(a)["dr"]
        assert (t["lag_seconds"], t["bytes_behind"], t["reachable"]) == (0, 0, True)
        keys = objects(other, second_bucket)
        assert "step_2/late.bin" in keys and f"step_2/{MANIFEST}" in keys
    finally:
        other.stop()


def test_replication_metrics_are_documented_both_ways(make_mount, second_s3, second_bucket, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client.parser import text_string_to_metric_families

    from tests.integration.test_metrics import scrape
    from tests.support.promql import documented_metrics

    config = write_config(tmp_path / "replicas.toml", {"dr": {"source": f"s3://{second_bucket}", "endpoint_url": second_s3.endpoint_url}})
    a = make_mount("a", start=False, **replica_options())
    a.metrics_port = free_port()
    start(a, config)
    wait_for("first survey", lambda: status(a)["dr"]["surveyed_at"], timeout=60)
    text = scrape(a.metrics_port)
    served = {f.name if f.type != "counter" else f.name + "_total": f for f in text_string_to_metric_families(text)
              if f.name.startswith("ckptfs_replication_")}
    documented = {k: v for k, v in documented_metrics().items() if k.startswith("ckptfs_replication_")}
    assert sorted(served) == sorted(documented), "docs/metrics.md (replication) and /metrics differ"
    for name, family in served.items():
        kind, labels = documented[name]
        assert family.type == kind, name
        assert {k for s in family.samples for k in s.labels} == {x.strip(" `") for x in labels.split(",") if x.strip()}, name


def test_replica_follows_retention_after_grace_keeps_protected_and_restores_in_a_drill(make_mount, second_s3, second_bucket, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path / "replicas.toml", {"dr": {"source": f"s3://{second_bucket}/copy", "endpoint_url": second_s3.endpoint_url}})
    a = make_mount("a", start=False, retention_keep_last=1, retention_min_age=0, retention_grace=2, **replica_options())
    start(a, config)
    saved = {}
    for step in (1, 2, 3):
        saved[step] = dcp_save(a.path / "run" / f"step_{step}", ranks=2, size=MiB + step)
        commit(a, f"run/step_{step}")
    assert a.cli("protect", str(a.path / "run/step_1"), "--reason", "golden").returncode == 0
    wait_for("three checkpoints on dr", lambda: caught_up(a, "dr", 3), timeout=180)

    def on_dr(step: int) -> set[str]:
        return {k.rsplit("/", 1)[1] for k in objects(second_s3, second_bucket, f"copy/run/step_{step}/")}

    # retention on the primary: step_2 becomes expiring (step_1 protected, step_3 the newest); the replica keeps it
    plan = {d["path"]: d for d in json.loads(a.cli("retention", "apply", str(a.path), "--json").stdout)}
    assert plan["run/step_2"]["action"] == "delete" and plan["run/step_1"]["action"] == "keep"
    assert MANIFEST in on_dr(2)
    # a drill from the replica restores the newest checkpoint and verifies it deep
    proc = a.cli("drill", str(a.path / "run"), "--target", "dr", "--json",
                 "--exec", f"{sys.executable} -c \"import os,sys; sys.exit(0 if sorted(os.listdir(sys.argv[1])) == {sorted(saved[3])!r} else 3)\" {{path}}")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result = json.loads(proc.stdout)
    assert (result["path"], result["target"], result["verify"], result["outcome"]) == ("run/step_3", "dr", "whole", "ok")
    assert result["bytes"] == sum(map(len, saved[3].values())) and not os.path.exists(result["dir"])
    assert json.loads(body(second_s3, second_bucket, "copy/.ckptfs/drills/last.json"))["last"]["target"] == "dr"
    # after the grace period retention deletes step_2 on the primary; the replica follows
    wait_for("grace over, step_2 deleted on the primary", lambda: (
        json.loads(a.cli("retention", "apply", str(a.path), "--json").stdout) and not objects(a.s3, a.bucket, a.key("run/step_2/"))), timeout=60)
    wait_for("step_2 deleted on dr", lambda: not on_dr(2), timeout=180)
    # the protected and the newest checkpoints are kept on both, protection included
    assert {MANIFEST, PROTECTED} <= on_dr(1) and MANIFEST in on_dr(3)
    assert objects(a.s3, a.bucket, a.key("run/step_1/")) and objects(a.s3, a.bucket, a.key("run/step_3/"))
    events = json.loads(a.cli("audit", str(a.path), "--json").stdout)
    assert any(e["action"] == "replica-delete" and e["path"] == "run/step_2" and e["target"] == "dr" for e in events)
    # a checkpoint removed by hand on the primary (not by retention) stays on the replica
    for key in objects(a.s3, a.bucket, a.key("run/step_3/")):
        a.s3.client().delete_object(Bucket=a.bucket, Key=key)
    since = status(a)["dr"]["surveyed_at"]
    wait_for("passes enough for two looks at the replica's retention", lambda: status(a)["dr"]["surveyed_at"] > since + 12, timeout=120)
    assert MANIFEST in on_dr(3) and status(a)["dr"]["deleted_total"] == 1
    assert [e["path"] for e in json.loads(a.cli("audit", str(a.path), "--json").stdout) if e["action"] == "replica-delete"] == ["run/step_2"]


def test_copies_failing_on_the_target_are_reported_and_never_take_the_mount_down(make_mount, second_s3, second_bucket, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proxy = FaultProxy(second_s3.s3_port)
    try:
        config = write_config(tmp_path / "replicas.toml", {"dr": {"source": f"s3://{second_bucket}", "endpoint_url": proxy.url}})
        a = make_mount("a", start=False, **replica_options(replication_part_size="5MiB"))
        start(a, config)
        proxy.fail(500, "InternalError", count=10**6, methods={"PUT"})  # every upload (PutObject, UploadPart) refused
        step = a.path / "step_9"
        step.mkdir()
        want = {"big.distcp": shard(step / "big.distcp", 11 * MiB, 1), "small.distcp": shard(step / "small.distcp", MiB, 2)}
        commit(a, "step_9")
        failed = wait_for("the copy reported failed", lambda: (lambda t: t if t["failed"] == 1 else None)(status(a)["dr"]), timeout=180)
        assert "InternalError" in failed["failures"]["step_9"] or "500" in failed["failures"]["step_9"], failed
        assert on_target(a, "step_9").startswith("failed: ")  # what the catalogue page shows of it (docs/ui.md)
        proc = a.cli("replicate", "status", str(a.path))
        assert proc.returncode == 1 and "step_9" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
        # the mount is alive and its drain works
        assert not mount_is_dead(a.path)
        digest = write_random(a.path / "after.bin", MiB, seed=4)
        a.flush()
        assert a.object_sha256("after.bin") == digest
        proxy.set_mode("pass")
        wait_for("dr caught up", lambda: caught_up(a, "dr", 1), timeout=180)
        assert status(a)["dr"]["failed"] == 0
        assert on_target(a, "step_9") == "replicated"
        for name, data in want.items():
            assert body(second_s3, second_bucket, f"step_9/{name}") == data
        assert not second_s3.client().list_multipart_uploads(Bucket=second_bucket).get("Uploads")
    finally:
        proxy.close()


def test_an_object_not_matching_its_manifest_is_not_copied(make_mount, second_s3, second_bucket, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path / "replicas.toml", {"dr": {"source": f"s3://{second_bucket}", "endpoint_url": second_s3.endpoint_url}})
    a = make_mount("a", start=False, **replica_options())
    start(a, config)
    step = a.path / "step_4"
    step.mkdir()
    shard(step / "good.distcp", MiB, 1)
    a.flush()
    # written by another tool, with an xxh3 in its metadata that is not its bytes': the manifest takes it from there
    data = os.urandom(6 * MiB)
    a.s3.client().put_object(Bucket=a.bucket, Key=a.key("step_4/bad.distcp"), Body=data, Metadata={"xxh3": "0" * 32})
    commit(a, "step_4")
    t = wait_for("the copy reported failed", lambda: (lambda t: t if t["failed"] == 1 else None)(status(a)["dr"]), timeout=180)
    why = t["failures"]["step_4"]
    assert "bad.distcp" in why and "the manifest says " + "0" * 32 in why, why
    keys = objects(second_s3, second_bucket)
    assert "step_4/bad.distcp" not in keys and f"step_4/{MANIFEST}" not in keys  # visibly incomplete, never whole
    assert not second_s3.client().list_multipart_uploads(Bucket=second_bucket).get("Uploads")


def test_a_streamed_copy_holds_its_data_only_in_its_part_buffers(make_mount, second_s3, second_bucket, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The memory of a streamed copy is bounded by construction: a part holds one of `parts in flight` slots and one
    reused part buffer (an anonymous mmap) from its GET until it is uploaded and hashed; nothing part-sized is
    allocated on the heap besides (tracemalloc sees every bytes object, in every thread; not the mmaps)."""
    a = make_mount("a")
    step = a.path / "step_5"
    step.mkdir()
    want = {f"__{r}_0.distcp": shard(step / f"__{r}_0.distcp", 20 * MiB + r, r) for r in range(3)}
    want["small"] = shard(step / "small", MiB, 9)
    commit(a, "step_5")
    for k, v in a.s3.env().items():
        monkeypatch.setenv(k, v)
    cfg = Config(bucket=a.bucket, prefix=a.prefix, endpoint_url=a.s3.endpoint_url)
    src = Store(cfg)
    dst = Store(dataclasses.replace(cfg, bucket=second_bucket, prefix="", endpoint_url=second_s3.endpoint_url))
    key = a.key(f"step_5/{MANIFEST}")
    manifest = read_manifest(src, key)
    assert manifest is not None
    manifest_body = src.get_bytes(key)[0]
    dst.list("")  # both clients made their first requests before memory is traced
    part, in_flight = 8 * MiB, 2
    buffers = PartBuffers(part, in_flight)  # take() beyond 2 raises: a part without a slot
    traced: dict[str, int] = {}

    async def main() -> None:
        limiter = trio.CapacityLimiter(8)

        async def io(fn, *args):  # type: ignore[no-untyped-def]
            return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter)

        job = Job(src, dst, a.bucket, "step_5/", False, part, 5 << 30, Slots(in_flight), io, buffers=buffers)
        tracemalloc.start()
        try:
            await copy_checkpoint(job, manifest, manifest_body, None, False)
            traced["peak"] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    trio.run(main)
    for name, data in want.items():
        assert body(second_s3, second_bucket, f"step_5/{name}") == data
    assert MANIFEST in {k.rsplit("/", 1)[1] for k in objects(second_s3, second_bucket, "step_5/")}
    assert (buffers.peak, buffers.in_use, buffers.peak_bytes) == (in_flight, 0, in_flight * part)
    # a copy that held each part as a bytes object (2 in flight) peaks at 2 x 8 MiB or more
    assert traced["peak"] < part, f"{traced['peak'] / MiB:.1f} MiB on the heap while copying"


def test_a_replica_with_its_own_longer_retention_keeps_what_the_primary_deleted(make_mount, second_s3, second_bucket, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path / "replicas.toml", {
        "long": {"source": f"s3://{second_bucket}/long", "endpoint_url": second_s3.endpoint_url, "keep_last": 3},
        "follow": {"source": f"s3://{second_bucket}/follow", "endpoint_url": second_s3.endpoint_url},
    })
    a = make_mount("a", start=False, retention_keep_last=1, retention_min_age=0, retention_grace=2, **replica_options())
    start(a, config)
    for step in (1, 2, 3):
        dcp_save(a.path / "run" / f"step_{step}", ranks=2, size=MiB + step)
        commit(a, f"run/step_{step}")
    wait_for("three checkpoints on both targets", lambda: caught_up(a, "long", 3) and caught_up(a, "follow", 3), timeout=180)

    def on(target: str, step: int) -> set[str]:
        return {k.rsplit("/", 1)[1] for k in objects(second_s3, second_bucket, f"{target}/run/step_{step}/")}

    def retention_deleted(*steps: int) -> bool:
        a.cli("retention", "apply", str(a.path), "--json")
        return not any(objects(a.s3, a.bucket, a.key(f"run/step_{s}/")) for s in steps)

    # the primary keeps the newest only: steps 1 and 2 expire, then are deleted after the grace period
    wait_for("steps 1 and 2 deleted on the primary", lambda: retention_deleted(1, 2), timeout=120)
    # the replica without a policy of its own follows; the one with keep_last = 3 keeps both, whole
    wait_for("follow deleted steps 1 and 2", lambda: not on("follow", 1) and not on("follow", 2), timeout=180)
    long = wait_for("long kept them by its own retention", lambda: (lambda t: t if t["kept_by_own_policy"] == 2 else None)(status(a)["long"]),
                    timeout=180)
    assert long["own_policy"] == "keep_last = 3" and status(a)["follow"]["own_policy"] is None
    assert MANIFEST in on("long", 1) and MANIFEST in on("long", 2)
    for step in (1, 2):
        proc = a.cli("verify", str(a.path / f"run/step_{step}"), "--target", "long", "--deep")
        assert proc.returncode == 0, proc.stderr
        assert "is whole (deep, on replica long)" in proc.stdout
    proc = a.cli("drill", str(a.path / "run/step_2"), "--target", "long", "--json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert (lambda r: (r["path"], r["target"], r["verify"], r["outcome"]))(json.loads(proc.stdout)) == ("run/step_2", "long", "whole", "ok")
    # a newer checkpoint: the primary lets step 3 go; the long replica's newest 3 are now 2, 3, 4: step 1 goes there
    dcp_save(a.path / "run" / "step_4", ranks=2, size=MiB + 4)
    commit(a, "run/step_4")
    wait_for("step 4 on both targets", lambda: caught_up(a, "long", 2) and caught_up(a, "follow", 2), timeout=180)
    wait_for("step 3 deleted on the primary", lambda: retention_deleted(3), timeout=120)
    wait_for("follow deleted step 3", lambda: not on("follow", 3), timeout=180)
    wait_for("long deleted step 1", lambda: not on("long", 1), timeout=180)
    assert all(MANIFEST in on("long", s) for s in (2, 3, 4)) and MANIFEST in on("follow", 4)
    deletes = [(e["target"], e["path"]) for e in json.loads(a.cli("audit", str(a.path), "--json").stdout) if e["action"] == "replica-delete"]
    assert sorted(deletes) == [("follow", "run/step_1"), ("follow", "run/step_2"), ("follow", "run/step_3"), ("long", "run/step_1")]


def test_a_file_past_the_part_limit_is_copied_in_larger_parts_streamed_and_server_side(make_mount, s3, second_s3, second_bucket,
                                                                                       monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """S3 takes at most 10,000 parts: a file above 10,000 x replication_part_size must be copied in larger parts, as the
    drain uploads it. The limit is lowered to 3 (sizes.S3_MAX_PARTS, read when a copy starts) so a 16 MiB file stands
    for a 160 GiB one: 5 MiB parts would need 4. Both copies, streamed (to the second server) and inside the store (to
    another bucket of the first), must use at most 3 parts and give the same bytes; the streamed one, whose 6 MiB parts
    hold 2 of its 2 slots of 5 MiB, one part at a time, within the same 10 MiB of part buffers."""
    a = make_mount("a")
    step = a.path / "step_7"
    step.mkdir()
    want = {"big.distcp": shard(step / "big.distcp", 16 * MiB + 5, 1), "small": shard(step / "small", MiB, 2)}
    commit(a, "step_7")
    for k, v in a.s3.env().items():
        monkeypatch.setenv(k, v)
    near = s3.make_bucket(f"near-{uuid.uuid4().hex[:12]}")
    try:
        cfg = Config(bucket=a.bucket, prefix=a.prefix, endpoint_url=a.s3.endpoint_url)
        src = Store(cfg)
        far = Store(dataclasses.replace(cfg, bucket=second_bucket, prefix="", endpoint_url=second_s3.endpoint_url))
        local = Store(dataclasses.replace(cfg, bucket=near, prefix=""))
        key = a.key(f"step_7/{MANIFEST}")
        manifest = read_manifest(src, key)
        assert manifest is not None
        manifest_body = src.get_bytes(key)[0]
        monkeypatch.setattr("ckptfs.sizes.S3_MAX_PARTS", 3)
        part, in_flight = 5 * MiB, 2
        buffers = PartBuffers(part, in_flight)  # take() beyond 10 MiB in use raises

        async def main() -> None:
            limiter = trio.CapacityLimiter(8)

            async def io(fn, *args):  # type: ignore[no-untyped-def]
                return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter)

            streamed = Job(src, far, a.bucket, "step_7/", False, part, 5 * MiB, Slots(in_flight), io, buffers=buffers)
            await copy_checkpoint(streamed, manifest, manifest_body, None, False)
            inside = Job(src, local, a.bucket, "step_7/", True, part, 5 * MiB, Slots(in_flight), io)
            await copy_checkpoint(inside, manifest, manifest_body, None, False)
            assert (streamed.counters.server_side, inside.counters.server_side) == (0, 2)

        trio.run(main)
        for server, bucket in ((second_s3, second_bucket), (s3, near)):
            client = server.client()
            for name, data in want.items():
                assert hashlib.sha256(body(server, bucket, f"step_7/{name}")).hexdigest() == hashlib.sha256(data).hexdigest(), (bucket, name)
            big = client.head_object(Bucket=bucket, Key="step_7/big.distcp", PartNumber=1)
            assert big["ContentLength"] == 6 * MiB and big["PartsCount"] == 3, (bucket, big)  # 6 MiB parts: 3, not 4 of 5 MiB
            assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
        assert buffers.in_use == 0 and buffers.peak_bytes == 6 * MiB  # one 6 MiB part at a time (or the small file's 5 MiB)
    finally:
        delete_bucket(s3.client(), near)
