"""fs.py's SETATTR without a mount: a chown/chgrp drops setuid/setgid (the kernel leaves it to us with
HANDLE_KILLPRIV(_V2)) in the same journal write as the new owner. A conformance run once found a file
whose group had changed with its setuid/setgid kept (pjdfstest chown/00.t); a chown half done, its
second journal write failed, leaves exactly that."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path
from typing import Any

import trio

from ckptfs.fs import CkptFS
from ckptfs.fuse.ops import RequestContext, SetattrFields
from ckptfs.journal import ROOT_INODE
from tests.unit.test_journal import make_ns, write_file

ROOT = RequestContext(0, 0, 1)
OWNER = RequestContext(65534, 65533, 1)


def attrs(fs: CkptFS, ino: int) -> tuple[int, int, int]:
    row = fs.ns.journal.get(ino)
    assert row is not None
    return stat.S_IMODE(row.mode), row.uid, row.gid


def test_chgrp_by_the_owner_drops_setuid_and_setgid_all_or_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    ns = make_ns(tmp_path)
    fs = CkptFS(ns, None, None, "")  # type: ignore[arg-type]
    ino = write_file(ns, ROOT_INODE, "n0", b"")
    trio.run(fs.setattr, ino, SetattrFields(uid=65534, gid=65533), ROOT)
    trio.run(fs.setattr, ino, SetattrFields(mode=stat.S_IFREG | 0o6555), ROOT)
    trio.run(fs.setattr, ino, SetattrFields(uid=65534, gid=65532), OWNER)  # chown(n0, 65534, 65532)
    assert attrs(fs, ino) == (0o555, 65534, 65532)
    trio.run(fs.setattr, ino, SetattrFields(mode=stat.S_IFREG | 0o6555), ROOT)
    assert attrs(fs, ino) == (0o6555, 65534, 65532)

    # chown(n0, -1, 65533) while the journal fails its second write from now on
    update = ns.journal.update
    calls: list[dict[str, object]] = []

    def second_write_fails(i: int, **fields: object) -> None:
        calls.append(fields)
        if len(calls) >= 2:
            raise sqlite3.OperationalError("disk I/O error")
        update(i, **fields)

    monkeypatch.setattr(ns.journal, "update", second_write_fails)
    try:
        got = trio.run(fs.setattr, ino, SetattrFields(gid=65533), OWNER)
    except OSError:
        assert attrs(fs, ino) == (0o6555, 65534, 65532)  # refused: nothing changed
    else:
        assert stat.S_IMODE(got.mode) == 0o555
        assert attrs(fs, ino) == (0o555, 65534, 65533)  # as Linux does
