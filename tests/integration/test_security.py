"""Encryption on a real SeaweedFS: SSE-S3 and SSE-C written through the mount, read back through a fresh mount,
checked with boto3; the SSE-C key never in the log, status or a metrics scrape. (SSE-KMS: tests/unit/test_encryption.py.)"""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import sha256_file, write_random
from tests.support.seaweed import free_port

# Encryption and access policies: what reaches the bucket: the FUSE transport changes nothing here, so these tests run under the default one only
pytestmark = pytest.mark.one_transport

MiB = 1 << 20
SMALL, LARGE = 300_000, 12 * MiB  # one PutObject; a multipart upload of 5 MiB parts
MULTIPART = {"part_size": "5MiB", "multipart_threshold": "5MiB"}


def _write_set(root: Path) -> dict[str, str]:
    (root / "run").mkdir()
    return {"run/small.bin": write_random(root / "run" / "small.bin", SMALL, seed=1),
            "run/large.bin": write_random(root / "run" / "large.bin", LARGE, seed=2)}


def test_sse_s3_objects_are_encrypted_and_read_back(make_mount: Any) -> None:
    m = make_mount("w", sse="AES256", **MULTIPART)
    sums = _write_set(m.path)
    m.flush()
    assert m.status()["encryption"] == {"mode": "SSE-S3"}
    for rel in sums:
        assert m.head(rel).get("ServerSideEncryption") == "AES256", rel
    m.stop()
    fresh = make_mount("r", sse="AES256")
    for rel, digest in sums.items():
        assert sha256_file(fresh.path / rel) == digest


def test_sse_c_end_to_end_and_the_key_never_shows(make_mount: Any, tmp_path: Path) -> None:
    key = os.urandom(32)
    key_path = tmp_path / "sse-c.key"
    key_path.write_text(base64.b64encode(key).decode() + "\n")
    key_path.chmod(0o600)
    m = make_mount("w", sse_c_key_file=str(key_path), log_level="debug", start=False, **MULTIPART)
    m.metrics_port = free_port()
    m.start()
    sums = _write_set(m.path)
    m.flush()
    # a rename of durable files is a server-side copy (CopyObject) that needs the key for the source and the target
    os.rename(m.path / "run" / "small.bin", m.path / "run" / "small2.bin")
    sums["run/small2.bin"] = sums.pop("run/small.bin")
    m.flush()
    client = m.s3.client()
    for rel in sums:
        head = client.head_object(Bucket=m.bucket, Key=m.key(rel), SSECustomerAlgorithm="AES256", SSECustomerKey=key)
        assert head["SSECustomerAlgorithm"] == "AES256", rel
        with pytest.raises(ClientError):  # without the key the store refuses the object
            client.get_object(Bucket=m.bucket, Key=m.key(rel))
    status = m.status()
    assert status["encryption"] == {"mode": "SSE-C", "key_file": str(key_path)}
    human = m.cli("status", str(m.path)).stdout
    scrape = urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=30).read().decode()
    m.stop()

    # a fresh mount with the key reads every byte back, whole and in ranges
    fresh = make_mount("r", sse_c_key_file=str(key_path), read_range_size="1MiB")
    for rel, digest in sums.items():
        assert sha256_file(fresh.path / rel) == digest
    with open(fresh.path / "run" / "large.bin", "rb") as f:
        f.seek(7 * MiB + 123)
        middle = f.read(1000)
    body = client.get_object(Bucket=m.bucket, Key=m.key("run/large.bin"), Range=f"bytes={7 * MiB + 123}-{7 * MiB + 1122}",
                             SSECustomerAlgorithm="AES256", SSECustomerKey=key)["Body"].read()
    assert middle == body
    fresh.stop()

    # a mount without the key cannot read them, and says why
    nokey = make_mount("n")
    with pytest.raises(OSError):
        (nokey.path / "run" / "small2.bin").read_bytes()
    nokey.stop()
    nokey_log = (nokey.cache_dir / "ckptfs.log").read_text()
    assert "encrypted with SSE-C" in nokey_log and "sse_c_key_file" in nokey_log

    log = (m.cache_dir / "ckptfs.log").read_text() + (fresh.cache_dir / "ckptfs.log").read_text()
    assert "deleted object" in log and "DEBUG" in log  # the log says what it did, at debug level: the grep below means something
    for form in (base64.b64encode(key).decode(), key.hex(), repr(key)):
        for where, text in (("log", log), ("status", json.dumps(status)), ("status table", human), ("metrics", scrape)):
            assert form not in text, f"the SSE-C key appears in the {where}"


def test_writer_policy_refuses_deletes_and_the_node_keeps_writing(make_mount: Any) -> None:
    """The writer role's bucket policy on SeaweedFS: deletes are refused by the store, reported once, not retried forever."""
    from tests.conftest import wait_for

    m = make_mount()
    (m.path / "step_1").mkdir()
    (m.path / "step_1" / "a.bin").write_bytes(b"a" * 1000)
    m.flush()
    out = m.cli("policy", "print", str(m.path), "--role", "writer", "--principal", "*")
    assert out.returncode == 0, out.stderr
    client = m.s3.client()
    client.put_bucket_policy(Bucket=m.bucket, Policy=out.stdout)
    try:
        with pytest.raises(ClientError) as e:  # a writer's delete, straight to the store
            client.delete_object(Bucket=m.bucket, Key=m.key("step_1/a.bin"))
        assert e.value.response["Error"]["Code"] == "AccessDenied"
        os.unlink(m.path / "step_1" / "a.bin")
        # flush returns: the refused delete is dropped and reported, not retried with backoff forever
        m.flush(timeout=120)
        st = wait_for("the refused delete reported", lambda: (s := m.status())["deletes_not_permitted_total"] == 1 and s)
        assert "not permitted" in st["last_error"] and st["pending_deletes"] == 0
        assert m.key("step_1/a.bin") in m.keys()  # still in the bucket
        # the node still writes
        (m.path / "step_1" / "b.bin").write_bytes(b"b" * 1000)
        m.flush()
        assert client.get_object(Bucket=m.bucket, Key=m.key("step_1/b.bin"))["Body"].read() == b"b" * 1000
        log = (m.cache_dir / "ckptfs.log").read_text()
        assert log.count("not permitted by the store") == 1
    finally:
        client.delete_bucket_policy(Bucket=m.bucket)
