"""The daemon with `fuse_transport=kernel`: FUSE passthrough end to end (issue 17).

Under passthrough the kernel writes the cache file itself; these tests check that the rest of
ckptfs still sees every change: the upload after the last close has the bytes, a rewrite of a
durable file is uploaded again, shared mmap writes arrive, status reports the transport and
the passthrough handles, and a daemon killed with a passthrough writer open loses nothing
that was fsynced. The same files under `fuse_transport=libfuse` are the reference.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import signal
from typing import Any

import pytest

from tests.conftest import mount_is_dead, wait_for

MiB = 1 << 20


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def kernel_mount(make_mount: Any, **options: Any) -> Any:
    m = make_mount(fuse_transport="kernel", **options)
    s = m.status()
    assert s["fuse_transport"] == "kernel"
    if not s["passthrough"]:
        pytest.skip("the kernel transport runs, but this kernel or user gets no passthrough")
    return m


@pytest.mark.integration
def test_passthrough_write_upload_and_status(make_mount: Any) -> None:
    m = kernel_mount(make_mount)
    data = os.urandom(9 * MiB + 17)
    p = m.path / "step_1" / "model.pt"
    os.mkdir(p.parent)
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data[:4 * MiB])
        os.write(fd, data[4 * MiB:])
        assert os.stat(p).st_size == len(data)  # from the cache file while it is open
        os.fsync(fd)
        s = m.status()
        assert s["passthrough_handles"] == 1
        assert os.getxattr(p, "user.ckptfs.state") == b"dirty"
    finally:
        os.close(fd)
    with open(m.cache_dir / "data" / str(os.stat(p).st_ino), "rb") as f:
        assert f.read() == data  # the kernel wrote the cache file
    m.flush()
    assert os.getxattr(p, "user.ckptfs.state") == b"durable"
    assert m.object_sha256("step_1/model.pt") == sha256(data)
    assert m.status()["passthrough_handles"] == 0


@pytest.mark.integration
def test_passthrough_rewrite_and_mmap_are_uploaded(make_mount: Any) -> None:
    m = kernel_mount(make_mount)
    p = m.path / "state.bin"
    p.write_bytes(b"a" * MiB)
    m.flush()
    assert m.object_sha256("state.bin") == sha256(b"a" * MiB)
    with open(p, "r+b") as f:  # a durable file opened for writing counts as modified
        f.seek(10)
        f.write(b"B")
    m.flush()
    expected = bytearray(b"a" * MiB)
    expected[10:11] = b"B"
    assert m.object_sha256("state.bin") == sha256(bytes(expected))
    with open(p, "r+b") as f, mmap.mmap(f.fileno(), MiB, mmap.MAP_SHARED) as mm:
        mm[-4:] = b"TAIL"
        mm.flush()
    expected[-4:] = b"TAIL"
    m.flush()
    assert m.object_sha256("state.bin") == sha256(bytes(expected))
    with open(p, "r+b") as f:  # truncate on a passthrough handle
        f.truncate(100)
    m.flush()
    assert m.object_sha256("state.bin") == sha256(bytes(expected[:100]))
    assert os.stat(p).st_size == 100


@pytest.mark.integration
def test_daemon_killed_with_passthrough_writer_open(make_mount: Any) -> None:
    m = kernel_mount(make_mount)
    data = os.urandom(3 * MiB)
    p = m.path / "ckpt.bin"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)  # acknowledged: must survive the daemon
        os.kill(m.status()["pid"], signal.SIGKILL)
        wait_for("the mount to die", lambda: mount_is_dead(m.path), timeout=60)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    m.stop()
    m.start()
    m.flush()
    assert m.object_sha256("ckpt.bin") == sha256(data)
    assert (m.path / "ckpt.bin").read_bytes() == data


@pytest.mark.integration
def test_libfuse_transport_chosen_by_option(make_mount: Any) -> None:
    m = make_mount(fuse_transport="libfuse")
    s = m.status()
    assert (s["fuse_transport"], s["passthrough"], s["passthrough_handles"]) == ("libfuse", False, 0)
    data = os.urandom(MiB + 3)
    (m.path / "f").write_bytes(data)
    m.flush()
    assert m.object_sha256("f") == sha256(data)


@pytest.mark.integration
def test_passthrough_switched_off_by_option(make_mount: Any) -> None:
    """`fuse_passthrough = false`: the kernel transport in copy mode; every WRITE reaches the daemon."""
    import urllib.request

    from tests.support.seaweed import free_port

    m = make_mount(start=False, fuse_transport="kernel", fuse_passthrough="false", upload_delay=3600)
    m.metrics_port = free_port()
    m.start()
    s = m.status()
    assert (s["fuse_transport"], s["passthrough"]) == ("kernel", False)
    data = os.urandom(4 * MiB + 5)
    p = m.path / "copy.bin"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
        assert m.status()["passthrough_handles"] == 0
    finally:
        os.close(fd)
    text = urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=10).read().decode()
    writes = [line for line in text.splitlines() if line.startswith('ckptfs_fuse_requests_total{op="write"}')]
    assert writes and float(writes[0].split()[-1]) >= 1, writes  # the daemon copied the bytes itself
    assert p.read_bytes() == data
    m.flush()  # urgent: past the upload delay
    assert m.object_sha256("copy.bin") == sha256(data)
