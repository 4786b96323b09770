"""The kernel transport (gateway/fuse/kernel.py) against the real kernel: passthrough granted
and refused, the per-inode mode rule, fsync, size while open, mmap, O_APPEND, truncate,
the namespace requests, interrupts. A tiny filesystem defined here keeps each file's bytes in
a real backing file (named by inode), like ckptfs's cache.

Needs root (mount(2) and the backing-file ioctls need CAP_SYS_ADMIN); passthrough tests also
need a kernel that offers FUSE_PASSTHROUGH (Linux >= 6.9). No timed assertions: waits only
guard against a hang.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import signal
import stat
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import trio

from ckptfs.fuse import kernel
from ckptfs.fuse.ops import Attr, OpenReply, Operations, RequestContext, SetattrFields, StatFs
from ckptfs.fuse.abi import Op

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/dev/fuse", os.R_OK | os.W_OK),
    reason="the kernel transport mounts with mount(2): needs root and /dev/fuse",
)

MiB = 1 << 20
HANG_GUARD = 60  # seconds; only stops a broken test from hanging the suite


@dataclass
class Node:
    ino: int
    mode: int
    parent: int
    name: bytes
    children: dict[bytes, int] = field(default_factory=dict)
    xattrs: dict[bytes, bytes] = field(default_factory=dict)
    target: bytes = b""
    mtime_ns: int = 0


class BackingFS(Operations):
    """Directories in memory, each regular file's bytes in `backing/<ino>`.

    `offer(ino, flags)` decides whether an open offers passthrough (default: always)."""

    def __init__(self, backing: str, offer: Callable[[int, int], bool] | None = None, direct_io: bool = False) -> None:
        self.backing = backing
        self.offer = offer or (lambda ino, flags: True)
        self.direct_io = direct_io
        now = time.time_ns()
        self.nodes: dict[int, Node] = {1: Node(1, stat.S_IFDIR | 0o755, 1, b"", mtime_ns=now)}
        self.next_ino = 2
        self.handles: dict[int, tuple[int, int]] = {}  # fh -> (ino, fd)
        self.next_fh = 1
        self.lookups: Counter[int] = Counter()
        self.calls: Counter[str] = Counter()
        self.fsynced: list[int] = []
        self.passthrough: dict[int, bool] = {}
        self.slow_lookup: trio.Event | None = None  # set: the next lookup of b"slow" waits
        self.cancelled = trio.Event()

    # --------------------------------------------------------------- helpers
    def path(self, ino: int) -> str:
        return os.path.join(self.backing, str(ino))

    def attr(self, ino: int) -> Attr:
        n = self.nodes[ino]
        a = Attr(ino=ino, mode=n.mode, nlink=2 if stat.S_ISDIR(n.mode) else 1, uid=0, gid=0,
                 atime_ns=n.mtime_ns, mtime_ns=n.mtime_ns, ctime_ns=n.mtime_ns)
        if stat.S_ISREG(n.mode):
            # while open, the kernel writes the backing file behind our back: ask it
            fds = [fd for i, fd in self.handles.values() if i == ino]
            st = os.fstat(fds[0]) if fds else os.stat(self.path(ino))
            a.size, a.blocks = st.st_size, st.st_blocks
            a.mtime_ns, a.ctime_ns, a.atime_ns = st.st_mtime_ns, st.st_ctime_ns, st.st_atime_ns
        elif stat.S_ISLNK(n.mode):
            a.size = len(n.target)
        return a

    def child(self, parent: int, name: bytes) -> Node:
        p = self.nodes[parent]
        if not stat.S_ISDIR(p.mode):
            raise OSError(errno.ENOTDIR, "not a directory")
        if name not in p.children:
            raise OSError(errno.ENOENT, "no such entry")
        return self.nodes[p.children[name]]

    def new(self, parent: int, name: bytes, mode: int) -> Node:
        p = self.nodes[parent]
        if name in p.children:
            raise OSError(errno.EEXIST, "exists")
        n = Node(self.next_ino, mode, parent, name, mtime_ns=time.time_ns())
        self.next_ino += 1  # never reused
        self.nodes[n.ino] = n
        p.children[name] = n.ino
        if stat.S_ISREG(mode):
            open(self.path(n.ino), "wb").close()
        return n

    def entry(self, ino: int) -> Attr:
        self.lookups[ino] += 1
        return self.attr(ino)

    def handle(self, ino: int, flags: int) -> OpenReply:
        acc = flags & os.O_ACCMODE
        fd = os.open(self.path(ino), (os.O_RDWR if acc != os.O_RDONLY else os.O_RDONLY) | (flags & os.O_APPEND))
        if flags & os.O_TRUNC and acc != os.O_RDONLY:
            os.ftruncate(fd, 0)
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = (ino, fd)
        return OpenReply(fh, direct_io=self.direct_io, passthrough_fd=fd if self.offer(ino, flags) else None)

    # ------------------------------------------------------------ operations
    async def lookup(self, parent: int, name: bytes, ctx: RequestContext) -> Attr:
        self.calls["lookup"] += 1
        if name == b"slow" and self.slow_lookup is not None:
            self.slow_lookup.set()
            self.slow_lookup = None
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                self.cancelled.set()
                raise
        return self.entry(self.child(parent, name).ino)

    def ref(self, ino: int) -> None:
        self.lookups[ino] += 1

    async def forget(self, items: list[tuple[int, int]]) -> None:
        for ino, n in items:
            self.lookups[ino] -= n

    async def getattr(self, ino: int, fh: int | None, ctx: RequestContext) -> Attr:
        return self.attr(ino)

    async def setattr(self, ino: int, f: SetattrFields, ctx: RequestContext) -> Attr:
        n = self.nodes[ino]
        if f.size is not None:
            os.truncate(self.path(ino), f.size)
        if f.mode is not None:
            n.mode = stat.S_IFMT(n.mode) | (f.mode & 0o7777)
        if f.mtime_ns is not None:
            n.mtime_ns = f.mtime_ns
            if stat.S_ISREG(n.mode):
                os.utime(self.path(ino), ns=(f.atime_ns or f.mtime_ns, f.mtime_ns))
        return self.attr(ino)

    async def mkdir(self, parent: int, name: bytes, mode: int, ctx: RequestContext) -> Attr:
        return self.entry(self.new(parent, name, stat.S_IFDIR | (mode & 0o7777)).ino)

    async def mknod(self, parent: int, name: bytes, mode: int, rdev: int, ctx: RequestContext) -> Attr:
        if not stat.S_ISREG(mode):
            raise OSError(errno.EPERM, "regular files only")
        return self.entry(self.new(parent, name, mode).ino)

    async def symlink(self, parent: int, name: bytes, target: bytes, ctx: RequestContext) -> Attr:
        n = self.new(parent, name, stat.S_IFLNK | 0o777)
        n.target = target
        return self.entry(n.ino)

    async def readlink(self, ino: int, ctx: RequestContext) -> bytes:
        return self.nodes[ino].target

    async def unlink(self, parent: int, name: bytes, ctx: RequestContext) -> None:
        n = self.child(parent, name)
        if stat.S_ISDIR(n.mode):
            raise OSError(errno.EISDIR, "is a directory")
        del self.nodes[parent].children[name]

    async def rmdir(self, parent: int, name: bytes, ctx: RequestContext) -> None:
        n = self.child(parent, name)
        if n.children:
            raise OSError(errno.ENOTEMPTY, "not empty")
        del self.nodes[parent].children[name]

    async def rename(self, po: int, no: bytes, pn: int, nn: bytes, flags: int, ctx: RequestContext) -> None:
        n = self.child(po, no)
        if nn in self.nodes[pn].children:
            if flags & 1:  # RENAME_NOREPLACE
                raise OSError(errno.EEXIST, "exists")
        del self.nodes[po].children[no]
        self.nodes[pn].children[nn] = n.ino
        n.parent, n.name = pn, nn

    async def statfs(self, ctx: RequestContext) -> StatFs:
        return StatFs(blocks=1000, bfree=500, bavail=400, files=100, ffree=50)

    async def create(self, parent: int, name: bytes, mode: int, flags: int, ctx: RequestContext) -> tuple[OpenReply, Attr]:
        n = self.new(parent, name, stat.S_IFREG | (mode & 0o7777))
        return self.handle(n.ino, flags), self.entry(n.ino)

    async def open(self, ino: int, flags: int, ctx: RequestContext) -> OpenReply:
        return self.handle(ino, flags)

    def opened(self, fh: int, passthrough: bool) -> None:
        self.passthrough[fh] = passthrough

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        self.calls["read"] += 1
        return os.pread(self.handles[fh][1], size, offset)

    async def write(self, fh: int, offset: int, data: memoryview) -> int:
        self.calls["write"] += 1
        return os.pwrite(self.handles[fh][1], data, offset)

    async def fsync(self, fh: int, datasync: bool) -> None:
        # passthrough: the kernel does not fsync the backing file, the filesystem must
        await trio.to_thread.run_sync(os.fsync, self.handles[fh][1])
        self.fsynced.append(fh)

    async def release(self, fh: int) -> None:
        os.close(self.handles.pop(fh)[1])

    async def opendir(self, ino: int, ctx: RequestContext) -> int:
        if not stat.S_ISDIR(self.nodes[ino].mode):
            raise OSError(errno.ENOTDIR, "not a directory")
        return ino

    async def readdir(self, fh: int, offset: int, plus: bool, ctx: RequestContext) -> list[tuple[bytes, Attr, int]]:
        names = sorted(self.nodes[fh].children.items())
        return [(name, self.attr(ino), i + 1) for i, (name, ino) in enumerate(names) if i >= offset]

    async def getxattr(self, ino: int, name: bytes, ctx: RequestContext) -> bytes:
        try:
            return self.nodes[ino].xattrs[name]
        except KeyError:
            raise OSError(errno.ENODATA, "no attribute") from None

    async def listxattr(self, ino: int, ctx: RequestContext) -> list[bytes]:
        return sorted(self.nodes[ino].xattrs)

    async def setxattr(self, ino: int, name: bytes, value: bytes, flags: int, ctx: RequestContext) -> None:
        self.nodes[ino].xattrs[name] = value

    async def removexattr(self, ino: int, name: bytes, ctx: RequestContext) -> None:
        if self.nodes[ino].xattrs.pop(name, None) is None:
            raise OSError(errno.ENODATA, "no attribute")

    async def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        if mode:
            raise OSError(errno.EOPNOTSUPP, "plain allocation only")
        os.posix_fallocate(self.handles[fh][1], offset, length)


# ---------------------------------------------------------------------- harness
def run_mounted(tmp_path: Any, body: Callable[[str, BackingFS, kernel.KernelSession], None], *,
                fs_kwargs: dict[str, Any] | None = None, **session_kwargs: Any) -> tuple[BackingFS, kernel.KernelSession]:
    """Mount a BackingFS with the kernel transport and run the blocking `body(mnt, fs, session)`
    in a worker thread (the daemon serves on the trio thread meanwhile), then unmount."""
    backing = tmp_path / "backing"
    mnt = tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    fs = BackingFS(str(backing), **(fs_kwargs or {}))
    out: dict[str, Any] = {}

    async def main() -> None:
        async with kernel.mounted(fs, str(mnt), probe_dir=str(backing), **session_kwargs) as s:
            out["s"] = s
            with trio.fail_after(HANG_GUARD * 5):
                await trio.to_thread.run_sync(body, str(mnt), fs, s)
        assert not os.path.ismount(mnt)

    trio.run(main)
    return fs, out["s"]


def run_libfuse(tmp_path: Any, body: Callable[[str, BackingFS, Any], None]) -> BackingFS:
    """The same filesystem served by pyfuse3 through the adapter."""
    from ckptfs.fuse import libfuse

    backing = tmp_path / "backing"
    mnt = tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    fs = BackingFS(str(backing))

    async def main() -> None:
        async with libfuse.mounted(fs, str(mnt), ["fsname=ckptfs-test"]) as adapter:
            with trio.fail_after(HANG_GUARD * 5):
                await trio.to_thread.run_sync(body, str(mnt), fs, adapter)
        assert not os.path.ismount(mnt)

    trio.run(main)
    return fs


def need_passthrough(s: kernel.KernelSession) -> None:
    if not s.passthrough:
        pytest.skip(f"passthrough not available: {s.passthrough_error}")


def backing_bytes(fs: BackingFS, name: str) -> bytes:
    with open(fs.path(fs.nodes[1].children[name.encode()]), "rb") as f:
        return f.read()


# ------------------------------------------------------------------------ tests
def test_passthrough_write_fsync_size_while_open(tmp_path: Any) -> None:
    data = os.urandom(3 * MiB + 123)

    def body(mnt: str, fs: BackingFS, s: kernel.KernelSession) -> None:
        need_passthrough(s)
        p = os.path.join(mnt, "ckpt.bin")
        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            assert s.passthrough_handles == 1
            for off in range(0, len(data), MiB):
                os.write(fd, data[off:off + MiB])
            assert os.stat(p).st_size == len(data)  # GETATTR answered from the backing file
            os.fsync(fd)
            assert fs.fsynced, "FSYNC must reach the daemon, which fsyncs the backing file"
        finally:
            os.close(fd)
        with open(p, "rb") as f:
            assert f.read() == data
        assert backing_bytes(fs, "ckpt.bin") == data

    fs, s = run_mounted(tmp_path, body)
    assert s.counts[Op.WRITE] == 0 and fs.calls["write"] == 0
    assert s.counts[Op.READ] == 0 and fs.calls["read"] == 0
    assert s.counts[Op.FSYNC] >= 1
    assert s.passthrough_handles == 0 and not fs.handles


def test_passthrough_mmap_append_truncate(tmp_path: Any) -> None:
    def body(mnt: str, fs: BackingFS, s: kernel.KernelSession) -> None:
        need_passthrough(s)
        p = os.path.join(mnt, "m.bin")
        with open(p, "wb") as f:
            f.truncate(MiB)
        with open(p, "r+b") as f:
            with mmap.mmap(f.fileno(), MiB, mmap.MAP_SHARED) as m:
                m[:5] = b"hello"
                m[MiB - 3:] = b"end"
                m.flush()
        got = backing_bytes(fs, "m.bin")
        assert got[:5] == b"hello" and got[-3:] == b"end" and len(got) == MiB

        a = os.path.join(mnt, "a.log")
        for i in range(3):
            with open(a, "ab") as f:
                f.write(b"line%d\n" % i)
        assert backing_bytes(fs, "a.log") == b"line0\nline1\nline2\n"

        os.truncate(a, 6)  # SETATTR size, no handle
        assert os.stat(a).st_size == 6
        with open(a, "r+b") as f:
            f.truncate(2)  # ftruncate on a passthrough handle
            assert os.fstat(f.fileno()).st_size == 2
        assert backing_bytes(fs, "a.log") == b"li"
        with open(a, "wb") as f:  # O_TRUNC
            f.write(b"new")
        assert backing_bytes(fs, "a.log") == b"new"

    fs, s = run_mounted(tmp_path, body)
    assert s.counts[Op.WRITE] == 0 and s.counts[Op.READ] == 0


def test_copy_mode_when_passthrough_refused(tmp_path: Any) -> None:
    data = os.urandom(2 * MiB + 7)

    def body(mnt: str, fs: BackingFS, s: kernel.KernelSession) -> None:
        assert not s.passthrough
        p = os.path.join(mnt, "copy.bin")
        with open(p, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        assert s.passthrough_handles == 0
        with open(p, "rb") as f:
            assert f.read() == data

    fs, s = run_mounted(tmp_path, body, passthrough=False)
    assert s.counts[Op.WRITE] > 0 and fs.calls["write"] > 0
    assert backing_bytes(fs, "copy.bin") == data
    assert not any(fs.passthrough.values())


def test_copy_mode_direct_io_threads_reader(tmp_path: Any) -> None:
    data = os.urandom(MiB + 1)

    def body(mnt: str, fs: BackingFS, s: kernel.KernelSession) -> None:
        with open(os.path.join(mnt, "d.bin"), "wb") as f:
            f.write(data)
        with open(os.path.join(mnt, "d.bin"), "rb") as f:
            assert f.read() == data

    fs, s = run_mounted(tmp_path, body, passthrough=False, reader="workers", workers=3,
                        fs_kwargs={"direct_io": True})
    assert s.counts[Op.WRITE] > 0 and s.counts[Op.READ] > 0
    assert backing_bytes(fs, "d.bin") == data


def _released(s: kernel.KernelSession, path: str) -> None:
    """Wait until the daemon has handled the RELEASE of every handle of `path`: close(2) does not
    wait for it, and an OPEN that overtakes it (the kernel sends both; the copy workers start each
    in a task of its own) still finds the inode in its old mode, which is legal but not what the
    test is about."""
    ino = os.stat(path).st_ino
    deadline = time.monotonic() + HANG_GUARD
    while s.modes.mode_of(ino) is not None:
        assert time.monotonic() < deadline, "the RELEASE never came"
        time.sleep(0.01)


def test_mode_rule_passthrough_first(tmp_path: Any) -> None:
    """A write handle in passthrough, then a read handle the filesystem wanted in copy mode:
    the inode stays in passthrough (same backing id) until its last release."""
    writes_only = lambda ino, flags: (flags & os.O_ACCMODE) != os.O_RDONLY  # noqa: E731

    def body(mnt: str, fs: BackingFS, s: kernel.KernelSession) -> None:
        need_passthrough(s)
        p = os.path.join(mnt, "f")
        w = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(w, b"abc")
        r = os.open(p, os.O_RDONLY)  # no EIO: the transport keeps the inode in passthrough
        assert os.read(r, 10) == b"abc"
        assert s.passthrough_handles == 2
        assert list(fs.passthrough.values()) == [True, True]
        os.close(w)
        os.close(r)
        _released(s, p)
        # all closed and released: the next read-only open decides afresh (copy mode)
        with open(p, "rb") as f:
            assert f.read() == b"abc"
        assert list(fs.passthrough.values()) == [True, True, False]

    fs, s = run_mounted(tmp_path, body, fs_kwargs={"offer": writes_only})
    assert s.counts[Op.WRITE] == 0
    assert s.counts[Op.READ] >= 1  # only the last, copy-mode open read through the daemon


def test_mode_rule_copy_first(tmp_path: Any) -> None:
    """A cached copy-mode read handle first: a later write handle offered passthrough gets copy
    mode (a passthrough open next to a cached one would fail with EIO)."""
    writes_only = lambda ino, flags: (flags & os.O_ACCMODE) != os.O_RDONLY  # noqa: E731

    def body(mnt: str, fs: BackingFS, s: kernel.KernelSession) -> None:
        need_passthrough(s)
        p = os.path.join(mnt, "g")
        with open(p, "wb") as f:
            f.write(b"old")
        _released(s, p)
        r = os.open(p, os.O_RDONLY)
        assert os.read(r, 10) == b"old"
        w = os.open(p, os.O_WRONLY)
        os.pwrite(w, b"NEW", 0)
        os.close(w)
        os.close(r)
        assert s.modes.refused == 1
        assert backing_bytes(fs, "g") == b"NEW"

    fs, s = run_mounted(tmp_path, body, fs_kwargs={"offer": writes_only})
    assert s.counts[Op.WRITE] == 1


def test_namespace_requests(tmp_path: Any) -> None:
    def body(mnt: str, fs: BackingFS, s: kernel.KernelSession) -> None:
        d = os.path.join(mnt, "dir")
        os.mkdir(d)
        for i in range(50):  # enough for more than one READDIRPLUS reply
            open(os.path.join(d, f"file-with-a-longish-name-{i:03d}"), "w").close()
        assert sorted(os.listdir(d)) == [f"file-with-a-longish-name-{i:03d}" for i in range(50)]
        os.rename(os.path.join(d, "file-with-a-longish-name-000"), os.path.join(mnt, "moved"))
        assert os.path.exists(os.path.join(mnt, "moved"))
        os.unlink(os.path.join(mnt, "moved"))
        assert not os.path.exists(os.path.join(mnt, "moved"))
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)
        with pytest.raises(FileNotFoundError):
            os.stat(d)
        os.symlink("target", os.path.join(mnt, "ln"))
        assert os.readlink(os.path.join(mnt, "ln")) == "target"
        f = os.path.join(mnt, "x")
        open(f, "w").close()
        os.setxattr(f, "user.k", b"v")
        assert os.getxattr(f, "user.k") == b"v"
        assert os.listxattr(f) == ["user.k"]
        os.removexattr(f, "user.k")
        with pytest.raises(OSError) as e:
            os.getxattr(f, "user.k")
        assert e.value.errno == errno.ENODATA
        os.chmod(f, 0o600)
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
        os.utime(f, ns=(1_000_000_000, 2_000_000_123))
        assert os.stat(f).st_mtime_ns == 2_000_000_123
        sv = os.statvfs(mnt)
        assert (sv.f_blocks, sv.f_bfree, sv.f_bavail) == (1000, 500, 400)
        with pytest.raises(OSError) as e:
            os.link(f, os.path.join(mnt, "hard"))  # not implemented: ENOSYS, which the kernel reports as EPERM
        assert e.value.errno == errno.EPERM
        with open(f, "r+b") as fh:
            os.posix_fallocate(fh.fileno(), 0, 8192)
        assert os.stat(f).st_size == 8192

    fs, s = run_mounted(tmp_path, body)
    assert s.counts[Op.READDIRPLUS] + s.counts[Op.READDIR] >= 2


def test_interrupt_cancels_the_request(tmp_path: Any) -> None:
    """A signal to a process waiting in the filesystem: the kernel sends INTERRUPT, the
    transport cancels that request's task and answers EINTR; the loop goes on."""
    fs, s = run_mounted(tmp_path, _interrupted_stat)
    assert s.counts[Op.INTERRUPT] >= 1


