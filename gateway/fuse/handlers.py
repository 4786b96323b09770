"""The kernel transport's request handlers: each request as an `ops.Operations` call, and its reply.

Why a module of its own: the session (`kernel.py`) owns the connection: reading requests,
a task per request, interrupts, writing replies. What a request means does not depend on
which reader read it, so it is here, once, with the per-inode I/O mode table (`iomode.py`)
that opens and releases consult. A handler raises OSError for an error reply (the session
answers it), or returns the reply and, where the kernel may no longer want it (the request
was interrupted), how to undo what it gave: an open's handle, a lookup's reference.
"""

from __future__ import annotations

import errno
import time
from typing import Any, Awaitable, Callable

from . import abi
from .iomode import IoModes
from .messages import (
    Request, Setattr, encode_attr_out, encode_entry, encode_lseek, encode_open, encode_statfs,
    encode_write, encode_xattr_list, encode_xattr_size, pack_dirents, reply, reply_error,
)
from .ops import Attr, OpenReply, Operations, RequestContext, SetattrFields

Parts = list[Any]  # buffers for writev
Undo = Callable[[], Awaitable[None]] | None


class RequestHandlers:
    """One handler per opcode, calling the filesystem; `modes` decides each open's I/O mode."""

    def __init__(self, ops: Operations, modes: IoModes) -> None:
        self.ops = ops
        self.modes = modes

    async def handle(self, req: Request) -> tuple[Parts, Undo]:
        """The reply to `req` (ENOSYS for a request we do not handle), and its undo."""
        handler = _HANDLERS.get(req.opcode)
        if handler is None:
            return reply_error(req.unique, errno.ENOSYS), None
        return await handler(self, req, RequestContext(req.header.uid, req.header.gid, req.header.pid))

    def now(self, req: Request) -> Parts | None:
        """The reply to a GETATTR or GETXATTR the filesystem answers without waiting (`getattr_now`,
        `getxattr_now`), None for any other request or where it would have to wait."""
        try:
            ctx = RequestContext(req.header.uid, req.header.gid, req.header.pid)
            if req.opcode == abi.Op.GETATTR:
                attr = self.ops.getattr_now(req.nodeid, req.args.fh, ctx)
                return None if attr is None else reply(req.unique, encode_attr_out(attr))
            if req.opcode == abi.Op.GETXATTR:
                value = self.ops.getxattr_now(req.nodeid, req.args.name, ctx)
                return None if value is None else _sized(req.unique, value, req.args.size)
        except OSError as e:
            return reply_error(req.unique, e.errno or errno.EIO)
        return None

    def _entry(self, req: Request, attr: Attr) -> tuple[Parts, Undo]:
        async def undo() -> None:
            await self.ops.forget([(attr.ino, 1)])
        return reply(req.unique, encode_entry(attr)), undo

    def _open_reply(self, ino: int, r: OpenReply) -> tuple[bytes, Callable[[], Awaitable[None]]]:
        backing = self.modes.open(ino, r.fh, r.passthrough_fd)
        self.ops.opened(r.fh, backing is not None)
        if backing is not None:
            body = encode_open(r.fh, abi.FOPEN_PASSTHROUGH, backing)
        else:
            flags = (abi.FOPEN_DIRECT_IO if r.direct_io else 0) | (abi.FOPEN_KEEP_CACHE if r.keep_cache else 0)
            body = encode_open(r.fh, flags)

        async def undo() -> None:
            try:
                await self.ops.release(r.fh)
            finally:
                self.modes.release(r.fh)
        return body, undo

    async def _lookup(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        return self._entry(req, await self.ops.lookup(req.nodeid, req.args.name, ctx))

    async def _getattr(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        attr = await self.ops.getattr(req.nodeid, req.args.fh, ctx)
        return reply(req.unique, encode_attr_out(attr)), None

    async def _setattr(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        attr = await self.ops.setattr(req.nodeid, setattr_fields(req.args), ctx)
        return reply(req.unique, encode_attr_out(attr)), None

    async def _readlink(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        return reply(req.unique, await self.ops.readlink(req.nodeid, ctx)), None

    async def _symlink(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        return self._entry(req, await self.ops.symlink(req.nodeid, req.args.name, req.args.target, ctx))

    async def _mknod(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        a = req.args
        return self._entry(req, await self.ops.mknod(req.nodeid, a.name, a.mode, a.rdev, ctx))

    async def _mkdir(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        return self._entry(req, await self.ops.mkdir(req.nodeid, req.args.name, req.args.mode, ctx))

    async def _link(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        return self._entry(req, await self.ops.link(req.args.oldnodeid, req.nodeid, req.args.name, ctx))

    async def _unlink(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        await self.ops.unlink(req.nodeid, req.args.name, ctx)
        return reply(req.unique), None

    async def _rmdir(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        await self.ops.rmdir(req.nodeid, req.args.name, ctx)
        return reply(req.unique), None

    async def _rename(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        a = req.args
        await self.ops.rename(req.nodeid, a.old, a.newdir, a.new, a.flags, ctx)
        return reply(req.unique), None

    async def _open(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        r = await self.ops.open(req.nodeid, req.args.flags, ctx)
        body, undo = self._open_reply(req.nodeid, r)
        return reply(req.unique, body), undo

    async def _create(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        a = req.args
        r, attr = await self.ops.create(req.nodeid, a.name, a.mode, a.flags, ctx)
        body, release = self._open_reply(attr.ino, r)

        async def undo() -> None:
            try:
                await release()
            finally:
                await self.ops.forget([(attr.ino, 1)])
        return reply(req.unique, encode_entry(attr), body), undo

    async def _read_op(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        a = req.args
        data = await self.ops.read(a.fh, a.offset, a.size)
        if len(data) > a.size:
            data = memoryview(data)[:a.size]
        return reply(req.unique, data), None

    async def _write(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        a = req.args
        n = await self.ops.write(a.fh, a.offset, a.data)
        return reply(req.unique, encode_write(n)), None

    async def _statfs(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        return reply(req.unique, encode_statfs(await self.ops.statfs(ctx))), None

    async def _release(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        try:
            await self.ops.release(req.args.fh)
        finally:
            self.modes.release(req.args.fh)
        return reply(req.unique), None

    async def _fsync(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        await self.ops.fsync(req.args.fh, bool(req.args.fsync_flags & abi.FSYNC_FDATASYNC))
        return reply(req.unique), None

    async def _flush(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        await self.ops.flush(req.args.fh)
        return reply(req.unique), None

    async def _setxattr(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        a = req.args
        await self.ops.setxattr(req.nodeid, a.name, a.value, a.flags, ctx)
        return reply(req.unique), None

    async def _getxattr(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        value = await self.ops.getxattr(req.nodeid, req.args.name, ctx)
        return _sized(req.unique, value, req.args.size), None

    async def _listxattr(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        names = encode_xattr_list(await self.ops.listxattr(req.nodeid, ctx))
        return _sized(req.unique, names, req.args.size), None

    async def _removexattr(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        await self.ops.removexattr(req.nodeid, req.args.name, ctx)
        return reply(req.unique), None

    async def _opendir(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        fh = await self.ops.opendir(req.nodeid, ctx)

        async def undo() -> None:
            await self.ops.releasedir(fh)
        return reply(req.unique, encode_open(fh, 0)), undo

    async def _readdir(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        a = req.args
        plus = req.opcode == abi.Op.READDIRPLUS
        entries = await self.ops.readdir(a.fh, a.offset, plus, ctx)
        payload, n = pack_dirents(entries, a.size, plus)
        if not plus:
            return reply(req.unique, payload), None
        refs = [attr.ino for name, attr, _ in entries[:n] if attr.ino and name not in (b".", b"..")]
        for ino in refs:
            self.ops.ref(ino)

        async def undo() -> None:
            await self.ops.forget([(ino, 1) for ino in refs])
        return reply(req.unique, payload), undo

    async def _releasedir(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        await self.ops.releasedir(req.args.fh)
        return reply(req.unique), None

    async def _fsyncdir(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        await self.ops.fsyncdir(req.args.fh, bool(req.args.fsync_flags & abi.FSYNC_FDATASYNC))
        return reply(req.unique), None

    async def _access(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        await self.ops.access(req.nodeid, req.args.mask, ctx)
        return reply(req.unique), None

    async def _fallocate(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        a = req.args
        await self.ops.fallocate(a.fh, a.mode, a.offset, a.length)
        return reply(req.unique), None

    async def _lseek(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        a = req.args
        return reply(req.unique, encode_lseek(await self.ops.lseek(a.fh, a.offset, a.whence))), None

    async def _destroy(self, req: Request, ctx: RequestContext) -> tuple[Parts, Undo]:
        await self.ops.destroy()
        return reply(req.unique), None


def _sized(unique: int, value: bytes, size: int) -> Parts:
    """GETXATTR/LISTXATTR: size 0 asks for the length; a too-small buffer is ERANGE."""
    if size == 0:
        return reply(unique, encode_xattr_size(len(value)))
    if len(value) > size:
        return reply_error(unique, errno.ERANGE)
    return reply(unique, value)


def setattr_fields(a: Setattr) -> SetattrFields:
    """The kernel's fuse_setattr_in as the neutral SetattrFields (`*_NOW` resolved here)."""
    v = a.valid
    now = time.time_ns() if v & (abi.FATTR_ATIME_NOW | abi.FATTR_MTIME_NOW) else 0
    return SetattrFields(
        mode=a.mode if v & abi.FATTR_MODE else None,
        uid=a.uid if v & abi.FATTR_UID else None,
        gid=a.gid if v & abi.FATTR_GID else None,
        size=a.size if v & abi.FATTR_SIZE else None,
        atime_ns=now if v & abi.FATTR_ATIME_NOW else (a.atime_ns if v & abi.FATTR_ATIME else None),
        mtime_ns=now if v & abi.FATTR_MTIME_NOW else (a.mtime_ns if v & abi.FATTR_MTIME else None),
        ctime_ns=a.ctime_ns if v & abi.FATTR_CTIME else None,
        fh=a.fh if v & abi.FATTR_FH else None,
        kill_suidgid=bool(v & abi.FATTR_KILL_SUIDGID),
    )


_HANDLERS: dict[int, Callable[[RequestHandlers, Request, RequestContext], Awaitable[tuple[Parts, Undo]]]] = {
    abi.Op.LOOKUP: RequestHandlers._lookup,
    abi.Op.GETATTR: RequestHandlers._getattr,
    abi.Op.SETATTR: RequestHandlers._setattr,
    abi.Op.READLINK: RequestHandlers._readlink,
    abi.Op.SYMLINK: RequestHandlers._symlink,
    abi.Op.MKNOD: RequestHandlers._mknod,
    abi.Op.MKDIR: RequestHandlers._mkdir,
    abi.Op.UNLINK: RequestHandlers._unlink,
    abi.Op.RMDIR: RequestHandlers._rmdir,
    abi.Op.RENAME: RequestHandlers._rename,
    abi.Op.RENAME2: RequestHandlers._rename,
    abi.Op.LINK: RequestHandlers._link,
    abi.Op.OPEN: RequestHandlers._open,
    abi.Op.CREATE: RequestHandlers._create,
    abi.Op.READ: RequestHandlers._read_op,
    abi.Op.WRITE: RequestHandlers._write,
    abi.Op.STATFS: RequestHandlers._statfs,
    abi.Op.RELEASE: RequestHandlers._release,
    abi.Op.FSYNC: RequestHandlers._fsync,
    abi.Op.FLUSH: RequestHandlers._flush,
    abi.Op.SETXATTR: RequestHandlers._setxattr,
    abi.Op.GETXATTR: RequestHandlers._getxattr,
    abi.Op.LISTXATTR: RequestHandlers._listxattr,
    abi.Op.REMOVEXATTR: RequestHandlers._removexattr,
    abi.Op.OPENDIR: RequestHandlers._opendir,
    abi.Op.READDIR: RequestHandlers._readdir,
    abi.Op.READDIRPLUS: RequestHandlers._readdir,
    abi.Op.RELEASEDIR: RequestHandlers._releasedir,
    abi.Op.FSYNCDIR: RequestHandlers._fsyncdir,
    abi.Op.ACCESS: RequestHandlers._access,
    abi.Op.FALLOCATE: RequestHandlers._fallocate,
    abi.Op.LSEEK: RequestHandlers._lseek,
    abi.Op.DESTROY: RequestHandlers._destroy,
}
