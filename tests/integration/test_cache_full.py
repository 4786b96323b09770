"""A full cache: writers are slowed, then refused with ENOSPC; clean copies are evicted first; nothing acknowledged is lost."""

from __future__ import annotations

import concurrent.futures
import errno
import os
import random
import time

import pytest

from ckptfs.fs import ATTR_TIMEOUT
from tests.conftest import Mount, sha256_file, wait_for, write_random
from tests.support.faultproxy import FaultProxy

MiB = 1 << 20


def test_full_of_dirty_data_gives_enospc_then_recovers(make_mount) -> None:  # type: ignore[no-untyped-def]
    # nothing drains on its own: the dirty data can only pile up
    m: Mount = make_mount(cache_capacity="40MiB", cache_min_free=0, upload_delay=3600, write_stall_timeout=2)
    digests = {f"s{i}.bin": write_random(m.path / f"s{i}.bin", 12 * MiB, seed=i) for i in range(3)}
    with pytest.raises(OSError) as e:
        write_random(m.path / "overflow.bin", 12 * MiB, seed=9)
    assert e.value.errno == errno.ENOSPC
    st = m.status()  # the daemon is still up and says why
    assert st["enospc_total"] >= 1 and st["write_stalls_total"] >= 1
    assert st["dirty_bytes"] <= 40 * MiB
    os.unlink(m.path / "overflow.bin")
    # what was acknowledged is intact, and drains
    m.flush()
    for name, digest in digests.items():
        assert m.object_sha256(name) == digest
        assert sha256_file(m.path / name) == digest
    # now the durable copies are clean: they are evicted to make room, and a write succeeds
    fresh = write_random(m.path / "fresh.bin", 30 * MiB, seed=10)
    st = m.status()
    assert st["evicted_files_total"] >= 2
    assert st["cache_used_bytes"] <= 40 * MiB
    # 30 MiB dirty + a 12 MiB fetch do not fit: the reader gets ENOSPC, not a dirty file evicted
    evicted = [n for n in digests if n != "s2.bin"][0]
    with pytest.raises(OSError) as e:
        (m.path / evicted).read_bytes()
    assert e.value.errno == errno.ENOSPC
    m.flush()
    assert m.object_sha256("fresh.bin") == fresh
    # once fresh.bin is durable it may be evicted in turn: every file reads back identical
    for name, digest in digests.items():
        assert sha256_file(m.path / name) == digest
    assert sha256_file(m.path / "fresh.bin") == fresh


def test_writers_wait_for_the_drain_instead_of_failing(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    # the store refuses every connection until a writer waits: whatever the speeds, the drain cannot keep up
    m: Mount = make_mount(endpoint_url=proxy.url, cache_capacity="40MiB", cache_min_free=0, upload_delay=0.1,
                          write_stall_timeout=300, retry_max_backoff=1)
    proxy.set_mode("refuse")
    digests: dict[str, str] = {}

    def writer() -> None:
        for i in range(6):  # 72 MiB through a 40 MiB cache
            digests[f"c{i}.bin"] = write_random(m.path / f"c{i}.bin", 12 * MiB, seed=100 + i)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        done = pool.submit(writer)
        wait_for("a writer waiting for the drain", lambda: m.status()["stalled_writers"] >= 1 or done.done())
        assert not done.done(), done.exception()  # 72 MiB cannot fit without the drain
        proxy.set_mode("pass")  # the drain makes room, the writer goes on
        done.result()
    st = m.status()
    assert st["write_stalls_total"] >= 1
    assert st["enospc_total"] == 0
    m.flush()
    for name, digest in digests.items():
        assert m.object_sha256(name) == digest
    # every file is still readable, evicted or not
    name = random.Random(1).choice(sorted(digests))
    assert sha256_file(m.path / name) == digests[name]


def test_corrupted_object_is_not_served(make_mount) -> None:  # type: ignore[no-untyped-def]
    # metadata_ttl=0: every lookup lists the bucket, so the new ETag is seen at once
    m: Mount = make_mount(cache_capacity="20MiB", cache_min_free=0, metadata_ttl=0)
    digest = write_random(m.path / "victim.bin", 12 * MiB, seed=200)
    m.flush()
    # corrupt the object behind the gateway's back: other bytes, same size, the old checksum kept
    stored = m.head("victim.bin")["Metadata"]
    # let the kernel's entry for the name expire, then look it up again: for the next ATTR_TIMEOUT
    # the kernel opens it without a lookup, so only open's own check can see the change below
    time.sleep(ATTR_TIMEOUT * 1.5)
    (m.path / "victim.bin").stat()
    m.s3.client().put_object(Bucket=m.bucket, Key=m.key("victim.bin"), Body=os.urandom(12 * MiB), Metadata=stored)
    # open lists again and sees a new ETag: the cached copy is dropped, the read fetches and checks
    with pytest.raises(OSError) as e:
        (m.path / "victim.bin").read_bytes()
    assert e.value.errno == errno.EIO
    st = m.status()
    assert st["remote_changed_total"] == 1
    assert st["checksum_mismatches_total"] == 1
    assert digest  # the original bytes are gone from the bucket: refusing is all that is left