def _interrupted_stat(mnt: str, fs: BackingFS, s: kernel.KernelSession) -> None:
    started = trio.from_thread.run_sync(lambda: _arm(fs))
    code = ("import os, signal, sys\n"
            "signal.signal(signal.SIGUSR1, lambda *a: None)\n"
            f"try:\n    os.stat({os.path.join(mnt, 'slow')!r})\n"
            "except InterruptedError:\n    sys.exit(4)\n"
            "except FileNotFoundError:\n    sys.exit(2)\n")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        trio.from_thread.run(_wait, started)
        child.send_signal(signal.SIGUSR1)
        trio.from_thread.run(_wait, fs.cancelled)
        assert child.wait(HANG_GUARD) == 4  # EINTR reached the caller
    finally:
        child.kill()
    open(os.path.join(mnt, "after"), "w").close()  # the loop still serves


def _arm(fs: BackingFS) -> trio.Event:
    fs.slow_lookup = trio.Event()
    return fs.slow_lookup


async def _wait(event: trio.Event) -> None:
    with trio.fail_after(HANG_GUARD):
        await event.wait()


def _file_roundtrip(mnt: str, fs: BackingFS, _: Any) -> None:
    data = os.urandom(MiB + 5)
    os.mkdir(os.path.join(mnt, "d"))
    p = os.path.join(mnt, "d", "f.bin")
    with open(p + ".tmp", "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
        assert os.fstat(f.fileno()).st_size == len(data)
    os.rename(p + ".tmp", p)
    with open(p, "rb") as f:
        assert f.read() == data
    assert os.listdir(os.path.join(mnt, "d")) == ["f.bin"]
    assert fs.fsynced


@pytest.mark.parametrize("transport", ["kernel-passthrough", "kernel-copy", "libfuse"])
def test_one_filesystem_behind_every_transport(tmp_path: Any, transport: str) -> None:
    if transport == "libfuse":
        fs = run_libfuse(tmp_path, _file_roundtrip)
        assert fs.calls["write"] > 0
        assert not any(fs.passthrough.values())
        return
    fs, s = run_mounted(tmp_path, _file_roundtrip, passthrough=transport == "kernel-passthrough")
    if transport == "kernel-passthrough" and s.passthrough:
        assert fs.calls["write"] == 0
    else:
        assert fs.calls["write"] > 0


@pytest.mark.parametrize("workers", [1, 3])
def test_interrupt_with_copy_workers(tmp_path: Any, workers: int) -> None:
    """With several copy workers the INTERRUPT may be read by another worker than its request:
    still EINTR."""
    def body(mnt: str, fs: BackingFS, s: kernel.KernelSession) -> None:
        assert s.workers == workers
        _interrupted_stat(mnt, fs, s)

    fs, s = run_mounted(tmp_path, body, passthrough=False, workers=workers)
    assert s.counts[Op.INTERRUPT] >= 1


# ----------------------------------------- ckptfs itself in copy mode, with several copy workers
COPY_MODE = {"fuse_transport": "kernel", "fuse_passthrough": "false", "fuse_workers": "4"}


@pytest.mark.one_transport
def test_copy_workers_parallel_writers_reach_the_bucket_intact(make_mount: Any) -> None:
    """Several writers at once, odd write sizes, through 4 copy workers: the bytes in the bucket and
    read back through the mount are the written ones; the status says copy mode with 4 workers."""
    import concurrent.futures

    from tests.conftest import sha256_file, write_random

    m = make_mount(**COPY_MODE)
    st = m.status()
    assert st["fuse_transport"] == "kernel" and not st["passthrough"] and st["fuse_workers"] == 4
    sizes = {f"w{i}.bin": (9 * MiB + 4097 * i, [MiB, 3 * MiB + 1, 65536 + 17, 2 * MiB][i % 4]) for i in range(6)}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = {name: pool.submit(write_random, m.path / name, size, seed=i, chunk=chunk)
                   for i, (name, (size, chunk)) in enumerate(sizes.items())}
        digests = {name: f.result() for name, f in futures.items()}
    st = m.status()
    assert st["passthrough_handles"] == 0 and st["fuse_workers"] == 4
    for name, (size, _) in sizes.items():
        assert os.stat(m.path / name).st_size == size
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # cached reads, served by the workers too
        assert dict(zip(digests, pool.map(lambda n: sha256_file(m.path / n), digests))) == digests
    m.flush()
    for name, digest in digests.items():
        assert m.object_sha256(name) == digest


_STALLED_WRITER = r"""
import ctypes, errno, os, signal, sys
signal.signal(signal.SIGUSR1, lambda *a: None)
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
buf = os.urandom(1 << 20)
for _ in range(64):  # past the cache: it waits for room that never comes
    if libc.write(fd, buf, len(buf)) < 0:
        sys.exit(4 if ctypes.get_errno() == errno.EINTR else 3)
sys.exit(0)
"""


@pytest.mark.one_transport
def test_copy_workers_full_cache_waits_then_interrupt_gives_eintr(make_mount: Any) -> None:
    """A write waiting for room (nothing drains) is answered EINTR when its writer gets a signal;
    the mount goes on serving."""
    from tests.conftest import wait_for, write_random

    m = make_mount(cache_capacity="40MiB", cache_min_free=0, upload_delay=3600, write_stall_timeout=600, **COPY_MODE)
    write_random(m.path / "a.bin", 30 * MiB, seed=1)
    child = subprocess.Popen([sys.executable, "-c", _STALLED_WRITER, str(m.path / "stalled.bin")])
    try:
        wait_for("the writer waiting for room", lambda: m.status()["stalled_writers"] >= 1 or child.poll() is not None)
        assert child.poll() is None
        child.send_signal(signal.SIGUSR1)
        assert child.wait(HANG_GUARD) == 4  # EINTR reached the writer
    finally:
        child.kill()
    wait_for("no writer waiting", lambda: m.status()["stalled_writers"] == 0)
    assert (m.path / "a.bin").stat().st_size == 30 * MiB


@pytest.mark.one_transport
def test_copy_workers_full_cache_gives_enospc(make_mount: Any) -> None:
    """Dirty data up to the capacity: the next writer waits, then gets ENOSPC; what was acknowledged drains intact."""
    from tests.conftest import write_random

    m = make_mount(cache_capacity="40MiB", cache_min_free=0, upload_delay=3600, write_stall_timeout=2, **COPY_MODE)
    digests = {f"s{i}.bin": write_random(m.path / f"s{i}.bin", 12 * MiB, seed=i) for i in range(3)}
    with pytest.raises(OSError) as e:
        write_random(m.path / "overflow.bin", 12 * MiB, seed=9)
    assert e.value.errno == errno.ENOSPC
    st = m.status()
    assert st["enospc_total"] >= 1 and st["write_stalls_total"] >= 1 and st["dirty_bytes"] <= 40 * MiB
    assert st["fuse_workers"] == 4 and not st["passthrough"]
    os.unlink(m.path / "overflow.bin")
    m.flush()
    for name, digest in digests.items():
        assert m.object_sha256(name) == digest


@pytest.mark.one_transport
def test_copy_workers_never_change_a_file_the_journal_calls_durable(make_mount: Any) -> None:
    """A durable file rewritten in place through the copy workers, the daemon killed (kill -9) right after
    the write returned: what the write acknowledged is in the bucket after a remount. Made deterministic
    by holding the journal's write lock (another SQLite connection) while the write is served: a write
    whose file is not dirty in the journal first must fail, not change bytes the journal calls durable."""
    import sqlite3
    import threading

    from tests.conftest import mount_is_dead, sha256_file, wait_for, write_random

    m = make_mount(**COPY_MODE)
    p = m.path / "model.pt"
    write_random(p, 4 * MiB, seed=3)
    m.flush()
    old = p.read_bytes()
    new = os.urandom(MiB)
    fd = os.open(p, os.O_WRONLY)  # in place: no O_TRUNC
    journal = sqlite3.connect(m.cache_dir / "journal.sqlite3", isolation_level=None)
    outcome: list[int] = []
    try:
        journal.execute("BEGIN IMMEDIATE")  # no journal write of the daemon's succeeds until we let go

        def rewrite() -> None:
            try:
                outcome.append(os.pwrite(fd, new, 0))
            except OSError as e:
                outcome.append(-(e.errno or 1))

        writer = threading.Thread(target=rewrite)
        writer.start()
        writer.join(HANG_GUARD * 2)
        assert outcome, "the write never returned"
        os.kill(m.status()["pid"], signal.SIGKILL)
        wait_for("the mount to die", lambda: mount_is_dead(m.path), timeout=60)
    finally:
        journal.close()
        try:
            os.close(fd)
        except OSError:
            pass
    m.stop()
    m.start()
    m.flush()
    expected = new + old[MiB:] if outcome[0] == MiB else old  # acknowledged: in the bucket; refused: nothing changed
    assert outcome[0] in (MiB, -errno.EIO), outcome
    digest = hashlib.sha256(expected).hexdigest()
    assert m.object_sha256("model.pt") == digest
    assert sha256_file(p) == digest
