"""The fetcher's fault handling against the in-memory store (tests/support/memstore.py): a file only in the
bucket read into the cache while the store fails, hangs, or has the object replaced. What a reader must see:
the object's bytes, or EIO, never bytes of two versions, and the daemon goes on.
"""

from __future__ import annotations

import errno
import os
import time
import zlib
from pathlib import Path

import trio
import xxhash

from ckptfs.cache import Cache
from ckptfs.config import KiB, load_config
from ckptfs.fetch import Fetcher
from ckptfs.journal import ROOT_INODE, Journal
from ckptfs.namespace import Namespace
from ckptfs.objects import SERVER, Listing, RemoteObject, crc32_b64
from tests.support.memstore import MemoryStore

RANGE = 64 * KiB


def setup(tmp_path: Path, data: bytes, **opts: object) -> tuple[Namespace, MemoryStore, Fetcher, int]:
    """A node that knows `f.bin` from a listing only (another node wrote it); its Fetcher over a MemoryStore."""
    cfg = load_config(environ={}, overrides=dict(bucket="ckpt", prefix="p", mountpoint="/m", cache_dir=str(tmp_path),
                                                 read_range_size=RANGE, read_range_max_size=RANGE, read_concurrency=2, **opts))
    ns = Namespace(cfg, Journal(tmp_path / "journal.sqlite3", "ckpt", "p"), Cache(tmp_path, 0))
    ns.recover()
    store = MemoryStore()
    etag = store.put_object_body("p/f.bin", data, crc32_b64(zlib.crc32(data)), {"xxh3": xxhash.xxh3_128_hexdigest(data)})
    ns.merge.merge(ROOT_INODE, time.time(), Listing([], [RemoteObject("f.bin", len(data), etag, 1.0)], False))
    row = ns.journal.lookup(ROOT_INODE, "f.bin")
    assert row is not None and not row.cached
    return ns, store, Fetcher(cfg, ns, store), row.ino


def read_all(fetcher: Fetcher, ino: int) -> int:
    """Read the whole file in through the fetcher, as an open and a read to the end do; the errno, 0 if it worked."""

    async def main() -> int:
        async with trio.open_nursery() as nursery:
            await nursery.start(fetcher.run)
            try:
                with trio.fail_after(60):
                    await fetcher.ensure_local(ino)
                return 0
            except OSError as e:
                return e.errno or -1
            finally:
                nursery.cancel_scope.cancel()

    return trio.run(main)


def test_a_transient_store_error_on_a_range_is_retried_and_the_copy_is_the_object(tmp_path: Path) -> None:
    data = os.urandom(5 * RANGE + 3)
    ns, store, fetcher, ino = setup(tmp_path, data)
    store.fail("read_range", SERVER, times=1)
    assert read_all(fetcher, ino) == 0
    assert ns.cache.path(ino).read_bytes() == data and ns.journal.get(ino).cached == 1  # type: ignore[union-attr]
    assert len(store.calls["read_range"]) == 6 + 1  # six ranges, one of them twice
    assert fetcher.read_errors_total == 0


def test_an_object_replaced_while_it_is_read_gives_eio_and_leaves_no_copy(tmp_path: Path) -> None:
    data = os.urandom(4 * RANGE)
    ns, store, fetcher, ino = setup(tmp_path, data)
    store.objects["p/f.bin"].etag = "replaced-by-another-node"  # every range read with If-Match fails: CHANGED
    assert read_all(fetcher, ino) == errno.EIO
    assert fetcher.read_errors_total == 1 and not ns.cache.path(ino).exists()
    assert ns.journal.get(ino).cached == 0  # type: ignore[union-attr]  # the next open tries again


def test_bytes_that_do_not_match_the_objects_digest_are_never_served(tmp_path: Path) -> None:
    data = os.urandom(3 * RANGE)
    ns, store, fetcher, ino = setup(tmp_path, data)
    store.objects["p/f.bin"].body = data[:-1] + bytes([data[-1] ^ 1])  # the store hands back a flipped bit
    assert read_all(fetcher, ino) == errno.EIO
    assert fetcher.checksum_mismatches_total == 1 and not ns.cache.path(ino).exists()


def test_a_hung_range_fails_the_read_after_read_range_timeout_and_the_next_read_works(tmp_path: Path) -> None:
    data = os.urandom(2 * RANGE)
    ns, store, fetcher, ino = setup(tmp_path, data, read_range_timeout=0.5)
    store.hang("read_range")
    try:
        assert read_all(fetcher, ino) == errno.EIO
        assert fetcher.read_errors_total == 1
    finally:
        store.release()
    assert read_all(fetcher, ino) == 0 and ns.cache.path(ino).read_bytes() == data
