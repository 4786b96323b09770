"""Encryption settings: key-file checks, and which SSE parameters reach each S3 request (botocore Stubber at the boto3 boundary).

SSE-KMS answers 500 on SeaweedFS, so its request path is checked here; SSE-S3 and SSE-C are also
tested for real in tests/integration/test_security.py.
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import pytest
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

from ckptfs.config import ConfigError, load_config
from ckptfs.objects import AUTH, OTHER, StoreError
from ckptfs.store import Store

BASE = dict(bucket="ckpt", mountpoint="/mnt/ckpt", cache_dir="/var/cache/ckptfs", endpoint_url="http://127.0.0.1:1")
KEY = bytes(range(32))


def key_file(tmp_path: Path, data: bytes = KEY, mode: int = 0o600) -> str:
    p = tmp_path / "sse-c.key"
    p.write_bytes(data)
    os.chmod(p, mode)
    return str(p)


def store(**opts: object) -> tuple[Store, Stubber]:
    s = Store(load_config(environ={}, overrides={**BASE, **opts}))
    stub = Stubber(s.client)
    stub.activate()
    return s, stub


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize("mode, fragment", [(0o644, "chmod 600"), (0o640, "chmod 600"), (0o604, "chmod 600")])
def test_key_file_readable_by_others_is_refused(tmp_path: Path, mode: int, fragment: str) -> None:
    path = key_file(tmp_path, mode=mode)
    with pytest.raises(ConfigError) as e:
        load_config(environ={}, overrides={**BASE, "sse_c_key_file": path})
    msg = str(e.value)
    assert "\n" not in msg and "readable by others" in msg and fragment in msg and path in msg


@pytest.mark.parametrize("data", [b"short", os.urandom(31), base64.b64encode(os.urandom(16))], ids=["short", "31-bytes", "base64-of-16"])
def test_key_file_without_a_256_bit_key_is_refused(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(ConfigError, match="does not hold a 256-bit key"):
        load_config(environ={}, overrides={**BASE, "sse_c_key_file": key_file(tmp_path, data)})


def test_missing_key_file_and_conflicting_modes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot open it"):
        load_config(environ={}, overrides={**BASE, "sse_c_key_file": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="choose one"):
        load_config(environ={}, overrides={**BASE, "sse": "AES256", "sse_c_key_file": key_file(tmp_path)})
    with pytest.raises(ConfigError, match="use \"\""):
        load_config(environ={}, overrides={**BASE, "sse": "aes"})
    with pytest.raises(ConfigError, match="sse_kms_key_id is set"):
        load_config(environ={}, overrides={**BASE, "sse_kms_key_id": "k1"})
    with pytest.raises(ConfigError, match="ca_bundle"):
        load_config(environ={}, overrides={**BASE, "ca_bundle": str(tmp_path / "ca.pem")})


def test_raw_and_base64_keys_are_the_same_key(tmp_path: Path) -> None:
    raw, _ = store(sse_c_key_file=key_file(tmp_path, KEY))
    (tmp_path / "b").mkdir()
    b64, _ = store(sse_c_key_file=key_file(tmp_path / "b", base64.b64encode(KEY) + b"\n"))
    assert raw.enc.customer()["SSECustomerKey"] == b64.enc.customer()["SSECustomerKey"] == KEY


def test_status_and_repr_never_show_the_key(tmp_path: Path) -> None:
    s, _ = store(sse_c_key_file=key_file(tmp_path))
    shown = repr(s.enc) + str(s.enc.describe()) + repr(vars(s.enc))
    for form in (KEY.hex(), base64.b64encode(KEY).decode(), repr(KEY)):
        assert form not in repr(s.enc) + str(s.enc.describe())
    assert s.enc.describe() == {"mode": "SSE-C", "key_file": s.enc.key_file}
    assert "SSE-C" in shown


# ------------------------------------------------------- request parameters
def test_sse_kms_key_id_goes_on_object_creating_requests_only(tmp_path: Path) -> None:
    s, stub = store(sse="aws:kms", sse_kms_key_id="arn:aws:kms:us-east-1:111122223333:key/abcd")
    kms = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "arn:aws:kms:us-east-1:111122223333:key/abcd"}
    stub.add_response("put_object", {"ETag": '"e1"'},
                      {"Bucket": "ckpt", "Key": "a/.m", "Body": b"{}", "ContentLength": 2, "ContentType": "application/json", **kms})
    stub.add_response("create_multipart_upload", {"UploadId": "u1"},
                      {"Bucket": "ckpt", "Key": "a/b", "Metadata": {}, "ChecksumAlgorithm": "CRC32", **kms})
    stub.add_response("copy_object", {"CopyObjectResult": {"ETag": '"e2"'}},
                      {"Bucket": "ckpt", "Key": "a/c", "CopySource": {"Bucket": "ckpt", "Key": "a/b"}, "MetadataDirective": "COPY", **kms})
    # reads carry no SSE header for SSE-S3/KMS (AWS refuses them on GET/HEAD)
    stub.add_response("head_object", {"ContentLength": 1, "ETag": '"e"'}, {"Bucket": "ckpt", "Key": "a/b"})
    stub.add_response("get_object", {"ETag": '"e"', "Body": StreamingBody(io.BytesIO(b"z"), 1)}, {"Bucket": "ckpt", "Key": "a/b", "Range": "bytes=0-0", "IfMatch": '"e"'})
    assert s.put_bytes("a/.m", b"{}") == "e1"
    assert s.create_multipart("a/b", {}) == "u1"
    assert s.copy("a/b", "a/c", 1, 8 << 20, 5 << 20) == "e2"
    assert s.head("a/b")[0] == 1
    assert s.get_range("a/b", "e", 0, 1) == b"z"
    stub.assert_no_pending_responses()
    assert s.enc.describe() == {"mode": "SSE-KMS", "kms_key_id": "arn:aws:kms:us-east-1:111122223333:key/abcd"}


def test_sse_c_headers_on_every_request_that_touches_bytes(tmp_path: Path) -> None:
    s, stub = store(sse_c_key_file=key_file(tmp_path))
    c = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": ANY}
    src = {"CopySourceSSECustomerAlgorithm": "AES256", "CopySourceSSECustomerKey": ANY}
    stub.add_response("upload_part", {"ETag": '"p1"'},
                      {"Bucket": "ckpt", "Key": "k", "UploadId": "u", "PartNumber": 1, "Body": ANY, "ContentLength": 3,
                       "ChecksumCRC32": "x", **c})
    stub.add_response("complete_multipart_upload", {"ETag": '"e"'},
                      {"Bucket": "ckpt", "Key": "k", "UploadId": "u", "MultipartUpload": ANY, **c})
    # a large rename: HEAD of the source, create, UploadPartCopy with both keys, complete
    stub.add_response("head_object", {"ContentLength": 10 << 20, "ETag": '"s"', "Metadata": {}}, {"Bucket": "ckpt", "Key": "src", **c})
    stub.add_response("create_multipart_upload", {"UploadId": "u2"}, {"Bucket": "ckpt", "Key": "dst", "Metadata": {}, **c})
    for n, rng in ((1, "bytes=0-8388607"), (2, "bytes=8388608-10485759")):
        stub.add_response("upload_part_copy", {"CopyPartResult": {"ETag": f'"c{n}"'}},
                          {"Bucket": "ckpt", "Key": "dst", "UploadId": "u2", "PartNumber": n, "CopySource": {"Bucket": "ckpt", "Key": "src"},
                           "CopySourceRange": rng, **c, **src})
    stub.add_response("complete_multipart_upload", {"ETag": '"d"'},
                      {"Bucket": "ckpt", "Key": "dst", "UploadId": "u2", "MultipartUpload": ANY, **c})
    stub.add_response("copy_object", {"CopyObjectResult": {"ETag": '"e3"'}},
                      {"Bucket": "ckpt", "Key": "b", "CopySource": {"Bucket": "ckpt", "Key": "a"}, "MetadataDirective": "COPY", **c, **src})
    (tmp_path / "part").write_bytes(b"abc")
    fd = os.open(tmp_path / "part", os.O_RDONLY)
    try:
        assert s.upload_part("k", "u", 1, fd, 0, 3, "x") == "p1"
    finally:
        os.close(fd)
    assert s.complete("k", "u", [(1, "p1", "x")]) == "e"
    assert s.copy("src", "dst", 10 << 20, 8 << 20, 5 << 20) == "d"
    assert s.copy("a", "b", 10, 8 << 20, 5 << 20) == "e3"
    stub.assert_no_pending_responses()


def test_store_errors_name_the_sse_problem(tmp_path: Path) -> None:
    s, stub = store(sse_c_key_file=key_file(tmp_path))
    stub.add_client_error("upload_part_copy", "NotImplemented", "A header you provided implies functionality that is not implemented",
                          http_status_code=501)
    stub.add_client_error("get_object", "AccessDenied", "Access Denied.", http_status_code=403)
    with pytest.raises(StoreError) as e:
        s._call("UploadPartCopy", s.client.upload_part_copy, Key="k", UploadId="u", PartNumber=1, CopySource={"Bucket": "ckpt", "Key": "s"})
    assert e.value.kind == OTHER and "does not implement UploadPartCopy" in str(e.value)
    with pytest.raises(StoreError) as e:
        s.get_bytes("k")
    assert e.value.kind == AUTH and "another SSE-C key" in str(e.value)
    plain, stub2 = store()
    stub2.add_client_error("get_object", "InvalidArgument",
                           "Requests specifying Server Side Encryption with Customer provided keys must provide the customer key.",
                           http_status_code=400)
    with pytest.raises(StoreError) as e:
        plain.get_bytes("k")
    assert "encrypted with SSE-C" in str(e.value) and "sse_c_key_file" in str(e.value) and "\n" not in str(e.value)


def test_ca_bundle_reaches_the_client_and_tls_stays_verified(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    s = Store(load_config(environ={}, overrides={**BASE, "ca_bundle": str(ca)}))
    assert s.client._endpoint.http_session._verify == str(ca)
    plain = Store(load_config(environ={}, overrides=BASE))
    assert plain.client._endpoint.http_session._verify is not False  # the system's CAs (or AWS_CA_BUNDLE), never off


class _EmptyBody:
    def stream(self, **_: object) -> list[bytes]:
        return [b""]


@pytest.mark.parametrize("opts", [{"sse": "AES256"}, {"sse": "aws:kms", "sse_kms_key_id": "arn:aws:kms:us-east-1:111122223333:key/abcd"},
                                  {"sse_c_key_file": "KEYFILE"}, {}], ids=["sse-s3", "sse-kms", "sse-c", "none"])
def test_signed_puts_carry_the_encryption_headers_boto3_sends(tmp_path: Path, opts: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """store/signed.py sends small PutObjects itself with `create_headers()`: the same SSE headers as boto3's own."""
    from botocore.awsrequest import AWSResponse

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")

    opts = {k: key_file(tmp_path) if v == "KEYFILE" else v for k, v in opts.items()}
    s = Store(load_config(environ={}, overrides={**BASE, **opts}))
    sent: dict[str, str] = {}

    def answer(request: object, **_: object) -> AWSResponse:
        sent.update({k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()})  # type: ignore[attr-defined]
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, _EmptyBody())  # type: ignore[attr-defined]

    s.client.meta.events.register("before-send.s3.PutObject", answer)
    s._put_body_boto3("k", b"abc", "NSRBwg==", {})
    boto3_sse = {k: v for k, v in sent.items() if k.startswith("x-amz-server-side-encryption")}
    assert {k.lower(): v for k, v in s.enc.create_headers().items()} == boto3_sse
    assert bool(boto3_sse) == bool(opts)
