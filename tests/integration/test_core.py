"""The core gateway against a real FUSE mount and a real SeaweedFS server.

Every test checks what a user would check: the bytes in the bucket (sha256),
the keys present, the xattr states, the CLI's output and exit codes.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import xxhash
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Mount, sha256_file, write_random

MiB = 1 << 20
GiB = 1 << 30


def xattr(path: Path, name: str) -> str | None:
    try:
        return os.getxattr(path, f"user.ckptfs.{name}").decode()
    except OSError as e:
        if e.errno == errno.ENODATA:
            return None
        raise


def wait_until(predicate, what: str, limit: float = 120.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll for a state the product must reach; the limit only stops a broken product hanging the suite."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"never reached: {what}")


def test_tmp_fsync_rename_flush(mount: Mount) -> None:
    tmp = mount.path / "model.pt.tmp"
    digest = write_random(tmp, 3 * MiB + 17, seed=1, fsync=True)
    os.rename(tmp, mount.path / "model.pt")
    mount.flush()
    assert mount.keys() == [mount.key("model.pt")]
    assert mount.object_sha256("model.pt") == digest
    assert sha256_file(mount.path / "model.pt") == digest
    assert mount.s3.client().list_multipart_uploads(Bucket=mount.bucket).get("Uploads", []) == []


def test_directory_renamed_before_upload(mount: Mount) -> None:
    tmpdir = mount.path / "step_100.tmp"
    (tmpdir / "shards").mkdir(parents=True)
    digests = {
        "a.distcp": write_random(tmpdir / "a.distcp", 2 * MiB, seed=2),
        "shards/b.distcp": write_random(tmpdir / "shards" / "b.distcp", 20 * MiB, seed=3),
    }
    os.rename(tmpdir, mount.path / "step_100")
    mount.flush()
    assert mount.keys() == sorted(mount.key(f"step_100/{k}") for k in digests)
    for rel, digest in digests.items():
        assert mount.object_sha256(f"step_100/{rel}") == digest


def test_overwrite_durable_file(mount: Mount) -> None:
    target = mount.path / "latest.pt"
    write_random(target, 1 * MiB, seed=4)
    mount.flush()
    first_etag = xattr(target, "etag")
    # atomic replace by rename
    tmp = mount.path / "latest.pt.tmp"
    second = write_random(tmp, 2 * MiB, seed=5)
    os.rename(tmp, target)
    assert sha256_file(target) == second  # local readers see the new file at once
    mount.flush()
    assert mount.keys() == [mount.key("latest.pt")]
    assert mount.object_sha256("latest.pt") == second
    assert xattr(target, "etag") != first_etag
    # in-place overwrite with O_TRUNC
    third = write_random(target, 123, seed=6)
    mount.flush()
    assert mount.object_sha256("latest.pt") == third
    assert mount.head("latest.pt")["ContentLength"] == 123


def test_delete_durable_file_removes_object(mount: Mount) -> None:
    (mount.path / "d").mkdir()
    write_random(mount.path / "d" / "gone.bin", 1 * MiB, seed=7)
    write_random(mount.path / "d" / "kept.bin", 1 * MiB, seed=8)
    mount.flush()
    assert mount.keys() == [mount.key("d/gone.bin"), mount.key("d/kept.bin")]
    os.unlink(mount.path / "d" / "gone.bin")
    mount.flush()  # flush waits for queued deletions too
    assert mount.keys() == [mount.key("d/kept.bin")]
    assert mount.status()["pending_deletes"] == 0


def test_rename_of_durable_file_moves_object(mount: Mount) -> None:
    digest = write_random(mount.path / "old.bin", 2 * MiB, seed=9)
    mount.flush()
    os.rename(mount.path / "old.bin", mount.path / "new.bin")
    assert xattr(mount.path / "new.bin", "state") in ("dirty", "uploading")
    mount.flush()
    assert mount.keys() == [mount.key("new.bin")]
    assert mount.object_sha256("new.bin") == digest


def test_one_gib_multipart(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(part_size="64MiB", max_file_size="100GiB")
    digest = write_random(m.path / "big.bin", GiB, seed=10, chunk=4 * MiB)
    m.flush(timeout=600)
    head = m.head("big.bin")
    assert head["ContentLength"] == GiB
    assert head["ETag"].strip('"').endswith("-16"), head["ETag"]  # 16 parts of 64 MiB
    assert m.object_sha256("big.bin") == digest
    assert head["Metadata"]["xxh3"] == xattr(m.path / "big.bin", "xxh3")


def test_commit_marker_uploads_last(make_mount) -> None:  # type: ignore[no-untyped-def]
    # one part in flight so the shards take a while to drain
    m: Mount = make_mount(max_parts_in_flight=1, part_size="5MiB", multipart_threshold="5MiB")
    step = m.path / "step_7"
    step.mkdir()
    shards = [f"__{i}_0.distcp" for i in range(3)]
    # the last shard is open for writing from before the marker is closed to the end of the save: the directory
    # has a file not durable at every moment the marker could be taken (written first, with the shards made after
    # it, a loaded machine could take longer than upload_delay to create the first shard: the marker was then
    # rightly alone and durable, and the test failed on its own timing)
    last = open(step / shards[-1], "wb")
    # the marker is closed FIRST: oldest-first alone would upload it before the data
    (step / ".metadata").write_bytes(b"commit")
    seen_marker_early = []
    stop = threading.Event()

    def watch() -> None:
        client = m.s3.client()
        while not stop.is_set():
            keys = {o["Key"] for o in client.list_objects_v2(Bucket=m.bucket).get("Contents", [])}
            if m.key("step_7/.metadata") in keys and not all(m.key(f"step_7/{s}") in keys for s in shards):
                seen_marker_early.append(sorted(keys))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with last:
            for i, s in enumerate(shards[:-1]):
                write_random(step / s, 12 * MiB, seed=20 + i, fsync=False)
            last.write(random.Random(22).randbytes(12 * MiB))
            # while any shard is not durable the marker stays dirty: the last one is still open for
            # writing here, so this holds however fast the others drain
            assert xattr(step / ".metadata", "state") == "dirty"
        m.flush()
    finally:
        stop.set()
        watcher.join()
    assert seen_marker_early == []
    assert sorted(m.keys()) == sorted(m.key(f"step_7/{n}") for n in [".metadata", *shards])


def test_concurrent_writers(mount: Mount) -> None:
    # four processes writing interleaved, each at random offsets within its own file
    script = (
        "import os, random, sys, hashlib\n"
        "path, seed = sys.argv[1], int(sys.argv[2])\n"
        "rng = random.Random(seed); size = 24 << 20; chunk = 256 << 10\n"
        "data = rng.randbytes(size)\n"
        "offsets = list(range(0, size, chunk)); rng.shuffle(offsets)\n"
        "fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)\n"
        "for off in offsets: os.pwrite(fd, data[off:off + chunk], off)\n"
        "os.fsync(fd); os.close(fd)\n"
        "print(hashlib.sha256(data).hexdigest())\n"
    )
    procs = [
        subprocess.Popen(["python3", "-c", script, str(mount.path / f"rank{i}.bin"), str(i)], stdout=subprocess.PIPE, text=True)
        for i in range(4)
    ]
    digests = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    mount.flush()
    for i, digest in enumerate(digests):
        assert sha256_file(mount.path / f"rank{i}.bin") == digest
        assert mount.object_sha256(f"rank{i}.bin") == digest


def test_xattr_states(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(max_parts_in_flight=1, part_size="5MiB", multipart_threshold="5MiB")
    f = m.path / "state.bin"
    with open(f, "wb") as fh:
        fh.write(os.urandom(MiB))
        fh.flush()
        assert xattr(f, "state") == "dirty"
        assert xattr(f, "etag") is None
        fh.write(os.urandom(59 * MiB))
    # uploading is reached while the 12 parts go out one at a time
    wait_until(lambda: xattr(f, "state") == "uploading", "state uploading")
    m.flush()
    assert xattr(f, "state") == "durable"
    data = f.read_bytes()
    assert xattr(f, "xxh3") == xxhash.xxh3_128_hexdigest(data)
    assert xattr(f, "etag") == m.head("state.bin")["ETag"].strip('"')
    assert set(os.listxattr(f)) == {"user.ckptfs.state", "user.ckptfs.etag", "user.ckptfs.xxh3"}


def test_status_json(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(upload_delay=3600)  # nothing drains on its own
    write_random(m.path / "a.bin", 3 * MiB, seed=30)
    write_random(m.path / "b.bin", 1 * MiB, seed=31)
    st = m.status()
    for key in ("pid", "dirty_files", "dirty_bytes", "uploading_files", "oldest_dirty_age_seconds",
                "cache_used_bytes", "cache_capacity_bytes", "uploaded_bytes_total", "upload_errors_total"):
        assert key in st, key
    assert st["dirty_files"] == 2
    assert st["dirty_bytes"] == 4 * MiB
    assert st["uploaded_bytes_total"] == 0
    assert st["cache_used_bytes"] >= 4 * MiB
    assert st["oldest_dirty_age_seconds"] > 0
    os.kill(st["pid"], 0)  # it is the daemon's pid
    m.flush()
    st = m.status()
    assert (st["dirty_files"], st["dirty_bytes"], st["uploading_files"]) == (0, 0, 0)
    assert st["uploaded_bytes_total"] == 4 * MiB
    table = m.cli("status", str(m.path))
    assert table.returncode == 0 and "nothing dirty" in table.stdout, table.stdout


def test_status_names_the_fuse_protocol_and_workers(mount: Mount) -> None:
    """`fuse_protocol` is the version settled at INIT: 7.31 (Linux 5.4) to 7.40, ours; 7.38 on
    Debian 12's 6.1 (`make test-vm`). pyfuse3 does not tell it."""
    st = mount.status()
    if st["fuse_transport"] == "libfuse":
        assert (st["fuse_protocol"], st["fuse_workers"]) == (None, 1)
        return
    major, minor = (int(x) for x in st["fuse_protocol"].split("."))
    assert major == 7 and 31 <= minor <= 40, st["fuse_protocol"]
    if os.uname().release.startswith("6.1."):
        assert (minor, st["passthrough"]) == (38, False)
    assert st["fuse_workers"] >= 1
    table = mount.cli("status", str(mount.path))
    assert f"kernel (FUSE {st['fuse_protocol']})" in table.stdout, table.stdout


