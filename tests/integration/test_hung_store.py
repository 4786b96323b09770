"""A hung object store never blocks the filesystem (issue 13, section 1).

The store is hung with SIGSTOP: the kernel still accepts its connections, nothing
answers. Before the fix, creating 3 files in a new directory took 12 minutes and
`ls` 5 min 40 s (each lookup waited for a listing's read timeout and retries,
and a failed listing was not remembered), and unmount never returned.

The bounds below (30 s for a whole sequence, 60 s for an unmount) are generous on
purpose, for a loaded machine: what they tell apart is "answers" from "waits
for the store's timeouts", minutes. Default settings except where a test says.
"""

from __future__ import annotations

import json
import errno
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import DEFAULT_LISTING_TIMEOUT, Mount, sha256_file, wait_for, write_random
from tests.support.seaweed import SeaweedServer

MiB = 1 << 20

# the sequence a training job runs, in a child process so that a hang fails the test instead of stalling it
SEQUENCE = r"""
import hashlib, json, os, sys
root = sys.argv[1]
new = os.path.join(root, "step_2")
os.mkdir(new)
digests = {}
for i in range(3):
    data = os.urandom(256 * 1024 + i)
    tmp = os.path.join(new, f"shard{i}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(new, f"shard{i}.bin"))
    digests[f"step_2/shard{i}.bin"] = hashlib.sha256(data).hexdigest()
os.mkdir(os.path.join(new, "optim"))
listed = {"": sorted(os.listdir(root)), "step_2": sorted(os.listdir(new))}
sizes = {rel: os.stat(os.path.join(root, rel)).st_size for rel in [*digests, "step_1.bin"]}
print(json.dumps({"digests": digests, "listed": listed, "sizes": sizes}))
"""


@pytest.fixture
def hung(s3: SeaweedServer) -> Iterator[SeaweedServer]:
    """Hang the store on demand (`hung.pause()`); it is always resumed before the fixtures clean up."""
    try:
        yield s3
    finally:
        if s3.paused:
            s3.resume()


def run_sequence(m: Mount) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", SEQUENCE, str(m.path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_hung_store_never_blocks_the_filesystem(make_mount, hung: SeaweedServer) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(listing_timeout=DEFAULT_LISTING_TIMEOUT)
    before = write_random(m.path / "step_1.bin", 1 * MiB, seed=1)
    m.flush()
    hung.pause()
    out = run_sequence(m)  # mkdir, create, write, fsync, close, rename, mkdir, ls, stat: all answer
    assert out["listed"] == {"": ["step_1.bin", "step_2"], "step_2": ["optim", "shard0.bin", "shard1.bin", "shard2.bin"]}
    assert out["sizes"]["step_1.bin"] == 1 * MiB
    for rel, digest in out["digests"].items():
        assert sha256_file(m.path / rel) == digest  # read back from the cache
        assert os.getxattr(m.path / rel, "user.ckptfs.state") in (b"dirty", b"uploading")
    st = m.status()
    assert st["stale_directories"] >= 1  # served without a listing, and said so
    assert st["listing_timeouts_total"] >= 1
    assert "showing what this node knows" in (m.cache_dir / "ckptfs.log").read_text()
    hung.resume()
    m.flush()
    for rel, digest in out["digests"].items():
        assert m.object_sha256(rel) == digest
    assert m.object_sha256("step_1.bin") == before
    assert m.key("step_2/optim/") in m.keys()
    # the background listings succeed once the store answers: nothing is stale any more
    wait_for("the stale directories to be listed", lambda: m.status()["stale_directories"] == 0)
    assert sorted(os.listdir(m.path / "step_2")) == ["optim", "shard0.bin", "shard1.bin", "shard2.bin"]


