"""Small PutObjects signed by ckptfs (store.SignedPut) on a real SeaweedFS: the bytes, metadata and encryption
land as boto3's would, keys of any characters, and failures read as boto3's did (the drain decides on them)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Config
from gateway.objects import AUTH, NETWORK, PRECONDITION, StoreError, crc32_b64
from gateway.store import Store
from tests.support.seaweed import SeaweedServer, free_port

KEYS = ["plain/a.bin", "odd/sp ace+plus%pct~tilde=eq&amp/é ü 漢.bin", "deep/x/y/z/ckpt.pt", "top.bin"]


def make_store(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Store:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return Store(Config(bucket=bucket, endpoint_url=s3.endpoint_url, **options))


def put(store: Store, key: str, body: bytes) -> str:
    return store.put_object_body(key, body, crc32_b64(zlib.crc32(body)), {"xxh3": hashlib.sha256(body).hexdigest()[:32]})


def test_after_the_first_small_put_ckptfs_signs_them_and_every_byte_lands(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(s3, bucket, monkeypatch)
    assert store._signed is None
    bodies = {key: os.urandom(1 + i * 40_000) for i, key in enumerate(KEYS)}
    bodies["empty.bin"] = b""
    etags = {key: put(store, key, body) for key, body in bodies.items()}
    assert store._signed is not None, "the first PutObject did not set up the signed path"
    assert store._signed.base_url == f"{s3.endpoint_url}/{bucket}"
    client = s3.client()
    for key, body in bodies.items():
        got = client.get_object(Bucket=bucket, Key=key)
        assert got["Body"].read() == body, key
        assert got["Metadata"] == {"xxh3": hashlib.sha256(body).hexdigest()[:32]}, key
        assert etags[key] == hashlib.md5(body).hexdigest() == got["ETag"].strip('"'), key
    listed = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert listed == set(bodies)


def test_many_first_puts_at_once_still_set_up_the_signed_path(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain starts with many PutObjects in flight: each thread's request fires the same botocore event."""
    store = make_store(s3, bucket, monkeypatch)
    bodies = {f"burst/{i:03d}.bin": os.urandom(2000 + i) for i in range(48)}
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: put(store, *kv), bodies.items()))
    assert store._signed is not None
    put(store, "after.bin", b"after")
    client = s3.client()
    for key, body in {**bodies, "after.bin": b"after"}.items():
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == body, key


def test_a_body_that_does_not_match_its_crc32_is_refused(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain relies on it: bytes changed after the CRC32 was computed must not become the object."""
    store = make_store(s3, bucket, monkeypatch)
    put(store, "first.bin", b"x" * 100)
    body = os.urandom(5000)
    with pytest.raises(StoreError):
        store.put_object_body("bad.bin", body, crc32_b64(zlib.crc32(body) ^ 1), {})
    assert "Contents" not in s3.client().list_objects_v2(Bucket=bucket, Prefix="bad.bin")


def test_failures_read_as_boto3s_did(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(s3, bucket, monkeypatch)
    put(store, "first.bin", b"x")
    signed = store._signed
    assert signed is not None
    good = signed._credentials
    signed._credentials = type(good)(good.access_key, "not-the-secret")
    with pytest.raises(StoreError) as e:
        put(store, "denied.bin", b"y" * 10)
    assert e.value.kind == AUTH and "rejected the credentials" in str(e.value) and "not-the-secret" not in str(e.value)
    signed._credentials = good
    for key in ("k" * 2000, "a/../../b"):  # refused by the store: the same StoreError as through boto3
        errors = []
        for send in (store._put_body_boto3, store.put_object_body):
            with pytest.raises(StoreError) as e:
                send(key, b"z", crc32_b64(zlib.crc32(b"z")), {})
            errors.append((e.value.kind, str(e.value)))
        assert errors[0] == errors[1], key
    base = signed.base_url
    signed.base_url = f"http://127.0.0.1:{free_port()}/{bucket}"
    with pytest.raises(StoreError) as e:
        put(store, "nowhere.bin", b"z")
    assert e.value.kind == NETWORK and "cannot reach the object store" in str(e.value)
    signed.base_url = base
    put(store, "again.bin", b"z")


def test_server_side_encryption_headers_go_with_signed_puts(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    sse_s3 = make_store(s3, bucket, monkeypatch, sse="AES256")
    for key in ("s3/one.bin", "s3/two.bin"):
        put(sse_s3, key, os.urandom(3000))
    assert sse_s3._signed is not None
    client = s3.client()
    assert client.head_object(Bucket=bucket, Key="s3/two.bin").get("ServerSideEncryption") == "AES256"

    key = os.urandom(32)
    key_file = tmp_path / "sse-c.key"
    key_file.write_bytes(base64.b64encode(key))
    key_file.chmod(0o600)
    sse_c = make_store(s3, bucket, monkeypatch, sse_c_key_file=str(key_file))
    bodies = {k: os.urandom(7000) for k in ("c/one.bin", "c/two.bin")}
    for k, body in bodies.items():
        put(sse_c, k, body)
    assert sse_c._signed is not None
    for k, body in bodies.items():
        got = client.get_object(Bucket=bucket, Key=k, SSECustomerAlgorithm="AES256", SSECustomerKey=key)
        assert got["Body"].read() == body
        with pytest.raises(Exception):  # without the key the store refuses it: it was stored encrypted with ours
            client.get_object(Bucket=bucket, Key=k)


class _Moved(http.server.BaseHTTPRequestHandler):
    """What S3 answers a request sent to another region's endpoint."""

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"<Error><Code>PermanentRedirect</Code><Message>use the other endpoint</Message></Error>"
        self.send_response(301)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT  # noqa: N815 - a listing sent there (test_signed_list.py)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_bucket_answered_elsewhere_is_learnt_again_through_boto3(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(s3, bucket, monkeypatch)
    put(store, "first.bin", b"1")
    assert store._signed is not None
    moved = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Moved)
    threading.Thread(target=moved.serve_forever, daemon=True).start()
    try:
        store._signed.base_url = f"http://127.0.0.1:{moved.server_address[1]}/{bucket}"
        body = os.urandom(3000)
        put(store, "moved.bin", body)  # refused there, sent by boto3 to the endpoint its rules choose
    finally:
        moved.shutdown()
        moved.server_close()
    assert s3.client().get_object(Bucket=bucket, Key="moved.bin")["Body"].read() == body
    assert store._signed is not None and store._signed.base_url == f"{s3.endpoint_url}/{bucket}"


