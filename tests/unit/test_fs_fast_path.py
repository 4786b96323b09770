"""The copy workers' fast path in fs.py (`FastPath`), without a mount: a write handle is served by the
workers only while its file is dirty in the journal, since a worker's WRITE writes no journal row before
its pwrite. What a user would see broken otherwise: after a kill -9, a file the journal calls durable
whose cache copy holds bytes the bucket never gets; a non-root writer keeping setuid/setgid.

"On disk" below is the journal read through a connection of its own, as the next mount reads it."""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
from pathlib import Path

import pytest
import trio

from ckptfs.fs import CkptFS
from ckptfs.fuse.ops import RequestContext, SetattrFields
from ckptfs.journal import DIRTY, DURABLE, ROOT_INODE
from ckptfs.namespace import Namespace
from tests.unit.test_journal import make_ns, write_file

ROOT = RequestContext(0, 0, 1)
NOBODY = RequestContext(65534, 65534, 1)


class Listed:
    """The bucket's side, for a durable file's open (close-to-open asks for a fresh listing): nothing new."""

    async def refresh(self, ino: int) -> None:
        return None


def state_on_disk(tmp_path: Path, ino: int) -> str:
    db = sqlite3.connect(tmp_path / "journal.sqlite3")
    try:
        return db.execute("SELECT state FROM inodes WHERE ino = ?", (ino,)).fetchone()[0]
    finally:
        db.close()


def durable_file(ns: Namespace, name: str, data: bytes) -> int:
    """A file the bucket holds, its copy in the cache (uploaded and not changed since)."""
    ino = write_file(ns, ROOT_INODE, name, data)
    ticket = ns.uploads.begin_upload(ino)
    assert ticket is not None and ns.uploads.finish_upload(ticket, "etag", "xxh3")
    ns.files.forget_if_idle(ino)
    return ino


def test_a_durable_file_rewritten_in_place_is_dirty_on_disk_before_a_worker_may_write_it(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    fs.remote = Listed()  # type: ignore[assignment]
    ino = durable_file(ns, "model.pt", b"old bytes")
    reply = trio.run(fs.open, ino, os.O_WRONLY, ROOT)
    fs.opened(reply.fh, False)  # copy mode
    assert reply.fh not in fs.fast_handles  # the journal still says durable: no worker may change a byte
    assert state_on_disk(tmp_path, ino) == DURABLE
    trio.run(fs.write, reply.fh, 0, memoryview(b"new"))  # the first write goes the ordinary way
    assert state_on_disk(tmp_path, ino) == DIRTY
    assert reply.fh in fs.fast_handles  # from now on the workers may write it
    trio.run(fs.release, reply.fh)


def test_the_ordinary_write_marks_the_journal_before_the_bytes_change(tmp_path: Path) -> None:
    """A journal that cannot be written fails the write with nothing changed in the cache copy."""
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    fs.remote = Listed()  # type: ignore[assignment]
    ino = durable_file(ns, "model.pt", b"old bytes")
    reply = trio.run(fs.open, ino, os.O_WRONLY, ROOT)
    ns.journal.db.execute("PRAGMA busy_timeout = 50")
    other = sqlite3.connect(tmp_path / "journal.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the journal: ours fails ("database is locked")
    try:
        with pytest.raises(OSError) as failed:
            trio.run(fs.write, reply.fh, 0, memoryview(b"new"))
        assert failed.value.errno == errno.EIO
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert ns.cache.path(ino).read_bytes() == b"old bytes"  # nothing the journal calls durable changed
    trio.run(fs.write, reply.fh, 0, memoryview(b"new"))
    assert state_on_disk(tmp_path, ino) == DIRTY
    trio.run(fs.release, reply.fh)


def test_a_file_made_durable_while_open_leaves_the_fast_path(tmp_path: Path) -> None:
    """A flush uploads a file still open for writing: before the journal says durable, its handles leave
    the workers; a worker's write not yet accounted makes the upload stale instead."""
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    reply, attr = trio.run(fs.create, ROOT_INODE, b"ckpt.bin", stat.S_IFREG | 0o644, os.O_WRONLY, ROOT)
    fs.opened(reply.fh, False)
    fast = fs.fast_handles[reply.fh]  # a new file is dirty from its create
    trio.run(fs.write, reply.fh, 0, memoryview(b"abc"))
    ticket = ns.uploads.begin_upload(attr.ino)
    assert ticket is not None
    assert fast.admit_write()  # a worker's pwrite, its accounting still queued for the trio thread
    assert not ns.uploads.finish_upload(ticket, "etag", "xxh3")
    assert state_on_disk(tmp_path, attr.ino) == DIRTY  # the bytes uploaded may not be the file's
    assert reply.fh not in fs.fast_handles and not fast.admit_write()
    fast.write_accounted()
    trio.run(fs.write, reply.fh, 3, memoryview(b"def"))  # the ordinary way publishes it again
    assert reply.fh in fs.fast_handles
    ticket = ns.uploads.begin_upload(attr.ino)
    assert ticket is not None and ns.uploads.finish_upload(ticket, "etag", "xxh3")
    assert state_on_disk(tmp_path, attr.ino) == DURABLE
    assert reply.fh not in fs.fast_handles  # durable: the next write must mark it dirty first
    trio.run(fs.write, reply.fh, 6, memoryview(b"g"))
    assert state_on_disk(tmp_path, attr.ino) == DIRTY
    trio.run(fs.release, reply.fh)


def test_chmod_setuid_takes_a_non_root_writer_off_the_fast_path(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    ino = write_file(ns, ROOT_INODE, "tool", b"#!/bin/sh\n")
    reply = trio.run(fs.open, ino, os.O_WRONLY, NOBODY)
    fs.opened(reply.fh, False)
    assert reply.fh in fs.fast_handles
    trio.run(fs.setattr, ino, SetattrFields(mode=stat.S_IFREG | 0o6755), ROOT)  # root sets setuid/setgid on the open file
    assert reply.fh not in fs.fast_handles  # nobody's next write must drop them: the ordinary way does
    trio.run(fs.write, reply.fh, 0, memoryview(b"#"))
    assert stat.S_IMODE(ns.files.row(ino).mode) == 0o755
    assert reply.fh in fs.fast_handles
    trio.run(fs.release, reply.fh)