def test_unmount_with_a_hung_store_returns_and_the_next_mount_uploads(make_mount, hung: SeaweedServer) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(shutdown_timeout=3, listing_timeout=DEFAULT_LISTING_TIMEOUT)
    (m.path / "ready").mkdir()
    m.flush()
    hung.pause()
    digest = write_random(m.path / "ready" / "late.bin", 2 * MiB, seed=2)
    wait_for("the upload to start", lambda: m.status()["uploading_files"] >= 1)
    os.listdir(m.path / "ready")
    # returns after shutdown_timeout (3 s) plus a few seconds, not after the store's timeouts (minutes)
    proc = m.cli("unmount", str(m.path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not os.path.ismount(m.path)
    assert "stay in the journal" in proc.stdout and "the next mount" in proc.stdout, proc.stdout  # says what is left
    log = (m.cache_dir / "ckptfs.log").read_text()
    assert "stopped with 1 files" in log and "the next mount" in log
    hung.resume()
    m.start()
    m.flush()
    assert m.object_sha256("ready/late.bin") == digest


def test_read_of_an_uncached_file_fails_after_its_bound_and_says_why(make_mount, hung: SeaweedServer) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(read_range_timeout=2, listing_timeout=DEFAULT_LISTING_TIMEOUT)
    digest = write_random(m.path / "evicted.bin", 1 * MiB, seed=3)
    m.flush()
    proc = m.cli("evict", str(m.path / "evicted.bin"))
    assert proc.returncode == 0 and "evicted 1 file " in proc.stdout, proc.stdout + proc.stderr
    hung.pause()
    reader = subprocess.run([sys.executable, "-c", "import sys; open(sys.argv[1], 'rb').read()", str(m.path / "evicted.bin")],
                            capture_output=True, text=True, timeout=60)
    assert reader.returncode != 0 and "Input/output error" in reader.stderr, reader.stderr
    log = (m.cache_dir / "ckptfs.log").read_text()
    assert "within read_range_timeout" in log and "evicted.bin" in log
    assert m.status()["read_errors_total"] == 1
    hung.resume()
    assert sha256_file(m.path / "evicted.bin") == digest  # the next open reads it


def test_directory_rmdir_and_rename_with_a_hung_store(make_mount, hung: SeaweedServer) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(listing_timeout=DEFAULT_LISTING_TIMEOUT)
    client = hung.client()
    client.put_object(Bucket=m.bucket, Key=m.key("elsewhere/unseen.bin"), Body=b"x")  # another node's tree
    (m.path / "listed").mkdir()
    m.flush()
    assert sorted(os.listdir(m.path)) == ["elsewhere", "listed"]  # `elsewhere` known only as a name
    assert os.listdir(m.path / "listed") == []  # listed by this node: it knows it is empty
    hung.pause()
    (m.path / "step.tmp").mkdir()  # made here: nothing of it in the bucket
    (m.path / "step.tmp" / "shard.bin").write_bytes(b"s")
    os.rename(m.path / "step.tmp", m.path / "step")  # the checkpoint pattern goes on
    os.rmdir(m.path / "listed")
    # this node never listed `elsewhere`: removing or moving it could leave objects behind, so it is refused
    for op in (lambda: os.rmdir(m.path / "elsewhere"), lambda: os.rename(m.path / "elsewhere", m.path / "moved")):
        with pytest.raises(OSError) as e:
            op()
        assert e.value.errno == errno.ETIMEDOUT
    assert "never listed it" in (m.cache_dir / "ckptfs.log").read_text()
    hung.resume()
    m.flush()
    keys = m.keys()
    assert m.key("step/shard.bin") in keys and m.key("listed/") not in keys and m.key("elsewhere/unseen.bin") in keys
    # the flush's requests were answered: the daemon knows the store answers, whether or not a background
    # listing has succeeded yet (before, this depended on which came first, and failed once with ETIMEDOUT)
    with pytest.raises(OSError) as e:
        os.rmdir(m.path / "elsewhere")  # the store answers again: the object is seen
    assert e.value.errno == errno.ENOTEMPTY


@pytest.mark.one_transport
def test_mount_with_a_hung_store_fails_within_its_check_bound_and_says_why(make_mount, hung: SeaweedServer) -> None:  # type: ignore[no-untyped-def]
    """Before: HeadBucket waited read_timeout (60 s) x 3 attempts, ~3 min, and systemd's start timeout (120 s)
    killed the service before the daemon could say why. Now mount_check_timeout bounds the check."""
    from tests.integration.test_faults import one_line_error

    m: Mount = make_mount(start=False)
    hung.pause()
    # timeout=60: tells "fails after its bound (6 s)" from "after the store's timeouts" (minutes)
    proc = m.cli(*m.mount_args(), "-o", "mount_check_timeout=6", timeout=60)
    one_line_error(proc, "did not answer within mount_check_timeout (6 s)", "hung or overloaded", "-o mount_check_timeout=")
    assert not os.path.ismount(m.path)
    hung.resume()
    m.start()  # the same mount works once the store answers
    digest = write_random(m.path / "after.bin", 1 * MiB, seed=5)
    m.flush()
    assert m.object_sha256("after.bin") == digest


@pytest.mark.one_transport
def test_mount_check_against_a_silent_endpoint_ends_within_its_bound(make_mount) -> None:  # type: ignore[no-untyped-def]
    """An endpoint that accepts connections and never answers: the error names mount_check_timeout, and the check
    keeps to it. Before: botocore's `max_attempts` of 3 made 4 requests of a third of the bound each, plus
    back-off (42.4 s for "did not answer within mount_check_timeout (30 s)")."""
    from tests.integration.test_faults import one_line_error

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(silent.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        m: Mount = make_mount(start=False, endpoint_url=f"http://127.0.0.1:{silent.getsockname()[1]}")
        # timeout=120: a bound on a hang; the outcome that tells the check kept to its bound is how many requests it
        # sent (botocore's own retries, the bug, made 4 of a third of the bound each, plus back-off)
        proc = m.cli(*m.mount_args(), "-o", "mount_check_timeout=4", timeout=120)
    finally:
        silent.close()
        for conn in accepted:
            conn.close()
    one_line_error(proc, "accepted the connection but did not answer within mount_check_timeout (4 s)",
                   "-o mount_check_timeout=")
    assert 1 <= len(accepted) <= 3, len(accepted)  # the 3 attempts the docs say, not botocore's 4 requests
    assert os.listdir(m.cache_dir) == []  # and the failed start left the cache directory as it found it
