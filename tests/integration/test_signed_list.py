"""Listings signed by ckptfs (store.SignedList) on a real SeaweedFS: every page, name, size, ETag and time as boto3
reads them, keys of any characters, and failures read as boto3's did (the listings service decides on them)."""

from __future__ import annotations

import http.server
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gateway.objects import AUTH, NETWORK, NO_BUCKET, StoreError
from gateway.store import Store, _boto3_page
from tests.integration.test_signed_put import KEYS, _Moved, make_store
from tests.support.seaweed import SeaweedServer, free_port


def boto3_listing(store: Store, prefix: str, recursive: bool) -> tuple[list[str], list[tuple[str, int, str, float, str]]]:
    """The same listing read through boto3 alone, page after page."""
    dirs: list[str] = []
    objects: list[tuple[str, int, str, float, str]] = []
    kw: dict[str, Any] = {"Bucket": store.bucket, "Prefix": prefix, **({} if recursive else {"Delimiter": "/"})}
    while True:
        page = _boto3_page(store.client.list_objects_v2(**kw))
        dirs += page.prefixes
        objects += page.objects
        if page.next_token is None:
            return dirs, objects
        kw["ContinuationToken"] = page.next_token


def as_listed(store: Store, prefix: str, recursive: bool) -> tuple[list[str], list[tuple[str, int, str, float, str]]]:
    listing = store.list(prefix, recursive=recursive)
    return ([prefix + d + "/" for d in listing.dirs],
            [(prefix + o.name, o.size, o.etag, o.mtime, o.storage_class) for o in listing.objects])


def test_after_the_first_page_ckptfs_signs_listings_and_reads_them_as_boto3(s3: SeaweedServer, bucket: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    client = s3.client()
    keys = [f"many/f{i:05d}.bin" for i in range(2500)] + [f"many/{k}" for k in KEYS] + ["many/sub/deeper/x.bin", "many/sub2/y"]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=k.encode() * 3), keys))
    store = make_store(s3, bucket, monkeypatch)
    assert store._lister is None
    store.list("many/")
    assert store._lister is not None, "the first listing did not set up the signed path"
    assert store._lister.url == f"{s3.endpoint_url}/{bucket}"
    pages = []
    store.list("many/", on_page=lambda: pages.append(1))
    assert len(pages) == 3, "2,500 keys and more: three pages of 1,000, each one reported"
    for recursive in (False, True):
        dirs, objects = as_listed(store, "many/", recursive)
        want_dirs, want_objects = boto3_listing(store, "many/", recursive)
        assert dirs == want_dirs and objects == want_objects, f"recursive={recursive}"
    names = {o.name for o in store.list("many/").objects}
    assert names == {k[len("many/"):] for k in keys if "/" not in k[len("many/"):]}, "a key of odd characters came back changed"
    assert {d for d in store.list("many/").dirs} == {"sub", "sub2", "odd", "deep", "plain"}
    etags = {o.name: o.etag for o in store.list("many/").objects}
    assert etags["f00007.bin"] == client.head_object(Bucket=bucket, Key="many/f00007.bin")["ETag"].strip('"')


def test_an_empty_directory_marker_and_an_empty_prefix_list_alike(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = s3.client()
    client.put_object(Bucket=bucket, Key="d/", Body=b"")
    client.put_object(Bucket=bucket, Key="d/a", Body=b"a")
    store = make_store(s3, bucket, monkeypatch)
    store.list("")
    assert store._lister is not None
    listing = store.list("d/")
    assert listing.marker and [o.name for o in listing.objects] == ["a"]
    assert store.list("nothing-here/").objects == [] and not store.list("nothing-here/").marker
    assert as_listed(store, "", False) == boto3_listing(store, "", False)


def test_listing_failures_read_as_boto3s_did(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(s3, bucket, monkeypatch)
    store.list("")
    lister = store._lister
    assert lister is not None
    good = lister._credentials
    lister._credentials = type(good)(good.access_key, "not-the-secret")
    with pytest.raises(StoreError) as e:
        store.list("")
    assert e.value.kind == AUTH and "rejected the credentials" in str(e.value) and "not-the-secret" not in str(e.value)
    lister._credentials = good
    url = lister.url
    lister.url = f"{s3.endpoint_url}/no-such-bucket-{free_port()}"
    with pytest.raises(StoreError) as e:
        store.list("")
    assert e.value.kind == NO_BUCKET
    lister.url = f"http://127.0.0.1:{free_port()}/{bucket}"
    with pytest.raises(StoreError) as e:
        store.list("")
    assert e.value.kind == NETWORK and "cannot reach the object store" in str(e.value)
    lister.url = url
    store.list("")


def test_a_bucket_listed_elsewhere_is_learnt_again_through_boto3(s3: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s3.client().put_object(Bucket=bucket, Key="k", Body=b"v")
    store = make_store(s3, bucket, monkeypatch)
    store.list("")
    assert store._lister is not None
    moved = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Moved)
    threading.Thread(target=moved.serve_forever, daemon=True).start()
    try:
        store._lister.url = f"http://127.0.0.1:{moved.server_address[1]}/{bucket}"
        assert [o.name for o in store.list("").objects] == ["k"]  # refused there, listed by boto3 where its rules say
    finally:
        moved.shutdown()
        moved.server_close()
    assert store._lister is not None and store._lister.url == f"{s3.endpoint_url}/{bucket}"
