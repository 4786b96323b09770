"""The compressed cold tier (cold_compression, docs/lifecycle.md "Compressed cold tier") on real checkpoints.

A small transformer is trained on CPU once for the module (tests/support/train_tiny.py: a few hundred
steps) and saved the ways trainers do: safetensors of BF16 weights, torch DCP with the FP32 AdamW state,
a torch.save state dict. Those files are moved to a second SeaweedFS server (the cold target) by the
daemon, compressed, and come back bit-identical through restore and drill; a damaged stored chunk is
found by verify --deep; a daemon killed with SIGKILL in the middle of a compressed move loses nothing
and the next one finishes it. Ages and passes are made short through the config; nothing is timed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Mount, mount_is_dead, wait_for
from tests.integration.test_coldmove import entries, hot_keys, move_options
from tests.integration.test_replication import body, commit, objects, start, write_config
from tests.support.faultproxy import FaultProxy
from tests.support.extras import need

need("torch", "train")
pytestmark = pytest.mark.one_transport  # store-side logic behind the control socket

MiB = 1 << 20
MANIFEST = ".ckptfs-manifest.json"
MOVED = ".ckptfs-moved.json"
STEP = "run/step_200"
COMPRESSED = ("model.safetensors", "model.pt", "dcp/__0_0.distcp", "dcp/.metadata")
AS_IS = ("noise.bin", "config.json")  # random bytes do not pack; a 150-byte file is too small to bother


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trained")
    subprocess.run([sys.executable, "-m", "tests.support.train_tiny", str(out), "--steps", "200"], cwd=ROOT, check=True,
                   capture_output=True, timeout=600)
    (out / "noise.bin").write_bytes(os.urandom(MiB + 3))
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_of(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha(p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


def put_checkpoint(m: Mount, trained: Path) -> dict[str, str]:
    shutil.copytree(trained, m.path / STEP)
    commit(m, STEP)
    return files_of(trained)


def options(**extra: Any) -> dict[str, Any]:
    # the default codec policy (auto); parts of 5 MiB, so the DCP shard's compressed copy is a multipart upload
    return move_options(cold_compression="auto", replication_part_size="5MiB", **extra)


def patch_etag(server: Any, bucket: str, base: str, path: str, etag: str) -> None:
    """Make the cold target's manifest name `etag` for `path`: rot under an unchanged ETag, which only a deep read sees."""
    doc = json.loads(body(server, bucket, base + MANIFEST))
    for f in doc["files"]:
        if f["path"] == path:
            f["etag"] = etag
    server.client().put_object(Bucket=bucket, Key=base + MANIFEST, Body=json.dumps(doc).encode())


