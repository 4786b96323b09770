"""Checkpoint lifecycle on a real mount and a real S3 server: commit and manifests, the catalogue,
verify, protection (two nodes, Object Lock legal holds) and the audit log (docs/lifecycle.md)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import xxhash

from tests.conftest import ROOT, Mount, delete_bucket, fuse_usable, wait_for, write_random

# Checkpoint lifecycle: store-side logic behind the control socket: the FUSE transport changes nothing here, so these tests run under the default one only
pytestmark = pytest.mark.one_transport

MiB = 1 << 20
MANIFEST = ".ckptfs-manifest.json"

# one DCP rank: writes its shard in place and fsyncs it, as FileSystemWriter does (sync_files=True)
RANK = """
import os, random, sys
path, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = random.Random(rank).randbytes(size)
with open(os.path.join(path, f"__{rank}_0.distcp"), "wb") as f:
    f.write(data); f.flush(); os.fsync(f.fileno())
"""


def dcp_save(step_dir: Path, ranks: int = 4, size: int = 3 * MiB + 7) -> dict[str, bytes]:
    """The file layout of a PyTorch DCP save across `ranks` processes: shards in place, then `.metadata` via tmp + rename."""
    step_dir.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(step_dir), str(r), str(size + r)]) for r in range(ranks)]
    assert [p.wait(timeout=120) for p in procs] == [0] * ranks
    meta = json.dumps({"ranks": ranks}).encode()
    tmp = step_dir / ".metadata.tmp"
    with open(tmp, "wb") as f:
        f.write(meta)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, step_dir / ".metadata")
    import random

    files = {f"__{r}_0.distcp": random.Random(r).randbytes(size + r) for r in range(ranks)}
    files[".metadata"] = meta
    return files


def hf_save(ckpt: Path) -> dict[str, bytes]:
    """A Hugging Face Trainer `checkpoint-N` directory (files written to a tmp name and renamed)."""
    ckpt.mkdir(parents=True)
    files = {
        "model.safetensors": os.urandom(5 * MiB + 3),
        "optimizer.pt": os.urandom(2 * MiB),
        "trainer_state.json": b'{"global_step": 500}',
        "config.json": b'{"model_type": "llama"}',
    }
    for name, body in files.items():
        (ckpt / f"{name}.tmp").write_bytes(body)
        os.rename(ckpt / f"{name}.tmp", ckpt / name)
    return files


def cli_json(m: Mount, *args: str) -> Any:
    proc = m.cli(*args, "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def catalogue(m: Mount, path: str = "") -> dict[str, dict[str, Any]]:
    return {e["path"]: e for e in cli_json(m, "checkpoints", str(m.path / path))}


def manifest(m: Mount, ckpt: str) -> dict[str, Any]:
    body = m.s3.client().get_object(Bucket=m.bucket, Key=m.key(f"{ckpt}/{MANIFEST}"))["Body"].read()
    return json.loads(body)


def expect_eperm(fn: Any, *args: Any) -> None:
    with pytest.raises(OSError) as e:
        fn(*args)
    assert e.value.errno == errno.EPERM, e.value


@pytest.fixture
def two(make_mount) -> tuple[Mount, Mount]:  # type: ignore[no-untyped-def]
    # B lists on every lookup: what A did in the bucket shows at once, without sleeping out a TTL
    a = make_mount("a", checkpoint_quiet_seconds=1, node_name="node-a")
    b = make_mount("b", metadata_ttl=0, checkpoint_quiet_seconds=1, node_name="node-b")
    return a, b


# ------------------------------------------------------------------ commit and manifests
def test_dcp_step_from_several_processes_is_committed_once_quiet(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(checkpoint_quiet_seconds=1, node_name="trainer-7")
    files = dcp_save(m.path / "run7" / "step_100")
    wait_for("step_100 committed", lambda: catalogue(m).get("run7/step_100", {}).get("state") == "committed", timeout=120)
    doc = manifest(m, "run7/step_100")
    assert doc["step"] == 100 and doc["path"] == "run7/step_100" and doc["generation"] == 1 and not doc["changed"]
    assert doc["node"] == "trainer-7" and doc["how"] == "quiet"  # node_name, not the host's name
    assert sorted(f["path"] for f in doc["files"]) == sorted(files)
    client = m.s3.client()
    for f in doc["files"]:
        assert f["key"] == m.key(f"run7/step_100/{f['path']}")
        assert f["size"] == len(files[f["path"]])
        assert f["xxh3"] == xxhash.xxh3_128(files[f["path"]]).hexdigest()
        assert f["etag"] == client.head_object(Bucket=m.bucket, Key=f["key"])["ETag"].strip('"')
    entry = catalogue(m)["run7/step_100"]
    assert (entry["step"], entry["files"], entry["bytes"], entry["protected"]) == (100, 5, sum(map(len, files.values())), False)
    # the manifest is ckptfs's own: not shown in the mount, and no file may take its name
    assert sorted(os.listdir(m.path / "run7/step_100")) == sorted(files)
    expect_eperm(open, m.path / "run7/step_100" / MANIFEST, "wb")
    expect_eperm(os.mkdir, m.path / ".ckptfs")


def test_hf_checkpoint_commit_command_with_metadata_and_a_change_after_it(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()  # default quiet period (60 s): only the command commits during this test
    files = hf_save(m.path / "out" / "checkpoint-500")
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"eval": {"loss": 1.25}, "data_snapshot": "s3://data/v3"}))
    proc = m.cli("checkpoint", "commit", str(m.path / "out/checkpoint-500"), "--meta", "lr=0.0003", "--meta", str(meta))
    assert proc.returncode == 0, proc.stderr
    assert "out/checkpoint-500 committed: step 500, 4 files" in proc.stdout
    doc = manifest(m, "out/checkpoint-500")
    assert doc["metadata"] == {"lr": 0.0003, "eval": {"loss": 1.25}, "data_snapshot": "s3://data/v3"}
    assert doc["how"] == "command" and sorted(f["path"] for f in doc["files"]) == sorted(files)
    again = m.cli("checkpoint", "commit", str(m.path / "out/checkpoint-500"))
    assert again.returncode == 0 and "already committed" in again.stdout
    assert manifest(m, "out/checkpoint-500")["generation"] == 1
    # a change after the manifest: the next commit is a new generation, marked changed, metadata kept
    write_random(m.path / "out/checkpoint-500/rng_state.pth", 1000, seed=5)
    proc = m.cli("checkpoint", "commit", str(m.path / "out/checkpoint-500"))
    assert proc.returncode == 0, proc.stderr
    doc = manifest(m, "out/checkpoint-500")
    assert (doc["generation"], doc["changed"], doc["file_count"]) == (2, True, 5)
    assert doc["metadata"]["lr"] == 0.0003
    entry = catalogue(m, "out")["out/checkpoint-500"]
    assert (entry["state"], entry["changed"], entry["generation"]) == ("committed", True, 2)


def test_non_finite_metadata_is_stored_as_null_and_every_json_object_in_the_bucket_is_strict_json(make_mount) -> None:  # type: ignore[no-untyped-def]
    """Issue 35: a diverged loss (NaN) given to `ckptfs.commit` or `--meta loss=NaN` becomes null in the manifest,
    and every JSON object ckptfs writes into the bucket (manifests, protection, audit log, verify) parses with a
    strict parser."""
    import ckptfs

    m: Mount = make_mount()  # default quiet period: only the calls below commit
    for step in (1, 2):
        (m.path / f"run/step_{step}").mkdir(parents=True)
        write_random(m.path / f"run/step_{step}/model.bin", 1000, seed=step)
    ckptfs.commit(m.path / "run/step_1", {"loss": float("nan"), "curve": [1.5, float("inf")], "lr": 3e-4})
    proc = m.cli("checkpoint", "commit", str(m.path / "run/step_2"), "--meta", "loss=NaN", "--meta", "best=-Infinity")
    assert proc.returncode == 0, proc.stderr
    assert ckptfs.protect(m.path / "run/step_1", "golden")
    assert m.cli("verify", str(m.path / "run/step_2")).returncode == 0

    def refuse(token: str) -> None:
        raise AssertionError(f"{token} in a JSON object in the bucket")

    client = m.s3.client()
    docs = {key: json.loads(client.get_object(Bucket=m.bucket, Key=key)["Body"].read(), parse_constant=refuse)
            for key in m.keys() if key.endswith(".json")}
    assert {k.rsplit("/", 1)[-1] for k in docs} >= {MANIFEST, ".ckptfs-protected.json", ".ckptfs-verify.json"}
    assert any("/.ckptfs/audit/" in k for k in docs)
    assert docs[m.key(f"run/step_1/{MANIFEST}")]["metadata"] == {"loss": None, "curve": [1.5, None], "lr": 3e-4}
    assert docs[m.key(f"run/step_2/{MANIFEST}")]["metadata"] == {"loss": None, "best": None}
    assert docs[m.key(f"run/step_1/{MANIFEST}")]["format"] == "ckptfs-manifest/1"
    assert catalogue(m, "run")["run/step_2"]["metadata"] == {"loss": None, "best": None}
    again = m.cli("checkpoint", "commit", str(m.path / "run/step_2"), "--meta", "loss=NaN")
    assert again.returncode == 0 and "already committed" in again.stdout  # NaN is null: the same metadata again


def test_commit_errors_are_one_line(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()
    (m.path / "notes").mkdir()
    (m.path / "step_3").mkdir()
    for args, message in [
        (("checkpoint", "commit", str(m.path / "notes")), "notes is not a checkpoint"),
        (("checkpoint", "commit", str(m.path / "step_3")), "holds no files"),
        (("checkpoint", "commit", str(m.path / "step_3"), "--meta", "novalue"), "neither KEY=VALUE"),
        (("verify", str(m.path / "step_3")), "not committed"),
        (("protect", str(m.path / "step_3"), "--reason", "x"), "not committed"),
    ]:
        proc = m.cli(*args)
        assert proc.returncode != 0
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_removed_checkpoint_leaves_nothing_in_the_bucket(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()
    dcp_save(m.path / "step_9")
    assert m.cli("checkpoint", "commit", str(m.path / "step_9")).returncode == 0
    assert m.key(f"step_9/{MANIFEST}") in m.keys()
    import shutil

    shutil.rmtree(m.path / "step_9")
    m.flush()
    assert m.keys() == []


# ------------------------------------------------------------------------------- verify
def test_verify_shallow_and_deep_find_missing_changed_unexpected(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(read_range_size="64KiB", read_concurrency=3)  # several ranges per file
    files = dcp_save(m.path / "step_200", size=1 * MiB + 11)
    assert m.cli("checkpoint", "commit", str(m.path / "step_200")).returncode == 0
    for args in ((), ("--deep",)):
        proc = m.cli("verify", str(m.path / "step_200"), *args)
        assert proc.returncode == 0, proc.stderr
        assert "step_200 is whole" in proc.stdout
    result = cli_json(m, "verify", str(m.path / "step_200"), "--deep")
    assert result["checked_bytes"] == sum(map(len, files.values()))
    last = catalogue(m)["step_200"]["last_verify"]
    assert (last["outcome"], last["deep"]) == ("whole", True)

    # bytes that rot without the listing noticing: only deep finds them (the manifest's xxh3 disagrees)
    client = m.s3.client()
    key = m.key(f"step_200/{MANIFEST}")
    doc = json.loads(client.get_object(Bucket=m.bucket, Key=key)["Body"].read())
    rotten = next(f for f in doc["files"] if f["path"] == "__1_0.distcp")
    rotten["xxh3"] = "0" * 32
    client.put_object(Bucket=m.bucket, Key=key, Body=json.dumps(doc).encode())
    assert m.cli("verify", str(m.path / "step_200")).returncode == 0
    proc = m.cli("verify", str(m.path / "step_200"), "--deep")
    assert proc.returncode == 1 and "changed: __1_0.distcp" in proc.stderr

    # objects removed, replaced and added behind ckptfs's back
    client.delete_object(Bucket=m.bucket, Key=m.key("step_200/__0_0.distcp"))
    client.put_object(Bucket=m.bucket, Key=m.key("step_200/__2_0.distcp"), Body=b"truncated")
    client.put_object(Bucket=m.bucket, Key=m.key("step_200/stray.bin"), Body=b"x")
    result = json.loads(m.cli("verify", str(m.path / "step_200"), "--json").stdout)
    assert (result["outcome"], result["missing"], result["changed"], result["unexpected"]) == (
        "broken", ["__0_0.distcp"], ["__2_0.distcp"], ["stray.bin"])
    proc = m.cli("verify", str(m.path / "step_200"))
    assert proc.returncode == 1 and "NOT whole" in proc.stderr
    last = catalogue(m)["step_200"]["last_verify"]
    assert (last["outcome"], last["deep"], last["counts"]["missing"]) == ("broken", False, 1)


# --------------------------------------------------------------- two nodes, protection
def test_two_nodes_share_the_catalogue_and_protection(two: tuple[Mount, Mount]) -> None:
    a, b = two
    files = dcp_save(a.path / "run" / "step_1")
    hf_save(a.path / "run" / "checkpoint-2")
    wait_for("both committed on A", lambda: {e["state"] for e in catalogue(a).values()} == {"committed"}, timeout=120)
    seen_a, seen_b = catalogue(a), catalogue(b)
    assert sorted(seen_b) == ["run/checkpoint-2", "run/step_1"]
    for path in seen_a:
        for field in ("step", "state", "files", "bytes", "protected", "generation", "committed_at", "node"):
            assert seen_a[path][field] == seen_b[path][field], (path, field)
        assert seen_a[path]["node"] == "node-a"  # committed by A, named by its node_name

    proc = a.cli("protect", str(a.path / "run/step_1"), "--reason", "golden: eval 71.3")
    assert proc.returncode == 0, proc.stderr
    assert "protected through ckptfs only" in proc.stdout and "has no S3 Object Lock" in proc.stdout
    assert catalogue(b)["run/step_1"]["state"] == "protected"
    assert catalogue(b)["run/step_1"]["protection"]["reason"] == "golden: eval 71.3"
    # no hold was placed on a bucket without Object Lock (and a plain S3 tool is not stopped)
    shard = a.key("run/step_1/__0_0.distcp")
    client = a.s3.client()
    try:
        hold = client.get_object_legal_hold(Bucket=a.bucket, Key=shard)["LegalHold"]["Status"]
    except client.exceptions.ClientError:
        hold = "none"
    assert hold != "ON"

    for m in (b, a):
        d = m.path / "run/step_1"
        expect_eperm(os.unlink, d / "__0_0.distcp")
        expect_eperm(open, d / "__1_0.distcp", "r+b")
        expect_eperm(open, d / "new.bin", "wb")
        expect_eperm(os.truncate, d / "__2_0.distcp", 0)
        expect_eperm(os.chmod, d / "__2_0.distcp", 0o600)
        expect_eperm(os.rename, d / ".metadata", d / "metadata.old")
        expect_eperm(os.rename, d, m.path / "run/step_1.old")
        expect_eperm(os.rename, m.path / "run", m.path / "run.old")  # would move the checkpoint with it
        expect_eperm(os.mkdir, d / "extra")
        expect_eperm(os.rmdir, d)
        assert (d / "__3_0.distcp").read_bytes() == files["__3_0.distcp"]  # reading is fine
    # the other checkpoint is not protected
    os.unlink(b.path / "run/checkpoint-2/config.json")

    proc = b.cli("unprotect", str(b.path / "run/step_1"), "--reason", "superseded by step 2")
    assert proc.returncode == 0, proc.stderr
    # A learns it from its next listing of the directory, after its metadata_ttl
    wait_for("A may delete again", lambda: _try_unlink(a.path / "run/step_1/__0_0.distcp"), timeout=60)

    events = cli_json(b, "audit", str(b.path))
    assert [(e["action"], e["path"], e["reason"]) for e in events] == [
        ("protect", "run/step_1", "golden: eval 71.3"), ("unprotect", "run/step_1", "superseded by step 2")]
    assert [e["node"] for e in events] == ["node-a", "node-b"]  # each mount's node_name, though one host
    for e in events:
        assert e["who"]["uid"] == os.getuid() and e["at"] > 0
    audit_keys = [k for k in a.keys() if k.startswith(a.key(".ckptfs/audit/"))]
    assert len(audit_keys) == 2
    assert ".ckptfs" not in os.listdir(a.path)


def _try_unlink(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except PermissionError:
        return False


def test_object_lock_bucket_gets_legal_holds(s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if not fuse_usable():
        pytest.skip("/dev/fuse is not usable here")
    client = s3.client()
    name = f"lock-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
    (tmp_path / "mnt").mkdir()
    (tmp_path / "cache").mkdir()
    m = Mount(s3, name, "ckpt", tmp_path / "mnt", tmp_path / "cache", {"upload_delay": 0.2})
    m.start()
    try:
        dcp_save(m.path / "step_5", ranks=2)
        assert m.cli("checkpoint", "commit", str(m.path / "step_5")).returncode == 0
        out = cli_json(m, "protect", str(m.path / "step_5"), "--reason", "release candidate")
        held = out["protection"]["held"]
        assert out["protection"]["object_lock"] is True
        assert sorted(h["key"] for h in held) == sorted(m.key(f"step_5/{n}") for n in ("__0_0.distcp", "__1_0.distcp", ".metadata", MANIFEST))
        for h in held:
            assert client.get_object_legal_hold(Bucket=name, Key=h["key"], VersionId=h["version_id"])["LegalHold"]["Status"] == "ON"
        # the store itself now refuses to destroy those bytes
        first = held[0]
        with pytest.raises(client.exceptions.ClientError) as e:
            client.delete_object(Bucket=name, Key=first["key"], VersionId=first["version_id"])
        assert e.value.response["Error"]["Code"] == "AccessDenied"
        expect_eperm(os.unlink, m.path / "step_5/__0_0.distcp")

        assert m.cli("unprotect", str(m.path / "step_5"), "--reason", "done").returncode == 0
        for h in held:
            assert client.get_object_legal_hold(Bucket=name, Key=h["key"], VersionId=h["version_id"])["LegalHold"]["Status"] == "OFF"
        client.delete_object(Bucket=name, Key=first["key"], VersionId=first["version_id"])
    finally:
        m.stop()
        _delete_versions(client, name)


def _delete_versions(client: Any, name: str) -> None:
    try:
        for page in client.get_paginator("list_object_versions").paginate(Bucket=name):
            for v in page.get("Versions", []) + page.get("DeleteMarkers", []):
                try:
                    client.delete_object(Bucket=name, Key=v["Key"], VersionId=v["VersionId"])
                except Exception:  # noqa: BLE001 - a held version stays; the bucket then stays too
                    pass
    finally:
        delete_bucket(client, name)


def test_two_nodes_committing_one_step_write_one_manifest(make_mount) -> None:  # type: ignore[no-untyped-def]
    # a two-node DCP save: each node writes its ranks' shards of the same step
    a: Mount = make_mount("a")
    b: Mount = make_mount("b", metadata_ttl=0)
    (a.path / "step_10").mkdir()
    a.flush()
    for m, ranks in ((a, (0, 1)), (b, (2, 3))):
        for r in ranks:
            write_random(m.path / f"step_10/__{r}_0.distcp", 2 * MiB + r, seed=r)
        m.flush()
    procs = [subprocess.Popen([sys.executable, "-m", "ckptfs.cli", "checkpoint", "commit", str(m.path / "step_10")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=m.env, cwd=ROOT) for m in (a, b)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    said = sorted("already committed" in out for out, _ in outs)
    assert said == [False, True], outs  # one node wrote it, the other found it written
    doc = manifest(a, "step_10")
    assert (doc["generation"], doc["file_count"]) == (1, 4)


def test_checkpoint_metrics_follow_the_catalogue(make_mount) -> None:  # type: ignore[no-untyped-def]
    from tests.integration.test_metrics import scrape, value
    from tests.support.seaweed import free_port

    m: Mount = make_mount(start=False)
    m.metrics_port = free_port()
    m.start()
    dcp_save(m.path / "step_1", ranks=2, size=1000)
    dcp_save(m.path / "step_2", ranks=2, size=2000)
    (m.path / "step_3").mkdir()
    write_random(m.path / "step_3/__0_0.distcp", 500, seed=3)  # not committed: the quiet period is 60 s
    for step in ("step_1", "step_2"):
        assert m.cli("checkpoint", "commit", str(m.path / step)).returncode == 0
    assert m.cli("protect", str(m.path / "step_1"), "--reason", "golden").returncode == 0
    assert m.cli("verify", str(m.path / "step_2")).returncode == 0
    m.flush()
    catalogue(m)  # a listing of the whole mount refreshes the metrics' catalogue
    text = scrape(m.metrics_port)
    assert {s: value(text, "ckptfs_checkpoints", state=s) for s in ("writing", "draining", "committed", "protected", "expiring")} == {
        "writing": 1, "draining": 0, "committed": 1, "protected": 1, "expiring": 0}
    assert value(text, "ckptfs_checkpoint_bytes", state="committed") == 2 * 2000 + 1 + len(b'{"ranks": 2}')
    assert value(text, "ckptfs_checkpoint_bytes", state="writing") == 500
    assert value(text, "ckptfs_checkpoints_protected") == 1
    assert value(text, "ckptfs_checkpoint_newest_committed_step") == 2
    assert value(text, "ckptfs_checkpoint_newest_committed_age_seconds") > 0
    assert value(text, "ckptfs_checkpoint_last_verify_whole") == 1
    assert value(text, "ckptfs_checkpoint_last_verify_timestamp_seconds") > 0
    assert value(text, "ckptfs_checkpoint_commits_total") == 2
    expect_eperm(os.unlink, m.path / "step_1/.metadata")
    assert value(scrape(m.metrics_port), "ckptfs_protection_refusals_total") == 1
