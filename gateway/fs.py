"""FUSE operations: translate kernel requests into namespace calls. Owns no policy.

The only module that knows FUSE. pyfuse3 tears the mount down on any
exception that is not a `FUSEError`, so every handler goes through `_fuse`,
which maps `OSError` to its errno and anything unexpected to EIO (logged).

Data path: `write` and `read` are `pwrite`/`pread` on the cache file, done
inline on the trio thread: they hit the page cache and a thread hop would
cost more than the copy. `fsync` is the one blocking call sent to a thread.
A file that is only in the bucket is opened at once; its reads wait for the
ranges they need (`fetch.Download`). Lookups and readdir first let `remote`
refresh the directory's listing when it is older than `metadata_ttl`.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

import pyfuse3
import trio

from .fetch import Download, Fetcher
from .journal import DURABLE, ROOT_INODE, Row
from .metrics import FUSE_COUNTERS
from .namespace import Namespace
from .remote import Remote

log = logging.getLogger(__name__)

XATTR_STATE = b"user.ckptfs.state"
XATTR_ETAG = b"user.ckptfs.etag"
XATTR_XXH3 = b"user.ckptfs.xxh3"
XATTR_CONTROL = b"user.ckptfs.control"  # on the root: path of the control socket
FILE_XATTRS = (XATTR_STATE, XATTR_ETAG, XATTR_XXH3)

ATTR_TIMEOUT = 1.0
BLOCK = 4096

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def _fuse(fn: F) -> F:
    op = fn.__name__
    requests = FUSE_COUNTERS.requests  # counted per request: a plain dict increment
    requests.setdefault(op, 0)

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        requests[op] += 1
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError as e:
            FUSE_COUNTERS.error(op, e.errno)
            raise
        except OSError as e:
            FUSE_COUNTERS.error(op, e.errno or errno.EIO)
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except trio.Cancelled:
            raise
        except Exception:
            log.exception("internal error in %s", fn.__name__)
            FUSE_COUNTERS.error(op, errno.EIO)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper  # type: ignore[return-value]


def _name(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # object keys are UTF-8; a name that is not cannot be stored
        raise OSError(errno.EILSEQ, "file name is not valid UTF-8") from None


@dataclass
class Handle:
    ino: int
    fd: int
    write: bool
    download: Download | None = None  # bytes still arriving from the bucket


class CkptFS(pyfuse3.Operations):
    supports_dot_lookup = True

    def __init__(self, ns: Namespace, fetcher: Fetcher, remote: Remote, control_socket: str) -> None:
        super().__init__()
        self.ns = ns
        self.fetcher = fetcher
        self.remote = remote
        self._opened_etag: dict[int, tuple[str | None, int]] = {}  # (etag, version) of the bytes the kernel may still cache
        self.control_socket = control_socket
        self.handles: dict[int, Handle] = {}
        self._next_fh = 1

    # ------------------------------------------------------------- attributes
    def _entry(self, row: Row) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = row.ino
        e.generation = 0
        e.entry_timeout = ATTR_TIMEOUT
        e.attr_timeout = ATTR_TIMEOUT
        e.st_mode = row.mode
        e.st_nlink = 2 if row.is_dir else 1
        e.st_uid = row.uid
        e.st_gid = row.gid
        e.st_rdev = 0
        e.st_size = row.size if not row.is_dir else BLOCK
        e.st_blksize = BLOCK
        e.st_blocks = (e.st_size + 511) // 512
        e.st_atime_ns = row.mtime_ns
        e.st_mtime_ns = row.mtime_ns
        e.st_ctime_ns = row.ctime_ns
        return e

    @_fuse
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(self.ns.files.row(inode))

    @_fuse
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if name == b".":
            row = self.ns.files.row(parent_inode)
        elif name == b"..":
            prow = self.ns.files.row(parent_inode)
            row = self.ns.files.row(prow.parent if prow.parent is not None else ROOT_INODE)
        else:
            await self.remote.refresh(parent_inode)
            row = self.ns.tree.lookup(parent_inode, _name(name))
        self.ns.tree.ref(row.ino)
        return self._entry(row)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            try:
                self.ns.tree.forget(ino, n)
            except Exception:  # forget cannot report errors
                log.exception("forget(%d)", ino)

    @_fuse
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields, fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if fields.update_size:
            if self.ns.files.row(inode).is_dir:
                raise OSError(errno.EISDIR, "is a directory")
            if self.ns.files.needs_fetch(inode):
                await self.fetcher.ensure_local(inode)
            self.ns.files.truncate(inode, attr.st_size)
        self.ns.tree.setattr(
            inode,
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
        )
        return self._entry(self.ns.files.row(inode))

    @_fuse
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        cache = self.ns.cache
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = BLOCK
        s.f_blocks = cache.capacity_bytes // BLOCK
        s.f_bfree = s.f_bavail = max(0, cache.capacity_bytes - cache.used_bytes) // BLOCK
        s.f_files = 1 << 32
        s.f_ffree = s.f_favail = 1 << 31
        s.f_namemax = 255
        return s

    # ------------------------------------------------------------- directories
    @_fuse
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        row = self.ns.tree.mkdir(parent_inode, _name(name), mode, ctx.uid, ctx.gid)
        self.ns.tree.ref(row.ino)
        return self._entry(row)

    @_fuse
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if not self.ns.files.row(inode).is_dir:
            raise OSError(errno.ENOTDIR, "not a directory")
        await self.remote.refresh(inode)
        return inode

    @_fuse
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        children = self.ns.tree.children(fh)
        for i, row in enumerate(children[start_id:], start=start_id):
            if not pyfuse3.readdir_reply(token, row.name.encode(), self._entry(row), i + 1):
                return
            self.ns.tree.ref(row.ino)

    async def releasedir(self, fh: int) -> None:
        return None

    @_fuse
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        self.ns.journal.sync()

    @_fuse
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        row = self.ns.tree.lookup(parent_inode, _name(name))
        if row.is_dir:
            await self.remote.refresh_tree(row.ino)  # objects never looked at here still make it non-empty
        self.ns.tree.rmdir(parent_inode, _name(name))

    @_fuse
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self.ns.tree.unlink(parent_inode, _name(name))

    @_fuse
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes, flags: int, ctx: pyfuse3.RequestContext) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise OSError(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        src = self.ns.tree.lookup(parent_inode_old, _name(name_old))
        if src.is_dir:
            await self.remote.refresh_tree(src.ino)  # every object below moves, looked at here or not
        self.ns.tree.rename(parent_inode_old, _name(name_old), parent_inode_new, _name(name_new), bool(flags & pyfuse3.RENAME_NOREPLACE))

    @_fuse
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        raise OSError(errno.EPERM, "hard links are not supported")

    @_fuse
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        raise OSError(errno.EPERM, "symbolic links are not supported")

    @_fuse
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if not stat.S_ISREG(mode):
            raise OSError(errno.EPERM, "only regular files and directories are supported")
        row = self.ns.tree.create(parent_inode, _name(name), mode, ctx.uid, ctx.gid, closed=True)
        self.ns.tree.ref(row.ino)
        return self._entry(row)

    # ------------------------------------------------------------------- files
    def _add_handle(self, ino: int, fd: int, write: bool) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = Handle(ino, fd, write)
        return fh

    @_fuse
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        row = self.ns.tree.create(parent_inode, _name(name), mode, ctx.uid, ctx.gid)
        fd = self.ns.files.open(row.ino, write=True)
        self.ns.tree.ref(row.ino)
        direct = self.ns.cfg.direct_io_writes
        return pyfuse3.FileInfo(fh=self._add_handle(row.ino, fd, True), direct_io=direct), self._entry(row)

    @_fuse
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        write = (flags & os.O_ACCMODE) != os.O_RDONLY
        truncate = write and bool(flags & os.O_TRUNC)
        row = self.ns.files.row(inode)
        if row.state == DURABLE and row.parent is not None:
            # close-to-open: the kernel may reuse a name for ATTR_TIMEOUT without a lookup, so the
            # listing (and with it a changed ETag) is checked here too once it is older than the TTL
            await self.remote.refresh(row.parent)
        download = None
        if self.ns.files.needs_fetch(inode):
            if truncate and inode not in self.ns.files.fetching:
                self.ns.files.emptied(inode)  # about to be emptied: nothing to read from the bucket
            elif write:
                FUSE_COUNTERS.cache_misses += 1
                await self.fetcher.ensure_local(inode)  # writes go to a complete copy
            else:
                FUSE_COUNTERS.cache_misses += 1
                download = self.fetcher.start(inode)
        else:
            FUSE_COUNTERS.cache_hits += 1
        fd = self.ns.files.open(inode, write)
        if write and flags & os.O_TRUNC:
            # libfuse negotiates atomic_o_trunc: the kernel leaves O_TRUNC to us
            self.ns.files.truncate(inode, 0)
        fh = self._add_handle(inode, fd, write)
        self.handles[fh].download = download
        # the kernel may keep its cached pages only if they are of the same bytes
        row = self.ns.files.row(inode)
        seen = (row.etag, row.version)
        keep = download is None and self._opened_etag.get(inode, seen) == seen
        self._opened_etag[inode] = seen
        # a write handle with direct_io: no copy into the kernel's page cache, and no cached pages
        # for the kernel to drop when the file's attributes change (see config direct_io_writes)
        direct = write and self.ns.cfg.direct_io_writes
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep and not direct, direct_io=direct)

    @_fuse
    async def read(self, fh: int, off: int, size: int) -> bytes:
        h = self.handles[fh]
        if h.download is not None:
            await h.download.wait(off, size)
        return os.pread(h.fd, size, off)

    @_fuse
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self.handles[fh]
        return await self.ns.space.when_room(lambda: self.ns.files.write(h.ino, h.fd, off, buf))

    @_fuse
    async def flush(self, fh: int) -> None:
        return None

    @_fuse
    async def fsync(self, fh: int, datasync: bool) -> None:
        h = self.handles[fh]
        await trio.to_thread.run_sync(os.fsync, h.fd)
        self.ns.files.fsync(h.ino)

    @_fuse
    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh)
        try:
            os.close(h.fd)
        finally:
            if self.ns.files.release(h.ino, h.write):
                self.ns.on_change()
            self.ns.tree.reap(h.ino)

    # ------------------------------------------------------------------ xattrs
    @_fuse
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if inode == ROOT_INODE and name == XATTR_CONTROL:
            return self.control_socket.encode()
        row = self.ns.files.row(inode)
        if row.is_dir:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        value = {XATTR_STATE: row.state, XATTR_ETAG: row.etag, XATTR_XXH3: row.xxh3}.get(name)
        if name in (XATTR_ETAG, XATTR_XXH3) and row.state != DURABLE:
            value = None
        if not value:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value.encode()

    @_fuse
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        if inode == ROOT_INODE:
            return [XATTR_CONTROL]
        row = self.ns.files.row(inode)
        if row.is_dir:
            return []
        return [XATTR_STATE] + ([XATTR_ETAG, XATTR_XXH3] if row.state == DURABLE else [])

    @_fuse
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        raise OSError(errno.ENOTSUP, "extended attributes are read-only")

    @_fuse
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        raise OSError(errno.ENOTSUP, "extended attributes are read-only")