def test_conditional_puts_go_signed_and_are_judged_as_boto3s(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `durability = peer` every PutObject of the drain is conditional (drainfence.py): they take the signed path
    too, and a condition not met is PRECONDITION on both paths, the object left as it was."""
    store = make_store(s3, bucket, monkeypatch)
    put(store, "first.bin", b"1")
    assert store._signed is not None
    sent = []
    real = store._signed.put
    monkeypatch.setattr(store._signed, "put", lambda *a: sent.append(a[0]) or real(*a))
    body = os.urandom(3000)
    crc = crc32_b64(zlib.crc32(body))
    etag = store.put_object_body("c.bin", body, crc, {}, if_none_match=True)
    assert sent == ["c.bin"], "a conditional PutObject went through boto3"
    client = s3.client()
    outcomes = []
    for signed in (False, True):
        kinds = []
        for if_match, if_none_match in ((None, True), ("0" * 32, False), (etag, False)):
            try:
                if signed:
                    store.put_object_body("c.bin", body, crc, {}, if_match=if_match, if_none_match=if_none_match)
                else:
                    store._put_body_boto3("c.bin", body, crc, {}, if_match, if_none_match)
                kinds.append("written")
            except StoreError as e:
                kinds.append(e.kind)
        outcomes.append(kinds)
    assert outcomes[0] == outcomes[1] == [PRECONDITION, PRECONDITION, "written"]
    assert client.get_object(Bucket=bucket, Key="c.bin")["Body"].read() == body


def test_under_peer_durability_the_fenced_first_put_sets_up_the_signed_path(s3: SeaweedServer, bucket: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's PutObjects go by the client without retries there (Store._writes_once): its request is the one learnt."""
    store = make_store(s3, bucket, monkeypatch, durability="peer")
    assert store._writes_once is not None
    body = os.urandom(2000)
    store.put_object_body("p/first.bin", body, crc32_b64(zlib.crc32(body)), {}, if_none_match=True)
    assert store._signed is not None and store._signed.base_url == f"{s3.endpoint_url}/{bucket}"
    assert store._signed.attempts == 1  # sent once per call, as the fenced client's: the drain retries behind its lease
    put(store, "p/second.bin", b"2")
    assert s3.client().get_object(Bucket=bucket, Key="p/second.bin")["Body"].read() == b"2"


@pytest.mark.parametrize("sign", [True, False])
def test_sign_payload_over_http_decides_whether_bodies_are_hashed_into_the_signature(
        s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sign: bool) -> None:
    """`sign_payload_over_http = false`: small PutObjects (signed here) and parts (boto3's) go UNSIGNED-PAYLOAD over
    plain http, and land whole all the same; by default each carries its body's SHA-256."""
    store = make_store(s3, bucket, monkeypatch, sign_payload_over_http=sign)
    seen: list[str] = []

    def header(request: Any) -> str:
        value = request.headers.get("X-Amz-Content-SHA256", "")
        return value.decode() if isinstance(value, bytes) else value

    def capture(request: Any, **_: Any) -> None:
        seen.append(header(request))

    store.client.meta.events.register("before-send.s3", capture)
    small = {f"s/{i}.bin": os.urandom(5000 + i) for i in range(3)}
    for key, body in small.items():
        put(store, key, body)
    assert store._signed is not None
    http = store._signed._http
    real_send = http.send
    monkeypatch.setattr(http, "send", lambda request: seen.append(header(request)) or real_send(request))
    put(store, "s/last.bin", small["s/0.bin"])
    part = os.urandom(5 << 20)
    path = tmp_path / "part.bin"
    path.write_bytes(part + part)
    fd = os.open(path, os.O_RDONLY)
    try:
        upload = store.create_multipart("big.bin", {})
        parts = [(n, store.upload_part("big.bin", upload, n, fd, (n - 1) * len(part), len(part), crc32_b64(zlib.crc32(part))),
                  crc32_b64(zlib.crc32(part))) for n in (1, 2)]
        store.complete("big.bin", upload, parts)
    finally:
        os.close(fd)
    bodies = [h for h in seen if h and h != hashlib.sha256(b"").hexdigest()]  # GETs and empty bodies aside
    assert len(bodies) >= 4  # the small PutObjects (boto3's first, then signed) and the two parts
    if sign:
        assert "UNSIGNED-PAYLOAD" not in bodies and hashlib.sha256(part).hexdigest() in bodies
    else:
        assert set(bodies) == {"UNSIGNED-PAYLOAD"}
    client = s3.client()
    assert client.get_object(Bucket=bucket, Key="big.bin")["Body"].read() == part + part
    for key, body in {**small, "s/last.bin": small["s/0.bin"]}.items():
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == body