def test_moved_compressed_read_back_whole_damage_found_and_restored_bit_identical(make_mount, second_s3, second_bucket, trained,  # type: ignore[no-untyped-def]
                                                                                 tmp_path) -> None:
    config = write_config(tmp_path / "cold.toml", {"cold": {"source": f"s3://{second_bucket}/c", "endpoint_url": second_s3.endpoint_url}})
    a = make_mount("a", start=False, **options(tier_move_after=1))
    start(a, config)
    want = put_checkpoint(a, trained)
    wait_for("moved", lambda: entries(a)[STEP]["storage_class"] == "moved:cold", timeout=300)
    assert not [k for k in hot_keys(a, STEP) if not k.rsplit("/", 1)[-1].startswith(".ckptfs") and not k.endswith("/")]

    # on the cold target: each tensor file as FILE.ckptfs-z, marked so, in the format; the others as they are
    base = f"c/{STEP}/"
    cold = {k.removeprefix(base): o for k, o in objects(second_s3, second_bucket, base).items()}
    client = second_s3.client()
    for name in COMPRESSED:
        assert name not in cold and name + ".ckptfs-z" in cold, sorted(cold)
        head = client.head_object(Bucket=second_bucket, Key=base + name + ".ckptfs-z")
        assert head["Metadata"]["ckptfs-codec"] == "ckptfs-z1"
        assert head["Metadata"]["ckptfs-original-size"] == str((trained / name).stat().st_size)
        assert "xxh3" not in head["Metadata"]  # a ckptfs mount of the cold bucket must not check it as the file's
        assert client.get_object(Bucket=second_bucket, Key=base + name + ".ckptfs-z", Range="bytes=0-7")["Body"].read() == b"CKPTFSZ1"
    for name in AS_IS:
        assert name + ".ckptfs-z" not in cold and sha(body(second_s3, second_bucket, base + name)) == want[name]
    tman = {f["path"]: f for f in json.loads(body(second_s3, second_bucket, base + MANIFEST))["files"]}
    ratio = {n: tman[n]["stored_size"] / tman[n]["size"] for n in COMPRESSED}
    assert ratio["model.safetensors"] <= 0.70, ratio  # BF16 weights
    assert ratio["dcp/__0_0.distcp"] <= 0.88 and ratio["model.pt"] <= 0.88, ratio  # FP32 weights and AdamW state
    assert tman["model.safetensors"]["encodings"].get("float16", 0) > 0.99 * tman["model.safetensors"]["size"]
    assert tman["dcp/__0_0.distcp"]["encodings"].get("float32", 0) > 0.95 * tman["dcp/__0_0.distcp"]["size"]
    assert tman["model.pt"]["encodings"].get("float32", 0) > 0.95 * tman["model.pt"]["size"]

    # what users see: stored and original bytes per checkpoint and class, the ratio in the table
    e = entries(a)[STEP]
    original = sum((trained / n).stat().st_size for n in want)
    stored = sum(f.get("stored_size", f["size"]) for f in tman.values())
    assert (e["original_bytes"], e["stored_bytes"]) == (original, stored) and e["moved"]["stored_bytes"] == stored
    u = json.loads(a.cli("usage", str(a.path), "--json").stdout)
    (c,) = [c for c in u["by_checkpoint"] if c["path"] == STEP]
    own = c["bytes"] - stored  # its manifest and move record, on the primary
    assert 0 < own < 64 << 10 and (c["original_bytes"], c["stored_bytes"]) == (original + own, stored + own)
    assert u["by_class"]["moved:cold"]["saved_bytes"] == original - stored > 0
    table = a.cli("checkpoints", str(a.path)).stdout
    assert f"moved:cold ({stored / original:.2f})" in table.replace("\n", " ") or f"{stored / original:.2f}" in table, table
    assert a.status()["tier_move"]["moved_stored_bytes_total"] == stored

    # read back decoded, every chunk and file checked: verify on the target, and a drill from it
    proc = a.cli("verify", str(a.path / STEP), "--target", "cold", "--deep")
    assert proc.returncode == 0, proc.stderr
    proc = a.cli("drill", str(a.path / STEP), "--json", "--keep", "--dir", str(tmp_path / "drills"))
    assert proc.returncode == 0, proc.stderr
    drilled = json.loads(proc.stdout)
    assert drilled["outcome"] == "ok" and drilled["verify"] == "whole" and drilled["bytes"] == original
    assert files_of(Path(drilled["dir"])) == want

    # a stored chunk damaged under an ETag its manifest still names: only reading it back finds it, and nothing uses it
    key = base + "dcp/__0_0.distcp.ckptfs-z"
    good = body(second_s3, second_bucket, key)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x10
    patch_etag(second_s3, second_bucket, base, "dcp/__0_0.distcp", client.put_object(Bucket=second_bucket, Key=key, Body=bytes(bad))["ETag"].strip('"'))
    proc = a.cli("verify", str(a.path / STEP), "--target", "cold")
    assert proc.returncode == 0, proc.stderr  # shallow: listing and ETags agree
    proc = a.cli("verify", str(a.path / STEP), "--target", "cold", "--deep")
    assert proc.returncode == 1 and "changed: dcp/__0_0.distcp" in proc.stderr, proc.stderr
    proc = a.cli("drill", str(a.path / STEP), "--json")
    assert proc.returncode != 0 and json.loads(proc.stdout)["changed"] == ["dcp/__0_0.distcp"], proc.stdout
    proc = a.cli("restore", str(a.path / STEP))
    err = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "dcp/__0_0.distcp" in err and "it stays moved" in err, proc.stderr
    assert entries(a)[STEP]["storage_class"] == "restoring:cold"

    # mended, the restore carries on: every file back in the primary, bit-identical through the mount
    a.stop()
    a.options["tier_move_after"] = 3600  # so it stays hot after the restore while it is read
    start(a, config)
    patch_etag(second_s3, second_bucket, base, "dcp/__0_0.distcp", client.put_object(Bucket=second_bucket, Key=key, Body=good)["ETag"].strip('"'))
    proc = a.cli("restore", str(a.path / STEP))
    assert proc.returncode == 0, proc.stderr
    e = entries(a)[STEP]
    assert e["storage_class"] == "STANDARD" and e["moved"]["state"] == "restored"
    assert files_of(a.path / STEP) == want
    assert a.cli("verify", str(a.path / STEP), "--deep").returncode == 0
    assert not objects(second_s3, second_bucket, base)  # the cold copy is gone


