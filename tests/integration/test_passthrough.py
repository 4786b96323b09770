"""The daemon with `fuse_transport=kernel`: FUSE passthrough end to end (issue 17).

Under passthrough the kernel writes the cache file itself; these tests check that the rest of
ckptfs still sees every change: the upload after the last close has the bytes, a rewrite of a
durable file is uploaded again, shared mmap writes arrive, status reports the transport and
the passthrough handles, size, mtime and FSYNC while a passthrough writer is open, when
passthrough is granted and refused (one mode per inode), a daemon killed or unmounted with a
passthrough writer open loses nothing, and a passthrough writer that fills the cache disk
gets ENOSPC while the daemon goes on. The same files under `fuse_transport=libfuse` are the
reference. (Every other integration test runs under both transports: tests/conftest.py.)
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import shutil
import signal
import subprocess
import threading
from typing import Any

import pytest

from ckptfs.journal import JOURNAL_RESERVE
from tests.conftest import mount_is_dead, sha256_file, wait_for, write_random
from tests.integration.test_metrics import scrape, value
from tests.support.faultproxy import FaultProxy
from tests.support.seaweed import free_port

# each test picks its transport itself (fuse_transport=...)
pytestmark = pytest.mark.one_transport

MiB = 1 << 20


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def kernel_mount(make_mount: Any, name: str = "m", metrics: bool = False, **options: Any) -> Any:
    m = make_mount(name, fuse_transport="kernel", start=False, **options)
    if metrics:
        m.metrics_port = free_port()
    m.start()
    kernel_mount_checks(m)
    return m


def kernel_mount_checks(m: Any) -> None:
    s = m.status()
    assert s["fuse_transport"] == "kernel"
    if not s["passthrough"]:
        pytest.skip("the kernel transport runs, but this kernel or user gets no passthrough")


@pytest.mark.integration
def test_passthrough_write_upload_and_status(make_mount: Any) -> None:
    m = kernel_mount(make_mount, metrics=True)
    data = os.urandom(9 * MiB + 17)
    p = m.path / "step_1" / "model.pt"
    os.mkdir(p.parent)
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data[:4 * MiB])
        os.write(fd, data[4 * MiB:])
        # size and mtime while open: from the cache file the kernel writes
        st, cached = os.stat(p), os.stat(m.cache_dir / "data" / str(os.stat(p).st_ino))
        assert (st.st_size, st.st_mtime_ns) == (len(data), cached.st_mtime_ns)
        fsyncs = value(scrape(m.metrics_port), "ckptfs_fuse_requests_total", op="fsync")
        os.fsync(fd)
        # FSYNC reaches the daemon (which fsyncs the cache file); no WRITE ever did
        text = scrape(m.metrics_port)
        assert value(text, "ckptfs_fuse_requests_total", op="fsync") == fsyncs + 1
        assert value(text, "ckptfs_fuse_requests_total", op="write") == 0
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
def test_flush_of_an_open_passthrough_file_finishes_under_scrapes_and_status(make_mount: Any) -> None:
    """Reading the daemon's state (a Prometheus scrape, `ckptfs status`) records what passthrough writers
    wrote; where they wrote nothing it must make no new version, which would abandon the file's upload
    at every scrape: the flush of a file kept open would never finish."""
    m = kernel_mount(make_mount, metrics=True)
    p = m.path / "model.pt"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    stop = threading.Event()
    readings: list[str] = []

    def read_state(how: str, every: float) -> None:
        while not stop.wait(every):
            if how == "scrape":
                scrape(m.metrics_port)
            else:
                m.status()
            readings.append(how)

    readers = [threading.Thread(target=read_state, args=("scrape", 0.2), daemon=True),
               threading.Thread(target=read_state, args=("status", 0.3), daemon=True)]
    try:
        data = os.urandom(128 * MiB)
        assert os.write(fd, data) == len(data)
        os.fsync(fd)  # acknowledged; the file stays open
        for reader in readers:
            reader.start()
        wait_for("the state read while the file is open", lambda: {"scrape", "status"} <= set(readings), timeout=120)
        proc = m.cli("flush", str(p), "--timeout", "90", timeout=150)  # an old daemon never finishes it
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert os.getxattr(p, "user.ckptfs.state") == b"durable"
        assert m.object_sha256("model.pt") == sha256(data)
    finally:
        stop.set()
        for reader in readers:
            if reader.is_alive():
                reader.join(60)
        os.close(fd)


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
def test_passthrough_writer_fills_the_disk_gets_enospc_and_loses_nothing(make_mount: Any) -> None:
    """Issue 17 item 4: the kernel writes a passthrough handle's cache file itself, so the daemon
    cannot hold such a writer back when the disk fills: the writer gets ENOSPC from the kernel,
    the daemon stays up, what was fsynced before is intact and drains, and once the writer
    removes its partial file the mount works as before."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs as the cache disk")
    # passthrough_min_room 1 MiB and no reserve: a 48 MiB disk still grants passthrough;
    # upload_delay: nothing drains (and no clean copy is evicted) until the test flushes
    m = make_mount("full", start=False, fuse_transport="kernel", passthrough_min_room="1MiB", cache_min_free=0, upload_delay=3600)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(m.cache_dir)], check=True)
    try:
        m.start()
        kernel_mount_checks(m)
        kept = {f"kept{i}.bin": write_random(m.path / f"kept{i}.bin", 8 * MiB, seed=170 + i) for i in range(2)}  # fsynced
        chunk = os.urandom(MiB)
        h = hashlib.sha256()
        written = 0
        fd = os.open(m.path / "big.bin", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            assert m.status()["passthrough_handles"] == 1  # not copy mode, where the daemon refuses the write itself
            with pytest.raises(OSError) as e:
                while written < 64 * MiB:  # the disk holds 48 MiB: ENOSPC comes first
                    n = os.write(fd, chunk)
                    h.update(chunk[:n])
                    written += n
            assert e.value.errno == errno.ENOSPC
            assert written > 0
            # the daemon is up and serves the other files (read through passthrough from the full disk)
            s = m.status()
            assert s["passthrough_handles"] == 1
            for name, digest in kept.items():
                assert sha256_file(m.path / name) == digest
            assert os.stat(m.path / "big.bin").st_size == written
            os.fsync(fd)  # what the kernel took is on disk: fsync succeeds
        finally:
            os.close(fd)
        # the partial file closed by its writer is an ordinary closed file: the bytes that reached
        # the disk, dirty, uploaded like any other (docs/semantics.md)
        assert os.stat(m.path / "big.bin").st_size == written
        assert os.getxattr(m.path / "big.bin", "user.ckptfs.state") == b"dirty"
        for name, digest in kept.items():
            assert sha256_file(m.cache_dir / "data" / str(os.stat(m.path / name).st_ino)) == digest
        m.flush()
        for name, digest in kept.items():
            assert m.object_sha256(name) == digest
        assert m.object_sha256("big.bin") == h.hexdigest()
        # the writer removes its partial file: room again, and the mount works as before
        os.unlink(m.path / "big.bin")
        digest = write_random(m.path / "after.bin", 4 * MiB, seed=179)
        assert m.status()["passthrough_handles"] == 0
        m.flush()
        assert m.object_sha256("after.bin") == digest
        assert sha256_file(m.path / "after.bin") == digest
        assert "big.bin" not in {k.rsplit("/", 1)[-1] for k in m.keys()}
        # the journal met the full disk (it shares it), gave its reserve up to go on, and took it back
        assert "cache disk full: gave up the journal's reserve" in (m.cache_dir / "ckptfs.log").read_text()
        assert os.stat(m.cache_dir / "journal.reserve").st_size == JOURNAL_RESERVE
    finally:
        m.stop()
        if (m.cache_dir / "ckptfs.log").exists():  # kept beside the tmpfs, for a failure's post-mortem
            shutil.copy(m.cache_dir / "ckptfs.log", m.cache_dir.parent / "full-ckptfs.log")
        subprocess.run(["umount", "-l", str(m.cache_dir)], check=False)


@pytest.mark.integration
def test_passthrough_granted_and_refused_one_mode_per_inode(make_mount: Any) -> None:
    # a 64 MiB cache has less room than passthrough_min_room (1 GiB): a writer gets copy mode,
    # where the daemon sees each write and can hold it back
    small = kernel_mount(make_mount, "small", cache_capacity="64MiB", cache_min_free=0)
    data = os.urandom(4 * MiB)
    with open(small.path / "w.bin", "wb") as f:
        f.write(data)
        assert small.status()["passthrough_handles"] == 0
    # a reader of a file that is whole in the cache: passthrough, whatever the room
    with open(small.path / "w.bin", "rb") as f:
        assert small.status()["passthrough_handles"] == 1
        assert f.read() == data
    small.flush()
    assert small.object_sha256("w.bin") == sha256(data)

    m = kernel_mount(make_mount)
    p = m.path / "r.bin"
    p.write_bytes(data)
    m.flush()
    assert m.cli("evict", str(p)).returncode == 0
    # only in the bucket: a reader gets copy mode while the bytes arrive; a writer opened beside
    # it follows the inode's mode (mixing the two on one inode gives EIO in the kernel)
    with open(p, "rb") as r:
        assert m.status()["passthrough_handles"] == 0
        with open(p, "r+b") as w:
            assert m.status()["passthrough_handles"] == 0
            w.write(b"X")
        assert r.read() == b"X" + data[1:]
    # whole in the cache and no handle left: new opens get passthrough again
    with open(p, "rb") as r, open(p, "r+b", buffering=0) as w:
        assert m.status()["passthrough_handles"] == 2
        w.seek(1)
        w.write(b"Y")
        assert r.read() == b"XY" + data[2:]
    m.flush()
    assert m.object_sha256("r.bin") == sha256(b"XY" + data[2:])


@pytest.mark.integration
def test_unmount_with_a_passthrough_writer_open_loses_nothing(make_mount: Any, proxy: FaultProxy) -> None:
    m = kernel_mount(make_mount, endpoint_url=proxy.url, shutdown_timeout=1, connect_timeout=1, read_timeout=2)
    data = os.urandom(5 * MiB)
    f = open(m.path / "open.bin", "wb", buffering=0)
    try:
        f.write(data[:3 * MiB])
        os.fsync(f.fileno())
        f.write(data[3 * MiB:])  # not fsynced: still in the cache file the daemon reads its size from
        assert m.status()["passthrough_handles"] == 1
        proxy.set_mode("refuse")  # nothing reaches the bucket: it all stays in the journal
        proc = m.cli("unmount", "--force", str(m.path))
        assert proc.returncode == 0, proc.stderr
        assert not os.path.ismount(m.path)
        assert "1 file (5.0 MiB)" in proc.stdout and "stay in the journal" in proc.stdout
    finally:
        try:
            f.close()
        except OSError:
            pass  # the mount is gone under it
    proxy.set_mode("pass")
    m.start()  # the journal replays: the file is dirty, with every byte the kernel took
    assert os.stat(m.path / "open.bin").st_size == len(data)
    m.flush()
    assert m.object_sha256("open.bin") == sha256(data)
    assert (m.path / "open.bin").read_bytes() == data


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
