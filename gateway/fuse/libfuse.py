"""The libfuse transport: a thin pyfuse3 adapter in front of a neutral `ops.Operations`.

Why: where the kernel transport cannot run (a non-root mount through fusermount3, a kernel
without passthrough, `-o fuse_transport=libfuse`) the same filesystem is served by pyfuse3.
`LibfuseSession` mounts and serves it (pyfuse3's init with the mount options, its main loop,
terminate and close); the adapter only converts: pyfuse3's types to the neutral ones and back,
and errors to `FUSEError`. pyfuse3 tears the whole mount down when a handler raises anything but
`FUSEError`, so every handler maps OSError to its errno and anything else to EIO (logged);
trio cancellation passes through untouched. Always copy mode: pyfuse3 3.5 (libfuse 3.14,
protocol 7.38) cannot ask for passthrough, so `OpenReply.passthrough_fd` is ignored.
"""

from __future__ import annotations

import errno
import functools
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, TypeVar

import pyfuse3
import trio

from .ops import Attr, OpenReply, Operations, RequestContext, SetattrFields

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def _translate(fn: F) -> F:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("internal error in %s", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper  # type: ignore[return-value]


def entry_attributes(a: Attr) -> pyfuse3.EntryAttributes:
    e = pyfuse3.EntryAttributes()
    e.st_ino = a.ino
    e.generation = a.generation
    e.entry_timeout = a.entry_timeout
    e.attr_timeout = a.attr_timeout
    e.st_mode = a.mode
    e.st_nlink = a.nlink
    e.st_uid = a.uid
    e.st_gid = a.gid
    e.st_rdev = a.rdev
    e.st_size = a.size
    e.st_blksize = a.blksize
    e.st_blocks = a.blocks
    e.st_atime_ns = a.atime_ns
    e.st_mtime_ns = a.mtime_ns
    e.st_ctime_ns = a.ctime_ns
    return e


def context(ctx: Any) -> RequestContext:
    return RequestContext(ctx.uid, ctx.gid, ctx.pid)


def setattr_fields(attr: Any, fields: Any, fh: int | None) -> SetattrFields:
    """pyfuse3 has already resolved ATIME_NOW/MTIME_NOW into the times."""
    return SetattrFields(
        mode=attr.st_mode if fields.update_mode else None,
        uid=attr.st_uid if fields.update_uid else None,
        gid=attr.st_gid if fields.update_gid else None,
        size=attr.st_size if fields.update_size else None,
        atime_ns=attr.st_atime_ns if fields.update_atime else None,
        mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
        ctime_ns=attr.st_ctime_ns if fields.update_ctime else None,
        fh=fh,
    )


class Pyfuse3Adapter(pyfuse3.Operations):
    """pyfuse3 `Operations` that forwards every request to a neutral `Operations`."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, ops: Operations) -> None:
        super().__init__()
        self.ops = ops

    def _file_info(self, r: OpenReply) -> pyfuse3.FileInfo:
        self.ops.opened(r.fh, False)
        return pyfuse3.FileInfo(fh=r.fh, direct_io=r.direct_io, keep_cache=r.keep_cache)

    # ----------------------------------------------------------------- inodes
    @_translate
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.ops.lookup(parent_inode, name, context(ctx)))

    async def forget(self, inode_list: Iterable[tuple[int, int]]) -> None:
        try:
            await self.ops.forget(list(inode_list))
        except Exception:  # forget cannot report errors
            log.exception("forget")

    @_translate
    async def getattr(self, inode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.ops.getattr(inode, None, context(ctx)))

    @_translate
    async def setattr(self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.ops.setattr(inode, setattr_fields(attr, fields, fh), context(ctx)))

    @_translate
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return await self.ops.readlink(inode, context(ctx))

    @_translate
    async def access(self, inode: int, mode: int, ctx: Any) -> bool:
        try:
            await self.ops.access(inode, mode, context(ctx))
        except PermissionError:
            return False
        return True

    # -------------------------------------------------------------- namespace
    @_translate
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.ops.mknod(parent_inode, name, mode, rdev, context(ctx)))

    @_translate
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.ops.mkdir(parent_inode, name, mode, context(ctx)))

    @_translate
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.ops.symlink(parent_inode, name, target, context(ctx)))

    @_translate
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        return entry_attributes(await self.ops.link(inode, new_parent_inode, new_name, context(ctx)))

    @_translate
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.ops.unlink(parent_inode, name, context(ctx))

    @_translate
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.ops.rmdir(parent_inode, name, context(ctx))

    @_translate
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes, flags: int, ctx: Any) -> None:
        await self.ops.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags, context(ctx))

    @_translate
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = await self.ops.statfs(context(ctx))
        out = pyfuse3.StatvfsData()
        out.f_bsize, out.f_frsize = s.bsize, s.frsize
        out.f_blocks, out.f_bfree, out.f_bavail = s.blocks, s.bfree, s.bavail
        out.f_files, out.f_ffree, out.f_favail = s.files, s.ffree, s.ffree
        out.f_namemax = s.namemax
        return out

    # ------------------------------------------------------------------ files
    @_translate
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        r, attr = await self.ops.create(parent_inode, name, mode, flags, context(ctx))
        return self._file_info(r), entry_attributes(attr)

    @_translate
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        return self._file_info(await self.ops.open(inode, flags, context(ctx)))

    @_translate
    async def read(self, fh: int, off: int, size: int) -> bytes:
        data = await self.ops.read(fh, off, size)
        return data if isinstance(data, bytes) else bytes(data)

    @_translate
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.ops.write(fh, off, memoryview(buf))

    @_translate
    async def flush(self, fh: int) -> None:
        await self.ops.flush(fh)

    @_translate
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.ops.fsync(fh, datasync)

    @_translate
    async def release(self, fh: int) -> None:
        await self.ops.release(fh)

    # ------------------------------------------------------------ directories
    @_translate
    async def opendir(self, inode: int, ctx: Any) -> int:
        return await self.ops.opendir(inode, context(ctx))

    @_translate
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        # pyfuse3 always answers READDIRPLUS: every entry it accepts is a lookup
        for name, attr, next_off in await self.ops.readdir(fh, start_id, True, RequestContext()):
            if not pyfuse3.readdir_reply(token, name, entry_attributes(attr), next_off):
                return
            self.ops.ref(attr.ino)

    @_translate
    async def releasedir(self, fh: int) -> None:
        await self.ops.releasedir(fh)

    @_translate
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        await self.ops.fsyncdir(fh, datasync)

    # ----------------------------------------------------------------- xattrs
    @_translate
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        return await self.ops.getxattr(inode, name, context(ctx))

    @_translate
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return await self.ops.listxattr(inode, context(ctx))

    @_translate
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        await self.ops.setxattr(inode, name, value, 0, context(ctx))

    @_translate
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        await self.ops.removexattr(inode, name, context(ctx))


class LibfuseSession:
    """One mount served by pyfuse3, in the shape of `kernel.KernelSession` (`mount`, `serve`,
    `stop`, `passthrough`: `session.FuseSession`), so the daemon runs either transport alike.
    pyfuse3 keeps global state: one session per process."""

    passthrough = False
    passthrough_error: str | None = "pyfuse3 3.5 (libfuse 3.14, protocol 7.38) cannot ask for it"
    protocol: str | None = None  # libfuse settles it and pyfuse3 does not tell
    workers = 1  # pyfuse3 serves every request on the trio thread

    def __init__(self, ops: Operations, mountpoint: str, *, options: Iterable[str] = ("fsname=ckptfs", "subtype=ckptfs"),
                 allow_other: bool = False, read_only: bool = False) -> None:
        self.ops = ops
        self.mountpoint = mountpoint
        self.adapter = Pyfuse3Adapter(ops)
        self.options = set(pyfuse3.default_options) | set(options)
        if allow_other:
            self.options.add("allow_other")
        if read_only:
            self.options.add("ro")  # the kernel answers EROFS to every change
        self.done = trio.Event()  # pyfuse3.main returned: unmounted, or stopped

    def mount(self) -> None:
        """Mount through libfuse (fusermount3); pyfuse3 raises RuntimeError if it cannot."""
        pyfuse3.init(self.adapter, self.mountpoint, self.options)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Report started, then serve until unmounted (`fusermount3 -u`) or `stop()`."""
        try:
            await self.ops.init()
            task_status.started()
            await pyfuse3.main()
        finally:
            self.done.set()

    async def invalidate_inode(self, ino: int) -> None:
        """Make the kernel drop its cached attributes and pages of `ino`. In a worker thread, as
        pyfuse3's docs advise: the kernel may make it wait for a request this trio thread serves.
        Never once `stop` began (pyfuse3 frees the session): `invalidations.Invalidations.stop` first."""
        await trio.to_thread.run_sync(pyfuse3.invalidate_inode, ino)

    async def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Make the kernel forget the name `name` in directory `parent`. In a worker thread: the kernel
        takes the directory's lock, which a LOOKUP or READDIR being answered on this thread may hold."""
        await trio.to_thread.run_sync(pyfuse3.invalidate_entry, parent, name)

    async def stop(self) -> None:
        """Stop serving (if an unmount has not already stopped it), then unmount."""
        if not self.done.is_set():
            pyfuse3.terminate()
            await self.done.wait()
        pyfuse3.close(unmount=True)


@asynccontextmanager
async def mounted(ops: Operations, mountpoint: str, options: Iterable[str] = ()) -> AsyncIterator[Pyfuse3Adapter]:
    """Mount `ops` with pyfuse3 (one mount per process: pyfuse3 keeps global state), serve it
    in the background, unmount on exit."""
    session = LibfuseSession(ops, mountpoint, options=options)
    session.mount()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.serve)
            try:
                yield session.adapter
            finally:
                pyfuse3.terminate()
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    await session.done.wait()
    finally:
        pyfuse3.close(unmount=True)