def test_killed_mid_compressed_move_loses_nothing_and_resumes(make_mount, second_s3, second_bucket, trained, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proxy = FaultProxy(second_s3.s3_port)
    proxy.set_mode("pass", rate=2 * MiB)  # slow enough to catch the compressed copy half-way
    try:
        config = write_config(tmp_path / "cold.toml", {"cold": {"source": f"s3://{second_bucket}", "endpoint_url": proxy.url}})
        a = make_mount("a", start=False, **options(tier_move_after=1, replication_parts_in_flight=2, replication_read_timeout=60))
        start(a, config)
        want = put_checkpoint(a, trained)
        cold = second_s3.client()
        wait_for("a compressed copy under way", lambda: cold.list_multipart_uploads(Bucket=second_bucket).get("Uploads")
                 or any(k.endswith(".ckptfs-z") for k in objects(second_s3, second_bucket)), timeout=240)
        os.kill(a.status()["pid"], signal.SIGKILL)
        wait_for("daemon gone", lambda: mount_is_dead(a.path), timeout=60)
        a.stop()
        # nothing lost: every file still on the primary, byte for byte; the record says moving; no manifest on the target
        client = a.s3.client()
        for name, digest in want.items():
            assert sha(client.get_object(Bucket=a.bucket, Key=a.key(f"{STEP}/{name}"))["Body"].read()) == digest, name
        assert json.loads(client.get_object(Bucket=a.bucket, Key=a.key(f"{STEP}/{MOVED}"))["Body"].read())["state"] == "moving"
        assert f"{STEP}/{MANIFEST}" not in objects(second_s3, second_bucket)

        proxy.set_mode("pass", rate=0)
        start(a, config)  # the same node back: takes the lease once its dead self's expires, and finishes the move
        wait_for("moved", lambda: entries(a)[STEP]["storage_class"] == "moved:cold", timeout=300)
        assert not cold.list_multipart_uploads(Bucket=second_bucket).get("Uploads")
        names = set(objects(second_s3, second_bucket, f"{STEP}/"))
        assert {f"{STEP}/{n}.ckptfs-z" for n in COMPRESSED} <= names and not {f"{STEP}/{n}" for n in COMPRESSED} & names
        proc = a.cli("drill", str(a.path / STEP), "--json", "--keep", "--dir", str(tmp_path / "drills"))
        assert proc.returncode == 0, proc.stderr
        assert files_of(Path(json.loads(proc.stdout)["dir"])) == want
    finally:
        proxy.close()