def test_flush_timeout(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()
    step = m.path / "step_9"
    step.mkdir()
    (step / "latest").write_text("step_9")  # a commit marker
    # a shard still open for writing holds the marker back
    with open(step / "shard.bin", "wb") as shard:
        shard.write(b"x" * 1000)
        shard.flush()
        proc = m.cli("flush", str(step / "latest"), "--timeout", "1.5")
        assert proc.returncode == 1
        assert "timed out after 1.5s" in proc.stderr and "not durable yet" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert xattr(step / "latest", "state") == "dirty"
    # once the shard is closed both drain
    m.flush("step_9")
    assert xattr(step / "latest", "state") == "durable"
    missing = m.cli("flush", str(m.path / "nope"), "--timeout", "5")
    assert missing.returncode != 0 and "no such file" in missing.stderr


def test_metrics_after_drain(make_mount, s3) -> None:  # type: ignore[no-untyped-def]
    from tests.support.seaweed import free_port

    port = free_port()
    m: Mount = make_mount(start=False)
    m.metrics_port = port
    m.start()
    write_random(m.path / "x.bin", 5 * MiB, seed=40)
    write_random(m.path / "y.bin", 7 * MiB, seed=41)
    m.flush()
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {s.name + json.dumps(s.labels, sort_keys=True): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["ckptfs_uploaded_bytes_total{}"] == 12 * MiB
    assert samples["ckptfs_uploaded_files_total{}"] == 2
    assert samples["ckptfs_dirty_files{}"] == 0
    assert samples["ckptfs_dirty_bytes{}"] == 0
    assert samples["ckptfs_oldest_dirty_age_seconds{}"] == 0
    assert samples["ckptfs_time_to_durable_seconds_count{}"] == 2
    assert sum(v for k, v in samples.items() if k.startswith("ckptfs_upload_errors_total")) == 0


def test_posix_operations(mount: Mount) -> None:
    p = mount.path
    (p / "dir" / "sub").mkdir(parents=True)
    assert sorted(os.listdir(p / "dir")) == ["sub"]
    f = p / "dir" / "file.bin"
    f.write_bytes(b"0123456789")
    # random-offset write and read
    with open(f, "r+b") as fh:
        fh.seek(4)
        fh.write(b"xy")
        fh.seek(20)
        fh.write(b"end")
    data = f.read_bytes()
    assert data == b"0123xy6789" + b"\0" * 10 + b"end"
    with open(f, "rb") as fh:
        fh.seek(5)
        assert fh.read(3) == b"y67"
    os.truncate(f, 4)
    assert f.read_bytes() == b"0123"
    os.chmod(f, 0o600)
    assert (f.stat().st_mode & 0o777) == 0o600
    os.utime(f, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    assert f.stat().st_mtime_ns == 1_600_000_000_000_000_000
    with pytest.raises(OSError) as e:
        os.rmdir(p / "dir")
    assert e.value.errno == errno.ENOTEMPTY
    os.rmdir(p / "dir" / "sub")
    st = os.statvfs(p)
    assert st.f_blocks > 0 and st.f_bavail > 0
    with pytest.raises(OSError) as e:
        os.link(f, p / "hard")
    assert e.value.errno == errno.EPERM
    # an unlinked file stays readable through its open handle
    g = p / "open.bin"
    g.write_bytes(b"still here")
    with open(g, "rb") as fh:
        os.unlink(g)
        assert not g.exists()
        assert fh.read() == b"still here"
    # inode numbers are never reused
    seen = set()
    for i in range(5):
        h = p / f"n{i}"
        h.write_bytes(b"")
        seen.add(h.stat().st_ino)
        h.unlink()
    assert len(seen) == 5
    mount.flush()
    assert mount.keys() == [mount.key("dir/file.bin")]
    assert mount.object_sha256("dir/file.bin") == __import__("hashlib").sha256(b"0123").hexdigest()


def test_file_changed_during_upload_is_reuploaded(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(max_parts_in_flight=1, part_size="5MiB", multipart_threshold="5MiB")
    f = m.path / "moving.bin"
    write_random(f, 60 * MiB, seed=50, fsync=False)
    wait_until(lambda: xattr(f, "state") == "uploading", "state uploading")
    with open(f, "r+b") as fh:  # change the middle while parts are going out
        fh.seek(30 * MiB)
        fh.write(b"changed!" * 1000)
    assert xattr(f, "state") == "dirty"
    m.flush()
    assert m.object_sha256("moving.bin") == sha256_file(f)
    assert m.head("moving.bin")["Metadata"]["xxh3"] == xxhash.xxh3_128_hexdigest(f.read_bytes())
    assert m.s3.client().list_multipart_uploads(Bucket=m.bucket).get("Uploads", []) == []


def test_many_small_files_land_whole_with_their_digests_then_go(mount: Mount) -> None:
    """Small files go as one PutObject each (up to 1 MiB read whole and sent as bytes, above that streamed):
    every object holds the bytes written and their xxh3-128, every file reads `durable`; `rm -rf` then
    empties the bucket."""
    d = mount.path / "small"
    d.mkdir()
    rnd = random.Random(24)
    sizes = [0, 1, MiB - 1, MiB, MiB + 1] + [rnd.randrange(64 << 10) for _ in range(60)]
    written = {}
    for i, size in enumerate(sizes):
        data = rnd.randbytes(size)
        (d / f"f{i:03d}.bin").write_bytes(data)
        written[f"small/f{i:03d}.bin"] = data
    mount.flush()
    client = mount.s3.client()
    assert sorted(mount.keys()) == sorted(mount.key(rel) for rel in written)
    for rel, data in written.items():
        got = client.get_object(Bucket=mount.bucket, Key=mount.key(rel))
        assert got["Body"].read() == data, rel
        assert got["Metadata"]["xxh3"] == xxhash.xxh3_128_hexdigest(data), rel
        assert xattr(mount.path / rel, "state") == "durable"
    subprocess.run(["rm", "-rf", str(d)], check=True)
    mount.flush()
    wait_until(lambda: mount.keys() == [], "every object of the removed tree deleted")
