"""POSIX details and names, against a real FUSE mount and a real SeaweedFS server.

What a user (or a POSIX test tool) checks: errno values, stat fields, the bytes
in the bucket, the keys present, what the daemon logs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Mount, sha256_file, wait_for, write_random
from tests.support.faultproxy import FaultProxy
from tests.support.seaweed import SeaweedServer

MiB = 1 << 20
NOBODY = 65534
OTHER_GROUP = 65533  # a group nobody is given as a supplementary one


def err(fn, *args) -> int:  # type: ignore[no-untyped-def]
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return 0


# ---------------------------------------------------------------------- names
def test_names_longer_than_255_bytes_are_enametoolong_everywhere(mount: Mount) -> None:
    long = "n" * 256
    (mount.path / "ok").write_bytes(b"x")
    assert err(os.stat, mount.path / long) == errno.ENAMETOOLONG  # a lookup, not ENOENT
    assert err(os.lstat, mount.path / long) == errno.ENAMETOOLONG
    assert err(open, mount.path / long, "wb") == errno.ENAMETOOLONG
    assert err(os.mkdir, mount.path / long) == errno.ENAMETOOLONG
    assert err(os.rename, mount.path / "ok", mount.path / long) == errno.ENAMETOOLONG
    assert err(os.stat, mount.path / ("é" * 128)) == errno.ENAMETOOLONG  # 256 bytes in UTF-8
    (mount.path / ("n" * 255)).write_bytes(b"y")  # 255 is fine
    assert (mount.path / ("n" * 255)).read_bytes() == b"y"


def test_object_keys_over_1024_bytes_are_refused(mount: Mount) -> None:
    # key = "ckpt/" + path: four 250-byte directories make a 1009-byte key prefix
    d = mount.path
    for i in range(4):
        d = d / (str(i) * 250)
        d.mkdir()
    used = len(mount.key(str(d.relative_to(mount.path))).encode())  # 5 + 4 * 251 - 1 = 1008
    room = 1024 - used - 1  # a file name that just fits after the '/'
    (d / ("f" * room)).write_bytes(b"fits")
    assert err(open, d / ("f" * (room + 1)), "wb") == errno.ENAMETOOLONG
    assert err(os.mkdir, d / ("g" * room)) == errno.ENAMETOOLONG  # its `dir/` marker would be 1025
    os.mkdir(d / ("g" * (room - 1)))
    assert err(os.rename, d / ("f" * room), d / ("h" * (room + 1))) == errno.ENAMETOOLONG
    # a directory rename checks every key below it
    top = mount.path / "top"
    sub = top / ("s" * 100)
    sub.mkdir(parents=True)
    (sub / ("x" * 250)).write_bytes(b"deep")
    dst_parent = mount.path / ("p" * 250) / ("q" * 250) / ("r" * 250)
    dst_parent.mkdir(parents=True)
    # the new directory's own key fits ("ckpt/" + 3 * 251 + "top2/" = 763), the file's below it does not (1114)
    assert err(os.rename, top, dst_parent / "top2") == errno.ENAMETOOLONG
    assert (sub / ("x" * 250)).read_bytes() == b"deep"
    os.rename(sub / ("x" * 250), sub / "x")
    os.rename(top, dst_parent / "top2")  # now every key fits
    mount.flush()
    keys = mount.keys()
    assert mount.key(str((d / ("f" * room)).relative_to(mount.path))) in keys
    assert all(len(k.encode()) <= 1024 for k in keys)


def test_names_the_store_would_change_are_refused(mount: Mount) -> None:
    # SeaweedFS keeps '\' as '/': a file a\b would come back as a directory a/ holding b
    assert err(open, mount.path / "a\\b", "wb") == errno.EINVAL
    assert err(os.mkdir, mount.path / "c\\d") == errno.EINVAL
    (mount.path / "plain").write_bytes(b"p")
    assert err(os.rename, mount.path / "plain", mount.path / "e\\f") == errno.EINVAL
    # characters the store keeps are fine
    (mount.path / "tab\tcolon:star*").write_bytes(b"t")
    mount.flush()
    assert sorted(mount.keys()) == sorted([mount.key("plain"), mount.key("tab\tcolon:star*")])  # the probe left nothing
    log = (mount.cache_dir / "ckptfs.log").read_text()
    assert "refused the name 'a\\\\b'" in log and "'\\\\' -> '/'" in log


# ---------------------------------------------------------------------- times
def test_ctime_never_goes_backwards(mount: Mount) -> None:
    p = mount.path / "t.bin"
    with open(p, "wb") as f:
        f.write(b"x" * 100)
        os.utime(f.fileno(), ns=(1_000_000_000, 1_000_000_000))  # an old mtime
        set_at = os.stat(p).st_ctime_ns
        time.sleep(0.01)
        f.write(b"more")  # a write after it: ctime moves on, never back
        after_write = os.fstat(f.fileno()).st_ctime_ns
    assert after_write >= set_at
    closed = os.stat(p).st_ctime_ns
    assert closed >= after_write and closed > 1_000_000_000 * 2  # close used to set ctime back to the mtime
    checks = []
    with open(p, "r+b") as f:
        before = os.fstat(f.fileno()).st_ctime_ns
        time.sleep(0.01)
        os.ftruncate(f.fileno(), 10)
        checks.append(("ftruncate", before, os.fstat(f.fileno()).st_ctime_ns))
    for name, op in [("chmod", lambda: os.chmod(p, 0o600)), ("chown", lambda: os.chown(p, 0, 0)),
                     ("truncate", lambda: os.truncate(p, 5)), ("rename", lambda: os.rename(p, mount.path / "u.bin")),
                     ("utime", lambda: os.utime(mount.path / "u.bin", ns=(5, 5)))]:
        before = os.stat(mount.path / ("u.bin" if name == "utime" else "t.bin")).st_ctime_ns
        time.sleep(0.01)
        op()
        checks.append((name, before, os.stat(mount.path / ("t.bin" if name in ("chmod", "chown", "truncate") else "u.bin")).st_ctime_ns))
    for name, before, after in checks:
        assert after > before, f"{name} did not move ctime on: {before} -> {after}"
    # the times survive the close and a restart of the daemon (the journal has them)
    st = os.stat(mount.path / "u.bin")
    mount.stop()
    mount.start()
    again = os.stat(mount.path / "u.bin")
    assert (again.st_ctime_ns, again.st_mtime_ns, again.st_atime_ns) == (st.st_ctime_ns, 5, 5)


def test_atime_set_with_utimensat_is_kept_and_reads_follow_relatime(mount: Mount) -> None:
    p = mount.path / "a.bin"
    p.write_bytes(b"data")
    os.utime(p, ns=(1_000_000_000, 2_000_000_000))
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000, 2_000_000_000)
    later = time.time_ns() + 3600 * 10**9
    os.utime(p, ns=(later, 2_000_000_000))  # atime after the mtime and ctime: a read keeps it (relatime)
    assert p.read_bytes() == b"data"
    assert os.stat(p).st_atime_ns == later
    os.utime(p, ns=(1_000_000_000, 2_000_000_000))  # atime before the mtime: the next read updates it
    before = time.time_ns()
    assert p.read_bytes() == b"data"
    # the kernel may answer stat from its attribute cache for ATTR_TIMEOUT (1 s)
    wait_for("the read to update the atime", lambda: os.stat(p).st_atime_ns >= before, timeout=30)
    mount.stop()
    mount.start()
    assert os.stat(p).st_atime_ns >= before


# -------------------------------------------------------------- links, modes
def test_nlink_of_unlinked_open_files_and_of_directories(mount: Mount) -> None:
    d = mount.path / "d"
    d.mkdir()
    assert os.stat(d).st_nlink == 2
    for name in ("a", "b", "c"):
        (d / name).mkdir()
    (d / "file").write_bytes(b"f")
    assert os.stat(d).st_nlink == 5  # 2 + three subdirectories; files do not count
    os.rmdir(d / "c")
    assert os.stat(d).st_nlink == 4
    with open(d / "file", "rb") as f:
        assert os.fstat(f.fileno()).st_nlink == 1
        os.unlink(d / "file")
        st = os.fstat(f.fileno())
        assert st.st_nlink == 0
        assert f.read() == b"f"


def _as_nobody(cwd: Path, script: str) -> subprocess.CompletedProcess[str]:
    """Run a shell command as nobody in `cwd` (entered as root first: the test's tmp dir may be closed to nobody)."""
    return subprocess.run(["/bin/sh", "-c", script], cwd=cwd, user=NOBODY, group=NOBODY, extra_groups=[],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("direct_io", [True, False])
def test_write_by_another_user_clears_setuid_and_setgid(make_mount, direct_io: bool) -> None:  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.skip("needs root to write as another user")
    m: Mount = make_mount(allow_other="true", direct_io_writes=str(direct_io).lower())
    os.chmod(m.path, 0o777)
    p = m.path / "tool"
    p.write_bytes(b"#!/bin/sh\n")
    os.chmod(p, 0o6777)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o6777
    with open(p, "ab") as f:  # root (CAP_FSETID) keeps them
        f.write(b"# root\n")
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o6777
    proc = _as_nobody(m.path, "printf 'echo hi\\n' >> tool")
    assert proc.returncode == 0, proc.stderr
    assert (m.path / "tool").read_bytes().endswith(b"echo hi\n")
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o0777
    m.stop()
    m.start()
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o0777  # in the journal, not only in memory


def _mode_after_the_owners(where: Path, command: list[str], mode: int | None = None, **run: Any) -> int:
    """`command` run as NOBODY in `where` on a file `tool` it owns (given `mode` first): the file's mode after."""
    os.chmod(where, 0o777)
    p = where / "tool"
    p.write_bytes(b"#!/bin/sh\n")
    os.chown(p, NOBODY, NOBODY)
    if mode is not None:
        os.chmod(p, mode)
    proc = subprocess.run(command, cwd=where, user=NOBODY, group=NOBODY, capture_output=True, text=True, timeout=60, **run)
    assert proc.returncode == 0, proc.stderr
    return stat.S_IMODE(os.stat(p).st_mode)


def test_chown_by_the_owner_clears_setuid_and_setgid_as_a_local_file_system_does(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With HANDLE_KILLPRIV_V2 the kernel leaves clearing them on chown/chgrp to the daemon (found by a POSIX conformance run)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    m: Mount = make_mount(allow_other="true")
    local = tmp_path / "local"
    local.mkdir()
    # chgrp to another group of the owner's (a non-root owner may give the file to a group it is in)
    modes = {where: _mode_after_the_owners(where, ["chgrp", str(OTHER_GROUP), "tool"], 0o6555, extra_groups=[OTHER_GROUP])
             for where in (local, m.path)}
    assert modes[local] == 0o555, oct(modes[local])  # what Linux does; the mount must do the same
    assert modes[m.path] == modes[local], (oct(modes[m.path]), oct(modes[local]))
    m.stop()
    m.start()
    st = os.stat(m.path / "tool")
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o555, OTHER_GROUP)  # in the journal


def test_chown_minus_one_minus_one_by_the_owner_clears_setuid_and_setgid_as_linux_does(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 43: the owner (not root) makes its file 06555, then calls chown(path, -1, -1), no change of owner or
    group. Linux's own file systems clear both bits (tmpfs: 06555 -> 0555); the kernel sends it to the daemon as a
    SETATTR that changes nothing, which ckptfs kept as 06555."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    m: Mount = make_mount(allow_other="true")
    local = tmp_path / "local"
    local.mkdir()
    script = "chmod 06555, 'tool' or die $!; chown -1, -1, 'tool' or die $!"  # perl: the venv's python is root's
    modes = {where: _mode_after_the_owners(where, ["perl", "-e", script]) for where in (local, m.path)}
    assert modes[local] == 0o555, oct(modes[local])
    assert modes[m.path] == modes[local], (oct(modes[m.path]), oct(modes[local]))


def test_setuid_dropped_by_every_chgrp_of_a_reused_name(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """pjdfstest chown/00.t's sequence, the name unlinked and created again before each round (as the
    conformance run did): the owner's chown to another of its groups drops setuid/setgid, root sets
    them again, the owner's chgrp back drops them again. Linux's answers are the reference."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    m: Mount = make_mount(allow_other="true")
    local = tmp_path / "local"
    local.mkdir()
    seen: dict[Path, list[tuple[str, ...]]] = {}
    for where in (local, m.path):
        os.chmod(where, 0o777)
        n0 = where / "n0"

        def as_owner(*cmd: str) -> None:
            proc = subprocess.run(cmd, cwd=where, user=NOBODY, group=OTHER_GROUP, extra_groups=[OTHER_GROUP, OTHER_GROUP - 1],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr

        def mode() -> str:
            st = os.lstat(n0)
            return f"{stat.S_IMODE(st.st_mode):o},{st.st_uid},{st.st_gid}"

        rounds = seen[where] = []
        for _ in range(4):
            for owner in ((123, 456), (0, 0), (NOBODY, OTHER_GROUP)):  # the name reused, as chown/00.t does before
                n0.write_bytes(b"")
                os.chown(n0, *owner)
                mode()
                os.unlink(n0)
            n0.write_bytes(b"")
            os.chown(n0, NOBODY, OTHER_GROUP)
            os.chmod(n0, 0o6555)
            first = mode()
            as_owner("chown", f"{NOBODY}:{OTHER_GROUP - 1}", "n0")  # chown(n0, 65534, 65532)
            second = mode()
            os.chmod(n0, 0o6555)
            third = mode()
            as_owner("chgrp", str(OTHER_GROUP), "n0")  # chown(n0, -1, 65533)
            rounds.append((first, second, third, mode()))
            os.unlink(n0)
    want = (f"6555,{NOBODY},{OTHER_GROUP}", f"555,{NOBODY},{OTHER_GROUP - 1}", f"6555,{NOBODY},{OTHER_GROUP - 1}", f"555,{NOBODY},{OTHER_GROUP}")
    assert seen[local] == [want] * 4  # what Linux does
    assert seen[m.path] == seen[local]


# ------------------------------------------------------------------ fallocate
def _fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    if libc.fallocate(fd, mode, offset, length) == 0:
        return 0
    return ctypes.get_errno()


FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10


def test_fallocate_mode_0_grows_a_file_and_other_modes_are_eopnotsupp(mount: Mount) -> None:
    p = mount.path / "pre.bin"
    with open(p, "wb", buffering=0) as f:
        f.write(b"head")
        os.posix_fallocate(f.fileno(), 0, 1 * MiB)  # preallocate, as some checkpoint writers do
        assert os.fstat(f.fileno()).st_size == 1 * MiB
        f.seek(0, os.SEEK_END)
        f.write(b"tail")
        keep = _fallocate(f.fileno(), FALLOC_FL_KEEP_SIZE, 0, 4 * MiB)
        assert keep in (0, errno.EOPNOTSUPP)  # pyfuse3 3.5 has no FALLOCATE: the kernel answers EOPNOTSUPP
        assert os.fstat(f.fileno()).st_size == 1 * MiB + 4
        assert _fallocate(f.fileno(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == errno.EOPNOTSUPP
        assert _fallocate(f.fileno(), FALLOC_FL_ZERO_RANGE, 0, 4096) == errno.EOPNOTSUPP
    data = p.read_bytes()
    assert data[:4] == b"head" and data[-4:] == b"tail" and data[4:-4] == bytes(len(data) - 8)
    mount.flush()
    assert mount.head("pre.bin")["ContentLength"] == 1 * MiB + 4


# ------------------------------------------------- rewritten while uploading
@pytest.mark.parametrize("size, how", [(12 * MiB, "truncate"), (12 * MiB, "in_place"), (30 * MiB, "in_place")])  # PutObject, multipart
def test_file_rewritten_while_it_uploads_is_not_an_upload_error(make_mount, s3: SeaweedServer, how: str, size: int) -> None:  # type: ignore[no-untyped-def]
    proxy = FaultProxy(s3.s3_port)
    try:
        proxy.set_mode("pass", rate=4 * MiB)  # slow enough to rewrite the file half way
        m: Mount = make_mount(endpoint_url=proxy.url, part_size="5MiB", multipart_threshold="16MiB", upload_delay=0.1,
                              max_parts_in_flight=2)
        write_random(m.path / "ckpt.bin", size, seed=1, fsync=False)
        wait_for("the upload to start", lambda: proxy.bytes_up > 3 * MiB)
        if how == "truncate":
            final = write_random(m.path / "ckpt.bin", size, seed=2, fsync=False)  # torch.save: O_TRUNC, write, close
        else:
            with open(m.path / "ckpt.bin", "r+b") as f:  # the same size, other bytes
                f.write(os.urandom(size))
            final = sha256_file(m.path / "ckpt.bin")
        proxy.set_mode("pass", rate=0)
        m.flush(timeout=120)  # the flush waits only for the newest version
        assert m.object_sha256("ckpt.bin") == final
        assert sha256_file(m.path / "ckpt.bin") == final
        st = m.status()
        log = (m.cache_dir / "ckptfs.log").read_text()
        assert st["upload_errors_total"] == 0, st["last_error"]
        assert st["last_error"] == ""
        assert "abandoned" in log and "retry in" not in log
    finally:
        proxy.close()
