"""fallocate as the filesystem operations serve it (the kernel transport passes FALLOCATE on; pyfuse3 3.5 cannot: see docs/semantics.md).

Runs CkptFS.fallocate on a real journal and cache directory, without a mount.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from ckptfs.fs import CkptFS
from ckptfs.journal import ROOT_INODE
from tests.unit.test_journal import make_ns

MiB = 1 << 20


def test_fallocate_mode_0_and_keep_size_on_a_cached_file(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    row = ns.tree.create(ROOT_INODE, "pre.bin", 0o644, 0, 0)
    fd = ns.files.open(row.ino, write=True)
    fh = fs._add_handle(row.ino, fd, True)
    ns.files.write(row.ino, fd, 0, b"head")
    trio.run(fs.fallocate, fh, 0, 0, 1 * MiB)
    assert ns.files.row(row.ino).size == 1 * MiB
    assert os.fstat(fd).st_size == 1 * MiB and os.pread(fd, 4, 0) == b"head"
    trio.run(fs.fallocate, fh, 0x01, 0, 8 * MiB)  # FALLOC_FL_KEEP_SIZE: the size stays
    assert ns.files.row(row.ino).size == 1 * MiB
    for mode in (0x02 | 0x01, 0x10, 0x08):  # punch a hole, zero a range, collapse a range
        with pytest.raises(OSError) as e:
            trio.run(fs.fallocate, fh, mode, 0, 4096)
        assert e.value.errno == errno.EOPNOTSUPP
    trio.run(fs.release, fh)
    assert ns.journal.get(row.ino).size == 1 * MiB  # type: ignore[union-attr]
    assert ns.journal.get(row.ino).state == "dirty"  # type: ignore[union-attr]
