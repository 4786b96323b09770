"""Smoke test for the SeaweedFS test server itself: multipart upload with per-part CRC32."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import zlib
from pathlib import Path

from tests.support.seaweed import SeaweedServer

MiB = 1 << 20


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_multipart_upload_roundtrip(tmp_path: Path) -> None:
    with SeaweedServer(tmp_path / "s3") as server:
        assert server.endpoint_url.startswith("http://127.0.0.1:")
        assert set(server.env()) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}
        client = server.client()
        bucket = server.make_bucket("smoke")
        assert server.make_bucket("smoke") == "smoke"  # idempotent
        assert "smoke" in [b["Name"] for b in client.list_buckets()["Buckets"]]

        parts_data = [os.urandom(5 * MiB), os.urandom(123_457)]
        key = "dir/ckpt.bin"
        upload = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32")
        parts = []
        for number, data in enumerate(parts_data, start=1):
            resp = client.upload_part(
                Bucket=bucket,
                Key=key,
                UploadId=upload["UploadId"],
                PartNumber=number,
                Body=data,
                ChecksumCRC32=crc32_b64(data),
            )
            parts.append({"PartNumber": number, "ETag": resp["ETag"], "ChecksumCRC32": crc32_b64(data)})
        client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
        )

        whole = b"".join(parts_data)
        assert client.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(whole)
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert hashlib.sha256(body).hexdigest() == hashlib.sha256(whole).hexdigest()
        assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []

        pid = server.pid
        assert pid is not None
    # stopped by the context manager: the whole process group is gone
    assert not server.running()
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        pass
    else:
        os.killpg(pid, signal.SIGKILL)
        raise AssertionError("weed still running after stop()")


def test_a_session_worth_of_buckets_all_take_writes(tmp_path: Path) -> None:
    # every test makes a bucket (a weed collection with its own volume); weed's default number of
    # volume slots (free disk / volume size) ran out after ~40 on a 43 GB-free disk
    buckets = 50
    with SeaweedServer(tmp_path / "s3") as server:
        client = server.client()
        for i in range(buckets):
            name = server.make_bucket(f"many-{i:03d}")
            client.put_object(Bucket=name, Key="k", Body=b"x")
        assert len([b for b in client.list_buckets()["Buckets"] if b["Name"].startswith("many-")]) == buckets
