"""A takeover's HEAD + xxh3 decisions against a real S3 server (SeaweedFS): a file the real drain uploaded is found
durable and not sent again, a file another node wrote after the owner's last change is left as it is (LastModified
as the server keeps it), the rest is uploaded byte-identical (a multipart upload with its parts' CRC32s) with the
metadata the drain writes, and a second run sends nothing. The replica store is a stand-in until the transport's
lands; the node records are real (peers/membership.py) in the same bucket.
"""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio
import xxhash

from ckptfs.cache import Cache
from ckptfs.config import Config, MiB, load_config
from ckptfs.drain import Drainer
from ckptfs.journal import DURABLE, ROOT_INODE, Journal
from ckptfs.metrics import Metrics
from ckptfs.namespace import Namespace
from ckptfs.namespace.keys import Keys
from ckptfs.objects import crc32_b64
from ckptfs.peers.membership import Membership
from ckptfs.peers.takeover import Takeover
from ckptfs.store import Store
from ckptfs.upload import XXH3_META
from tests.support.replicas import hold, replica_store
from tests.unit.test_drain_faults import drain_until
from tests.unit.test_journal import write_file

PART = 5 * MiB
TTL = 3.0
WRITES = ("put_object", "put_object_body", "create_multipart", "upload_part", "complete", "copy", "delete")


def config(tmp_path: Path, bucket: str, endpoint: str) -> Any:
    return load_config(environ={}, overrides=dict(
        bucket=bucket, prefix="p", mountpoint="/m", cache_dir=str(tmp_path), endpoint_url=endpoint, upload_delay=0,
        multipart_threshold=PART, part_size=PART, max_parts_in_flight=3, peer_lease_ttl=TTL))


@pytest.fixture
def store(s3, bucket, monkeypatch) -> Store:  # type: ignore[no-untyped-def]
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return Store(Config(bucket=bucket, endpoint_url=s3.endpoint_url))


def counting(store: Store) -> dict[str, int]:
    """Count the requests that write to the bucket (wrapped on this instance)."""
    counts = {op: 0 for op in WRITES}
    for op in WRITES:
        real = getattr(store, op)

        def wrapped(*args: Any, _real: Any = real, _op: str = op, **kw: Any) -> Any:
            counts[_op] += 1
            return _real(*args, **kw)

        setattr(store, op, wrapped)
    return counts


def member(store: Store, name: str, at: float, cfg: Any) -> Membership:
    clock = lambda: at  # noqa: E731 - a node's clocks, fixed where the test puts them
    m = Membership(cfg, store, lambda path: "p/" + path, name, f"{name}-1", "127.0.0.1:7470", clock=clock, monotonic=clock)

    async def start() -> None:
        await m.announce()
        await m.refresh()

    trio.run(start)
    return m


def test_takeover_skips_what_the_drain_uploaded_and_never_overwrites_a_newer_object(tmp_path: Path, store: Store, bucket: str,
                                                                                    s3: Any) -> None:
    cfg = config(tmp_path, bucket, s3.endpoint_url)
    # the owner's drain got one file out before the node was lost: the real drain, real metadata
    (tmp_path / "a").mkdir()
    ns = Namespace(cfg, Journal(tmp_path / "a" / "journal.sqlite3", bucket, "p"), Cache(tmp_path / "a", 0))
    ns.recover()
    drained = os.urandom(300_000)
    step = ns.tree.mkdir(ROOT_INODE, "step_1", 0o755, 0, 0)
    ino = write_file(ns, step.ino, "drained.pt", drained)
    drained_big = os.urandom(2 * MiB + 1)  # above the drain's in-memory body: a PutObject from the cache file
    ino_big = write_file(ns, step.ino, "drained_big.pt", drained_big)
    drain_until(Drainer(cfg, ns, ns.cache, store, Metrics(lambda: {})),
                lambda: all(ns.journal.get(i).state == DURABLE for i in (ino, ino_big)))  # type: ignore[union-attr]
    written_at = time.time() - 60
    theirs = b"written by another node after the owner's last change"
    store.put_object_body("p/step_1/theirs.pt", theirs, crc32_b64(zlib.crc32(theirs)), {})

    now = time.time()
    member(store, "a", now - 10 * TTL, cfg)
    b = member(store, "b", now, cfg)
    assert b.dead() == ["a"]
    replicas = replica_store(cfg, str(tmp_path / "b"))
    big = os.urandom(2 * PART + 4321)
    hold(replicas, "a", 1, "p/step_1/drained.pt", drained, seq=1, mtime=written_at)
    hold(replicas, "a", 5, "p/step_1/drained_big.pt", drained_big, seq=5, mtime=written_at)
    hold(replicas, "a", 2, "p/step_1/theirs.pt", b"the owner's older bytes", seq=2, mtime=written_at)
    hold(replicas, "a", 3, "p/step_1/big.pt", big, seq=3, mtime=written_at)
    hold(replicas, "a", 4, "p/step_1/.metadata", b"{}", seq=4, mtime=written_at, marker=True)
    counts = counting(store)
    t = Takeover(cfg, store, replicas, b, Keys("p/"))
    [report] = trio.run(t.round)

    assert sorted(report.already_durable) == ["p/step_1/drained.pt", "p/step_1/drained_big.pt"]
    assert report.conflicts == ["p/step_1/theirs.pt"]
    assert sorted(report.uploaded) == ["p/step_1/.metadata", "p/step_1/big.pt"]
    assert counts["upload_part"] == 3 and counts["put_object_body"] == 1 and counts["put_object"] == 0
    for key, data in (("p/step_1/big.pt", big), ("p/step_1/drained.pt", drained), ("p/step_1/theirs.pt", theirs)):
        body, _ = store.get_bytes(key)
        assert xxhash.xxh3_128_hexdigest(body) == xxhash.xxh3_128_hexdigest(data), f"{key} in the bucket differs"
    info = store.head_object("p/step_1/big.pt")
    assert info.metadata.get(XXH3_META) == xxhash.xxh3_128_hexdigest(big)
    # the keys the drain writes (its xxh3 and its provenance); the provenance names the owner's file, the taker as sender
    assert info.metadata.keys() == store.head_object("p/step_1/drained.pt").metadata.keys()
    assert (info.metadata["ckptfs-node"], info.metadata["ckptfs-ino"], info.metadata["ckptfs-by"]) == ("a", "3", "b")

    # the same replicas again (another holder, or this one after a crash before takeover_done): nothing is sent
    before = dict(counts)
    again = replica_store(cfg, str(tmp_path / "again"))
    for e in (1, 3, 4):
        src = {1: drained, 3: big, 4: b"{}"}[e]
        key = {1: "p/step_1/drained.pt", 3: "p/step_1/big.pt", 4: "p/step_1/.metadata"}[e]
        hold(again, "a", e, key, src, seq=e, mtime=written_at, marker=e == 4)
    second = Takeover(cfg, store, again, b, Keys("p/"))
    report2 = trio.run(second.finish, "a")
    assert sorted(report2.already_durable) == ["p/step_1/.metadata", "p/step_1/big.pt", "p/step_1/drained.pt"]
    assert counts == before, "a second run sent something again"

