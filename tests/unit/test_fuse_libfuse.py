"""The pyfuse3 adapter (gateway/fuse/libfuse.py) without a mount: conversions, and that no
error but FUSEError ever reaches pyfuse3 (which would tear the mount down)."""

from __future__ import annotations

import errno
import stat
from typing import Any

import pyfuse3
import pytest
import trio

from ckptfs.fuse.libfuse import Pyfuse3Adapter, setattr_fields
from ckptfs.fuse.ops import Attr, OpenReply, Operations, RequestContext, SetattrFields, StatFs


class Ctx:
    uid, gid, pid, umask = 1000, 100, 42, 0o22


class Fields:
    """pyfuse3.SetattrFields is read-only from Python: a stand-in with the same attributes."""

    def __init__(self, **kw: bool) -> None:
        for name in ("update_atime", "update_ctime", "update_gid", "update_mode", "update_mtime", "update_size", "update_uid"):
            setattr(self, name, kw.get(name, False))


class Fake(Operations):
    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.opened_calls: list[tuple[int, bool]] = []
        self.refs: list[int] = []

    async def lookup(self, parent: int, name: bytes, ctx: RequestContext) -> Attr:
        self.seen.append(("lookup", parent, name, ctx))
        if name == b"missing":
            raise FileNotFoundError(errno.ENOENT, "no")
        if name == b"bug":
            raise KeyError("a bug")
        return Attr(ino=7, mode=stat.S_IFREG | 0o644, size=3, mtime_ns=5, entry_timeout=2.0)

    async def open(self, ino: int, flags: int, ctx: RequestContext) -> OpenReply:
        return OpenReply(fh=11, direct_io=True, passthrough_fd=99)

    def opened(self, fh: int, passthrough: bool) -> None:
        self.opened_calls.append((fh, passthrough))

    async def write(self, fh: int, offset: int, data: memoryview) -> int:
        self.seen.append(("write", fh, offset, bytes(data)))
        return len(data)

    async def setattr(self, ino: int, fields: SetattrFields, ctx: RequestContext) -> Attr:
        self.seen.append(("setattr", fields))
        return Attr(ino=ino, mode=stat.S_IFREG | 0o600)

    async def statfs(self, ctx: RequestContext) -> StatFs:
        return StatFs(blocks=10, bfree=5, bavail=4, files=3, ffree=2)

    async def forget(self, items: list[tuple[int, int]]) -> None:
        raise RuntimeError("forget must never raise into pyfuse3")


def run(coro_fn: Any, *args: Any) -> Any:
    return trio.run(coro_fn, *args)


def test_lookup_converts_attributes_and_context() -> None:
    fake = Fake()
    a = Pyfuse3Adapter(fake)
    e = run(a.lookup, 1, b"f", Ctx())
    assert (e.st_ino, e.st_size, e.st_mtime_ns, e.entry_timeout) == (7, 3, 5, 2.0)
    assert fake.seen[0] == ("lookup", 1, b"f", RequestContext(1000, 100, 42))


def test_errors_become_fuse_errors() -> None:
    a = Pyfuse3Adapter(Fake())
    with pytest.raises(pyfuse3.FUSEError) as e:
        run(a.lookup, 1, b"missing", Ctx())
    assert e.value.errno == errno.ENOENT
    with pytest.raises(pyfuse3.FUSEError) as e:
        run(a.lookup, 1, b"bug", Ctx())  # a bug: EIO, not a torn-down mount
    assert e.value.errno == errno.EIO
    with pytest.raises(pyfuse3.FUSEError) as e:
        run(a.readlink, 1, Ctx())  # not implemented by the filesystem
    assert e.value.errno == errno.ENOSYS
    run(a.forget, [(7, 1)])  # swallowed and logged


def test_open_is_always_copy_mode() -> None:
    fake = Fake()
    a = Pyfuse3Adapter(fake)
    fi = run(a.open, 7, 0, Ctx())
    assert fi.fh == 11 and fi.direct_io
    assert fake.opened_calls == [(11, False)]  # the passthrough offer is declined


def test_write_setattr_statfs() -> None:
    fake = Fake()
    a = Pyfuse3Adapter(fake)
    assert run(a.write, 11, 4096, b"abc") == 3
    assert fake.seen[-1] == ("write", 11, 4096, b"abc")
    attr = pyfuse3.EntryAttributes()
    attr.st_size = 5
    attr.st_mode = stat.S_IFREG | 0o600
    fields = Fields(update_size=True)
    run(a.setattr, 7, attr, fields, 11, Ctx())
    assert fake.seen[-1] == ("setattr", SetattrFields(size=5, fh=11))
    assert setattr_fields(attr, fields, None).mode is None
    s = run(a.statfs, Ctx())
    assert (s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree) == (10, 5, 4, 3, 2)
