"""fs.py under FUSE passthrough, without a mount: the kernel's writes are simulated by writing
the cache file through the offered fd, as the kernel does; no `write` call reaches CkptFS.

What must hold: the file is dirty (a new version) from the writer's open, its size and mtime
come from the cache file while open and are recorded on fsync and on the last release (which
makes it due for upload), the cache accounts the bytes, and handles that must stay in copy
mode are not offered passthrough.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

import trio

from ckptfs.fs import CkptFS
from ckptfs.fuse.ops import RequestContext
from ckptfs.journal import DIRTY, ROOT_INODE
from tests.unit.test_journal import make_ns, write_file

ROOT = RequestContext(0, 0, 1)


def test_passthrough_writer_is_tracked_without_write_requests(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    reply, attr = trio.run(fs.create, ROOT_INODE, b"ckpt.bin", stat.S_IFREG | 0o644, os.O_WRONLY, ROOT)
    assert reply.passthrough_fd is not None
    fs.opened(reply.fh, True)
    assert fs.passthrough_handles == 1
    version_at_open = ns.files.live[attr.ino].version
    os.pwrite(reply.passthrough_fd, b"x" * 5000, 0)  # the kernel writing the cache file
    got = trio.run(fs.getattr, attr.ino, None, ROOT)
    assert got.size == 5000  # from the cache file while it is open
    trio.run(fs.fsync, reply.fh, False)
    row = ns.journal.get(attr.ino)
    assert row is not None and row.size == 5000 and row.state == DIRTY
    os.pwrite(reply.passthrough_fd, b"y" * 100, 5000)
    trio.run(fs.release, reply.fh)
    row = ns.journal.get(attr.ino)
    assert row is not None and row.size == 5100 and row.closed_at is not None
    assert row.version > version_at_open
    assert ns.cache.used_bytes == 5100
    assert fs.passthrough_handles == 0


def test_getattr_and_absent_xattrs_answer_at_once_for_a_passthrough_writer(tmp_path: Path) -> None:
    """The kernel transport answers GETATTR and GETXATTR without a task (`getattr_now`, `getxattr_now`): for
    a file the kernel writes itself the size is the cache file's, security.capability is ENODATA, ckptfs's
    own names go to the coroutine (None), and each request answered is counted once."""
    from ckptfs.metrics import FUSE_COUNTERS

    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    reply, attr = trio.run(fs.create, ROOT_INODE, b"ckpt.bin", stat.S_IFREG | 0o644, os.O_WRONLY, ROOT)
    fs.opened(reply.fh, True)
    assert reply.passthrough_fd is not None
    getattrs, getxattrs = FUSE_COUNTERS.requests["getattr"], FUSE_COUNTERS.requests["getxattr"]
    for n in (1, 2):
        os.pwrite(reply.passthrough_fd, b"x" * (1 << 20), (n - 1) << 20)  # the kernel writing the cache file
        got = fs.getattr_now(attr.ino, reply.fh, ROOT)
        assert got is not None and got.size == n << 20 and got.mode == stat.S_IFREG | 0o644
        try:
            fs.getxattr_now(attr.ino, b"security.capability", ROOT)
            raise AssertionError("security.capability answered")
        except OSError as e:
            assert e.errno == errno.ENODATA
    assert fs.getxattr_now(attr.ino, b"user.ckptfs.state", ROOT) is None
    assert trio.run(fs.getxattr, attr.ino, b"user.ckptfs.state", ROOT) == b"dirty"
    assert FUSE_COUNTERS.requests["getattr"] - getattrs == 2
    assert FUSE_COUNTERS.requests["getxattr"] - getxattrs == 3  # two absent, one state (counted by the coroutine)
    try:
        fs.getattr_now(987654, None, ROOT)
        raise AssertionError("a missing inode answered")
    except OSError as e:
        assert e.errno == errno.ENOENT
    trio.run(fs.release, reply.fh)


def test_rewrite_of_a_closed_file_counts_as_modified_from_open(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    ino = write_file(ns, ROOT_INODE, "f", b"abc")
    before = ns.journal.get(ino)
    assert before is not None
    reply = trio.run(fs.open, ino, os.O_RDWR, ROOT)
    fs.opened(reply.fh, True)
    assert ns.files.live[ino].version > before.version  # an upload in flight is now stale
    trio.run(fs.release, reply.fh)
    after = ns.journal.get(ino)
    assert after is not None and after.state == DIRTY and after.size == 3


def test_copy_mode_for_handles_that_need_the_daemon(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    ino = write_file(ns, ROOT_INODE, "tool", b"#!/bin/sh\n")
    ns.tree.setattr(ino, mode=stat.S_IFREG | 0o6755, uid=None, gid=None, atime_ns=None, mtime_ns=None)
    nobody = RequestContext(65534, 65534, 1)
    reply = trio.run(fs.open, ino, os.O_WRONLY, nobody)
    assert reply.passthrough_fd is None  # its write must drop setuid/setgid: we must see it
    trio.run(fs.release, reply.fh)
    reader = trio.run(fs.open, ino, os.O_RDONLY, nobody)
    assert reader.passthrough_fd is not None  # a whole cached file: reads may go through
    fs.opened(reader.fh, False)  # the transport may still decide copy mode
    trio.run(fs.release, reader.fh)
    ns.cache.capacity_bytes = ns.cache.used_bytes + (1 << 20)  # less room than a writer needs
    writer = trio.run(fs.open, ino, os.O_WRONLY, RequestContext(0, 0, 1))
    assert writer.passthrough_fd is None  # copy mode keeps backpressure and ENOSPC
    trio.run(fs.release, writer.fh)


def test_reading_the_state_of_an_unchanged_passthrough_writer_makes_no_new_version(tmp_path: Path) -> None:
    """`status` and every scrape record what passthrough writers wrote (`sync_passthrough_all`). A new
    version where nothing was written would abandon the file's upload in flight (a flush of an open file
    never finishes under a scrape every few seconds)."""
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    reply, attr = trio.run(fs.create, ROOT_INODE, b"ckpt.bin", stat.S_IFREG | 0o644, os.O_WRONLY, ROOT)
    assert reply.passthrough_fd is not None
    fs.opened(reply.fh, True)
    os.pwrite(reply.passthrough_fd, b"x" * 5000, 0)
    # written a while ago (an mtime read in the tick it was set could be set again by a later write)
    os.utime(reply.passthrough_fd, ns=(time.time_ns() - 10**9, time.time_ns() - 10**9))
    trio.run(fs.fsync, reply.fh, False)
    version = ns.files.live[attr.ino].version
    for _ in range(3):
        fs.sync_passthrough_all()
        trio.run(fs.getattr, attr.ino, None, ROOT)
    assert ns.files.live[attr.ino].version == version  # nothing written: the same version
    os.pwrite(reply.passthrough_fd, b"y", 5000)  # the kernel writes: a new mtime and size
    fs.sync_passthrough_all()
    assert ns.files.live[attr.ino].version > version
    assert ns.files.row(attr.ino).size == 5001
    version = ns.files.live[attr.ino].version
    os.pwrite(reply.passthrough_fd, b"z", 0)  # the same size, in the tick just recorded: counted again
    fs.sync_passthrough_all()
    assert ns.files.live[attr.ino].version > version
    trio.run(fs.release, reply.fh)
