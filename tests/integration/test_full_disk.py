"""A full cache disk is a state, not a crash (issue 34 item 2): on a real small file system (tmpfs) that
another process fills, the mount keeps answering, refuses only what cannot be recorded (ENOSPC, at once
when nothing is left to drain), a mount on it is refused with one line, and when the space comes back
everything carries on by itself with every fsynced byte in the bucket."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ckptfs.journal import JOURNAL_RESERVE
from tests.conftest import Mount, mount_is_dead, sha256_file, wait_for, write_random
from tests.support.smallfs import SmallFs, small_fs  # noqa: F401 (fixture)

MiB = 1 << 20


def spend_the_reserve(m: Mount, disk: SmallFs) -> None:
    """Make journal changes on the full disk until the journal has given its reserve up, then take that room too:
    from here on, a change that needs a new page of the journal cannot be written."""
    reserve = m.cache_dir / "journal.reserve"
    for i in range(5000):  # the journal's WAL may have room of its own at first
        if os.stat(reserve).st_size == 0:
            break
        try:
            (m.path / f"spend-{i}").mkdir()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    assert os.stat(reserve).st_size == 0
    disk.fill()


def test_a_listing_on_a_full_cache_disk_leaves_the_mount_answering(make_mount: Any, small_fs: Any) -> None:
    # issue 34: the cache disk is full while another node writes into a directory this node listed:
    # the daemon died at the next listing (the merge could not be written to the journal)
    m: Mount = make_mount(start=False, cache_min_free=0, metadata_ttl=1, retry_max_backoff=1)
    disk = small_fs(m.cache_dir)
    m.start()
    shared = m.path / "shared"
    shared.mkdir()
    mine = write_random(shared / "mine.bin", 1 * MiB, seed=1)
    m.flush()
    assert os.listdir(shared) == ["mine.bin"]  # listed: this node knows the directory
    disk.fill()
    spend_the_reserve(m, disk)
    client = m.s3.client()
    theirs = {f"other-{i:02d}.bin": f"object {i} from another node".encode() * 50 for i in range(40)}
    for name, body in theirs.items():
        client.put_object(Bucket=m.bucket, Key=m.key(f"shared/{name}"), Body=body)
    time.sleep(2.5)  # past metadata_ttl: the next listdir lists the bucket again
    names = os.listdir(shared)  # the merge cannot be recorded: what this node knows, and the mount stays up
    assert "mine.bin" in names
    assert not mount_is_dead(m.path)
    assert sha256_file(shared / "mine.bin") == mine  # reads work on the full disk
    st = m.status()
    assert st["stale_directories"] >= 1
    # the other process frees its space: the listing is retried in the background and lands, no restart
    disk.empty()
    wait_for("the other node's objects in the listing", lambda: set(theirs) <= set(os.listdir(shared)), timeout=120)
    for name, body in list(theirs.items())[:3]:
        assert (shared / name).read_bytes() == body
    after = write_random(shared / "after.bin", 2 * MiB, seed=2)
    m.flush()
    assert m.object_sha256("shared/mine.bin") == mine
    assert m.object_sha256("shared/after.bin") == after
    wait_for("the journal's reserve taken back", lambda: os.stat(m.cache_dir / "journal.reserve").st_size == JOURNAL_RESERVE)


def assert_one_line_refusal(proc: Any, cache_dir: Path) -> None:
    out = (proc.stderr + proc.stdout).strip()
    assert proc.returncode != 0, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert f"cache directory {cache_dir}'s file system is full" in out and "free space on it" in out, out


@pytest.mark.one_transport
def test_a_mount_on_a_full_cache_disk_is_refused_with_one_line(make_mount: Any, small_fs: Any) -> None:
    m: Mount = make_mount(start=False)
    disk = small_fs(m.cache_dir)
    disk.fill()
    # a cache directory never used: not even the lock file can be written
    assert_one_line_refusal(m.cli(*m.mount_args(), timeout=120), m.cache_dir)
    assert not os.path.ismount(m.path)
    # one used before (lock file, journal and its reserve there), then filled by someone else
    disk.empty()
    m.start()
    m.stop()
    os.unlink(m.cache_dir / "journal.reserve")
    disk.fill()
    assert_one_line_refusal(m.cli(*m.mount_args(), timeout=120), m.cache_dir)
    assert not os.path.ismount(m.path)
    # the space is back: the same command mounts
    disk.empty()
    m.start()
    digest = write_random(m.path / "ok.bin", 1 * MiB, seed=3)
    m.flush()
    assert m.object_sha256("ok.bin") == digest


def test_a_write_on_a_full_disk_with_nothing_to_drain_fails_at_once_and_works_once_space_returns(make_mount: Any, small_fs: Any) -> None:
    # write_stall_timeout 600: a writer that waited for a drain with nothing to drain would hang until the test's
    # timeout; the outcome that tells "at once" is the daemon's own count of writes that waited (write_stalls_total)
    m: Mount = make_mount(start=False, cache_min_free="16MiB", write_stall_timeout=600)
    disk = small_fs(m.cache_dir)
    m.start()
    # nearly full: less free than cache_min_free (the journal still has room); nothing to drain or evict
    disk.fill(leave=8 * MiB)

    def overflow() -> int:
        try:
            write_random(m.path / "overflow.bin", 32 * MiB, seed=5)
        except OSError as e:
            return e.errno or 0
        return 0

    assert overflow() == errno.ENOSPC
    st = m.status()
    assert st["enospc_total"] >= 1 and st["stalled_writers"] == 0
    assert st["write_stalls_total"] == 0, st  # refused without waiting for a drain that could free nothing
    assert not mount_is_dead(m.path)
    os.unlink(m.path / "overflow.bin")
    # the other process frees its space: writes work again without a restart, and reach the bucket intact
    disk.empty()
    # the overflow's cache copy goes at its RELEASE, which the kernel may send after close() returned: wait for
    # the space (3 x 8 MiB + cache_min_free), not for a time. The daemon's disk sample may still say full: the
    # first write below is refused at once only if a fresh look at the disk says so too (Space.when_room).
    wait_for("the unlinked overflow file's cache copy to go", lambda: disk.free() >= 48 * MiB, timeout=60)
    written = {f"after{i}.bin": write_random(m.path / f"after{i}.bin", 8 * MiB, seed=10 + i) for i in range(3)}
    m.flush()
    for name, digest in written.items():
        assert m.object_sha256(name) == digest
        assert sha256_file(m.path / name) == digest
    assert "overflow.bin" not in {k.rsplit("/", 1)[-1] for k in m.keys()}
