"""One namespace across nodes: two daemons (two mount points, two cache dirs) on one bucket."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.conftest import Mount, mount_is_dead, sha256_file, wait_for, write_random

MiB = 1 << 20


@pytest.fixture
def two(make_mount) -> tuple[Mount, Mount]:  # type: ignore[no-untyped-def]
    # B lists on every lookup, so what A made durable is visible at once, without sleeping out a TTL
    a = make_mount("a")
    b = make_mount("b", metadata_ttl=0)
    return a, b


def test_written_on_a_reads_identical_on_b(two: tuple[Mount, Mount]) -> None:
    a, b = two
    (a.path / "step_1").mkdir()
    digests = {
        "step_1/small.bin": write_random(a.path / "step_1/small.bin", 3 * MiB + 17, seed=1),
        "step_1/big.bin": write_random(a.path / "step_1/big.bin", 40 * MiB + 5, seed=2),  # multipart on A
        "top.bin": write_random(a.path / "top.bin", 0, seed=3),
    }
    a.flush()
    assert sorted(os.listdir(b.path)) == ["step_1", "top.bin"]
    assert sorted(os.listdir(b.path / "step_1")) == ["big.bin", "small.bin"]
    for rel, digest in digests.items():
        assert os.stat(b.path / rel).st_size == os.stat(a.path / rel).st_size
        assert os.getxattr(b.path / rel, "user.ckptfs.state") == b"durable"
        assert sha256_file(b.path / rel) == digest
    st = b.status()
    assert st["fetched_files_total"] == 3
    assert st["fetched_bytes_total"] == 43 * MiB + 22
    assert st["dirty_files"] == 0 and st["uploaded_bytes_total"] == 0
    # B verified against the checksum A stored with the object
    assert os.getxattr(b.path / "step_1/big.bin", "user.ckptfs.xxh3") == os.getxattr(a.path / "step_1/big.bin", "user.ckptfs.xxh3")
    # a second read is served from B's cache
    assert sha256_file(b.path / "step_1/big.bin") == digests["step_1/big.bin"]
    assert b.status()["fetched_bytes_total"] == st["fetched_bytes_total"]


def test_objects_from_other_tools_are_readable(two: tuple[Mount, Mount]) -> None:
    _, b = two
    body = os.urandom(5 * MiB + 3)
    b.s3.client().put_object(Bucket=b.bucket, Key=b.key("by-s5cmd/model.safetensors"), Body=body)
    assert (b.path / "by-s5cmd/model.safetensors").read_bytes() == body


def test_rename_and_delete_on_a_seen_on_b(two: tuple[Mount, Mount]) -> None:
    a, b = two
    (a.path / "d").mkdir()
    keep = write_random(a.path / "f1.bin", 20 * MiB, seed=10)
    write_random(a.path / "f2.bin", 2 * MiB, seed=11)
    inner = write_random(a.path / "d/shard.bin", 6 * MiB, seed=12)
    (a.path / "empty").mkdir()
    a.flush()
    assert sorted(os.listdir(b.path)) == ["d", "empty", "f1.bin", "f2.bin"]
    uploaded = a.status()["uploaded_bytes_total"]

    os.rename(a.path / "f1.bin", a.path / "g1.bin")  # durable: copied inside the store, not uploaded again
    os.unlink(a.path / "f2.bin")
    os.rename(a.path / "d", a.path / "e")
    os.rmdir(a.path / "empty")
    a.flush()

    assert a.status()["uploaded_bytes_total"] == uploaded
    assert a.keys() == sorted([a.key("g1.bin"), a.key("e/shard.bin")])
    assert a.object_sha256("g1.bin") == keep
    assert sorted(os.listdir(b.path)) == ["e", "g1.bin"]
    # right after the listing that removed them: the kernel was told to forget the names (not left to time out)
    assert not (b.path / "f1.bin").exists() and not (b.path / "d").exists()
    assert sha256_file(b.path / "g1.bin") == keep
    assert sha256_file(b.path / "e/shard.bin") == inner
    assert b.status()["remote_removed_total"] >= 3


def test_names_deleted_or_replaced_elsewhere_are_forgotten_by_the_kernel_at_once(two: tuple[Mount, Mount]) -> None:
    """A name the kernel holds (entry and attributes, cached 1 s) is gone, or has the new object's size, as soon as a
    listing on b shows the bucket's change: `stat` agrees with `ls`. The kernel is made to hold them just before the
    change (a stat each), which is done straight in the bucket, so everything until the check takes a fraction of the
    kernel's timeout: without the invalidation the stats below answer from the kernel's cache."""
    a, b = two
    write_random(a.path / "gone.bin", 1 * MiB, seed=20)
    write_random(a.path / "replaced.bin", 1 * MiB, seed=22)
    a.flush()
    assert sorted(os.listdir(b.path)) == ["gone.bin", "replaced.bin"]
    client = b.s3.client()
    new_body = os.urandom(3 * MiB + 5)
    for rel in ("gone.bin", "replaced.bin"):  # the kernel now holds each name and its attributes
        os.stat(b.path / rel)
    client.delete_object(Bucket=b.bucket, Key=b.key("gone.bin"))
    client.put_object(Bucket=b.bucket, Key=b.key("replaced.bin"), Body=new_body)
    assert os.listdir(b.path) == ["replaced.bin"]  # b's listing (metadata_ttl = 0) merges the change
    with pytest.raises(FileNotFoundError):
        os.stat(b.path / "gone.bin")
    assert os.stat(b.path / "replaced.bin").st_size == len(new_body)
    assert (b.path / "replaced.bin").read_bytes() == new_body
    st = b.status()
    assert st["remote_removed_total"] >= 1 and st["remote_changed_total"] >= 1


def test_empty_directory_survives_as_marker(two: tuple[Mount, Mount]) -> None:
    a, b = two
    (a.path / "runs/empty").mkdir(parents=True)
    a.flush()
    assert a.keys() == [a.key("runs/empty/")]
    assert (b.path / "runs/empty").is_dir() and os.listdir(b.path / "runs/empty") == []
    # a file in it makes the marker moot; removing the file empties it again
    write_random(b.path / "runs/empty/x.bin", 1000, seed=1)
    b.flush()
    os.unlink(b.path / "runs/empty/x.bin")
    b.flush()
    assert (a.path / "runs/empty").is_dir()
    assert a.key("runs/empty/") in a.keys()


def test_renamed_tmp_directory_reaches_bucket_only_under_final_name(make_mount) -> None:  # type: ignore[no-untyped-def]
    a: Mount = make_mount("a", upload_delay=2)
    (a.path / "step_7.tmp").mkdir()
    digest = write_random(a.path / "step_7.tmp/shard.bin", 3 * MiB, seed=4)
    os.rename(a.path / "step_7.tmp", a.path / "step_7")
    a.flush()
    assert a.keys() == [a.key("step_7/shard.bin")]
    assert a.object_sha256("step_7/shard.bin") == digest
    assert a.status()["uploaded_bytes_total"] == 3 * MiB


def test_file_larger_than_free_cache_space_streams_through_eviction(make_mount) -> None:  # type: ignore[no-untyped-def]
    a: Mount = make_mount("a")
    big = write_random(a.path / "big.bin", 30 * MiB, seed=20)
    small = {f"s{i}.bin": write_random(a.path / f"s{i}.bin", 12 * MiB, seed=21 + i) for i in range(2)}
    a.flush()
    b: Mount = make_mount("b", metadata_ttl=0, cache_capacity="40MiB", cache_min_free=0, cache_high_watermark=1.0, cache_low_watermark=1.0)
    for name, digest in small.items():
        assert sha256_file(b.path / name) == digest
    assert b.status()["cache_used_bytes"] == 24 * MiB  # 16 MiB free, the file is 30 MiB
    assert sha256_file(b.path / "big.bin") == big
    st = b.status()
    assert st["evicted_files_total"] >= 1
    assert st["cache_used_bytes"] <= 40 * MiB
    # an evicted file reads back identical too
    for name, digest in small.items():
        assert sha256_file(b.path / name) == digest


def test_warmup_prestages_a_tree(two: tuple[Mount, Mount]) -> None:
    a, b = two
    digests = {}
    for i in range(3):
        (a.path / f"model/layer{i}").mkdir(parents=True)
        digests[f"model/layer{i}/w.bin"] = write_random(a.path / f"model/layer{i}/w.bin", 4 * MiB + i, seed=30 + i)
    a.flush()
    proc = b.cli("warmup", str(b.path / "model"))
    assert proc.returncode == 0, proc.stderr
    assert "3 files" in proc.stdout
    st = b.status()
    assert st["fetched_files_total"] == 3
    for rel, digest in digests.items():
        assert sha256_file(b.path / rel) == digest
    assert b.status()["fetched_bytes_total"] == st["fetched_bytes_total"]  # all reads were cache hits
    proc = b.cli("warmup", str(b.path / "model"), str(b.path / "nope"))
    assert proc.returncode != 0
    assert "nope: no such file or directory" in proc.stderr


def test_warmup_of_a_file_that_takes_a_while_reports_progress(make_mount) -> None:  # type: ignore[no-untyped-def]
    # many small ranges: the download outlasts warmup's first progress tick (it used to fail there on a missing attribute)
    a = make_mount("a")
    b = make_mount("b", metadata_ttl=0, read_range_size=64 * 1024, read_range_max_size=128 * 1024)
    digest = write_random(a.path / "big.bin", 48 * MiB + 3, seed=40)
    a.flush()
    proc = b.cli("warmup", str(b.path / "big.bin"))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "1 file" in proc.stdout
    assert os.getxattr(b.path / "big.bin", "user.ckptfs.state") == b"durable"
    assert b.status()["fetched_files_total"] == 1
    assert sha256_file(b.path / "big.bin") == digest


def test_warmup_fails_for_a_corrupted_object(two: tuple[Mount, Mount]) -> None:
    a, b = two
    write_random(a.path / "ok.bin", 2 * MiB, seed=40)
    write_random(a.path / "bad.bin", 2 * MiB, seed=41)
    a.flush()
    # changed behind the gateway's back without updating its checksum
    stored = a.head("bad.bin")["Metadata"]
    a.s3.client().put_object(Bucket=a.bucket, Key=a.key("bad.bin"), Body=os.urandom(2 * MiB), Metadata=stored)
    proc = b.cli("warmup", str(b.path))
    assert proc.returncode == 1
    assert "bad.bin" in proc.stderr and "Traceback" not in proc.stderr
    st = b.status()
    assert st["checksum_mismatches_total"] == 1
    with pytest.raises(OSError) as e:
        (b.path / "bad.bin").read_bytes()
    assert e.value.errno == errno.EIO
    assert b.status()["checksum_mismatches_total"] == 2  # the bad copy was dropped, and refused again


def test_evict_command_and_watermarks_never_touch_dirty_files(make_mount) -> None:  # type: ignore[no-untyped-def]
    a: Mount = make_mount("a")
    clean = {f"c{i}.bin": write_random(a.path / f"c{i}.bin", 8 * MiB, seed=50 + i) for i in range(4)}
    a.flush()
    # B: capacity 40 MiB, evicts in the background above 60% (24 MiB) down to 30% (12 MiB)
    b: Mount = make_mount("b", metadata_ttl=0, upload_delay=3600, cache_capacity="40MiB", cache_min_free=0,
                          cache_high_watermark=0.6, cache_low_watermark=0.3)
    dirty = write_random(b.path / "dirty.bin", 10 * MiB, seed=60)  # never uploaded: upload_delay
    proc = b.cli("evict", str(b.path))
    assert proc.returncode == 0, proc.stderr
    assert "1 not durable yet" in proc.stdout
    for name, digest in clean.items():
        assert sha256_file(b.path / name) == digest  # 10 + 32 MiB pass through a 40 MiB cache
    # the pass evicts down to 12 MiB, except a copy still open or being read in when it runs (the
    # last file's release may come after it): then 18 MiB, below the high watermark, stays
    st = wait_for("background eviction", lambda: (s := b.status())["evicted_files_total"] >= 3 and s["cache_used_bytes"] <= 18 * MiB and s)
    assert st["dirty_files"] == 1 and st["cache_used_bytes"] >= 10 * MiB
    assert os.getxattr(b.path / "dirty.bin", "user.ckptfs.state") == b"dirty"
    assert sha256_file(b.path / "dirty.bin") == dirty
    # evict on request: clean copies go, the dirty one stays
    proc = b.cli("evict", str(b.path))
    assert proc.returncode == 0 and "1 not durable yet" in proc.stdout
    assert b.status()["cache_used_bytes"] == 10 * MiB
    proc = b.cli("evict", str(b.path / "missing"))
    assert proc.returncode != 0 and "missing: no such file or directory" in proc.stderr


def test_object_replaced_elsewhere_is_refetched(two: tuple[Mount, Mount]) -> None:
    a, b = two
    write_random(a.path / "latest.pt", 3 * MiB, seed=70)
    a.flush()
    first = sha256_file(b.path / "latest.pt")
    # A writes a new version of the same file (a new ETag)
    newer = write_random(a.path / "latest.pt", 4 * MiB, seed=71)
    a.flush()
    assert first != newer
    wait_for("B to see the new size", lambda: os.stat(b.path / "latest.pt").st_size == 4 * MiB)
    assert sha256_file(b.path / "latest.pt") == newer
    assert b.status()["remote_changed_total"] == 1


def test_local_changes_win_over_the_listing(two: tuple[Mount, Mount]) -> None:
    a, b = two
    write_random(a.path / "x.bin", 1 * MiB, seed=80)
    a.flush()
    assert (b.path / "x.bin").exists()
    # B rewrites it but has not uploaded yet; A's object stays in the bucket meanwhile
    mine = write_random(b.path / "x.bin", 2 * MiB, seed=81)
    assert sha256_file(b.path / "x.bin") == mine
    assert os.stat(b.path / "x.bin").st_size == 2 * MiB
    b.flush()
    assert a.object_sha256("x.bin") == mine


def test_rmdir_of_a_directory_with_unseen_objects_is_refused(two: tuple[Mount, Mount]) -> None:
    a, b = two
    (a.path / "d").mkdir()
    write_random(a.path / "d/x.bin", 1000, seed=90)
    a.flush()
    # B never listed d/ itself
    assert (b.path / "d").is_dir()
    with pytest.raises(OSError) as e:
        os.rmdir(b.path / "d")
    assert e.value.errno == errno.ENOTEMPTY


def test_multipart_copy_of_a_large_durable_file(make_mount) -> None:  # type: ignore[no-untyped-def]
    # objects above copy_multipart_threshold are copied with UploadPartCopy (S3 requires it above 5 GiB)
    a: Mount = make_mount("a", copy_multipart_threshold="8MiB", part_size="5MiB")
    digest = write_random(a.path / "ckpt.bin", 23 * MiB, seed=100)
    a.flush()
    uploaded = a.status()["uploaded_bytes_total"]
    os.rename(a.path / "ckpt.bin", a.path / "ckpt-final.bin")
    a.flush()
    assert a.keys() == [a.key("ckpt-final.bin")]
    assert a.object_sha256("ckpt-final.bin") == digest
    assert a.head("ckpt-final.bin")["Metadata"].get("xxh3") == os.getxattr(a.path / "ckpt-final.bin", "user.ckptfs.xxh3").decode()
    assert a.status()["uploaded_bytes_total"] == uploaded


def test_renamed_durable_file_that_was_evicted_is_copied(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a: Mount = make_mount("a")
    digest = write_random(a.path / "old.bin", 5 * MiB, seed=110)
    a.flush()
    assert a.cli("evict", str(a.path / "old.bin")).returncode == 0
    os.rename(a.path / "old.bin", a.path / "new.bin")
    a.flush()
    assert a.keys() == [a.key("new.bin")]
    assert sha256_file(a.path / "new.bin") == digest


def test_crash_between_copy_and_delete_is_finished_on_restart(make_mount, s3) -> None:  # type: ignore[no-untyped-def]
    import signal

    from tests.support.faultproxy import FaultProxy

    proxy = FaultProxy(s3.s3_port)
    try:
        a: Mount = make_mount("a", endpoint_url=proxy.url, retry_max_backoff=1)
        digest = write_random(a.path / "step_1.bin", 6 * MiB, seed=120)
        a.flush()
        proxy.fail(503, "SlowDown", count=10_000, methods={"DELETE"})  # the copy lands, the delete cannot
        os.rename(a.path / "step_1.bin", a.path / "final.bin")
        wait_for("the copy", lambda: a.key("final.bin") in a.keys() and a.status()["pending_deletes"] == 1)
        assert a.key("step_1.bin") in a.keys()  # both objects: never neither
        pid = a.status()["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for("the mount to be dead", lambda: mount_is_dead(a.path))
        proxy.fail(503, "SlowDown", count=0)
        a.start()
        a.flush()
        assert a.keys() == [a.key("final.bin")]
        assert a.object_sha256("final.bin") == digest
        assert sha256_file(a.path / "final.bin") == digest
    finally:
        proxy.close()

