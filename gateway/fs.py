"""FUSE operations: translate kernel requests into namespace calls. Owns no policy.

Written against the transport-neutral `fuse.ops.Operations`: the same class is served by
the kernel transport (`fuse/kernel.py`, the protocol spoken on /dev/fuse, with passthrough)
and by pyfuse3 (`fuse/libfuse.py`). Every handler goes through `_fuse`, which counts the
request and turns anything unexpected into EIO (logged); `OSError`s pass to the transport,
which answers with their errno.

Passthrough (kernel transport only): a write handle of a file in the cache, while the cache
has `passthrough_min_room` to spare, and a read handle of a file that is entirely in the
cache, are offered to the kernel, which then reads and writes the cache file itself: no
WRITE reaches us. So such a file counts as modified from its open for writing (a new
version, `dirty` in the journal) until its last release, where its size and mtime are
taken from the cache file (also on FSYNC, GETATTR and truncate while it is open). FSYNC
still comes here: we fsync the cache file. Not checked per write under passthrough: the
cache capacity (hence the room rule), `max_file_size` (a file at or past it gets copy
mode) and setuid/setgid (a writer who must drop them gets copy mode).

Data path: in copy mode under the kernel transport, the copy workers (fuse/workers.py) move
the bytes themselves, in threads, for the handles `FastPath` publishes in `fast_handles` (a write
handle only while its file is dirty in the journal: a file is dirty there before any byte of it
changes): they pwrite/pread the cache file on room lent by `lend`, and each write is accounted by
`wrote` on the trio thread (size, version, cache bytes) before the kernel has its reply. Otherwise (pyfuse3,
a handle not published, no room) `write` and `read` are `pwrite`/`pread` on the cache file, done
inline on the trio thread. `fsync` is the one blocking call sent to a thread (the
cache file's here, the journal's WAL in `Journal.durable`).
A file that is only in the bucket is opened at once; its reads wait for the
ranges they need (`fetch.Download`). Lookups and readdir first let `remote`
refresh the directory's listing when it is older than `metadata_ttl`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import stat
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, TypeVar

import trio

from .fetch import Download, Fetcher
from .fuse.invalidations import Invalidations
from .fuse.ops import Attr, DirEntry, FastHandle, OpenReply, Operations, RequestContext, SetattrFields, StatFs
from .journal import DURABLE, ROOT_INODE, Row
from .metrics import FUSE_COUNTERS
from .namespace import NAME_MAX, Namespace
from .namespace.keys import is_reserved
from .remote import Remote
from .xattrs import CheckpointStates, Replication, Xattrs

log = logging.getLogger(__name__)

ATTR_TIMEOUT = 1.0
# entries per readdir reply: the kernel asks with a page (4 KiB), which holds about 25 READDIRPLUS or 100 READDIR
# entries of short names; more are asked for again from the last one sent
READDIRPLUS_PAGE = 32
READDIR_PAGE = 128
FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h
BLOCK = 4096
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
G = TypeVar("G", bound=Callable[..., Any])


def _fuse(fn: F) -> F:
    op = fn.__name__.lstrip("_")  # `_flush`: the FLUSH a `flush` under durability = peer passes on
    requests = FUSE_COUNTERS.requests  # counted per request: a plain dict increment
    requests.setdefault(op, 0)

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        requests[op] += 1
        try:
            return await fn(*args, **kwargs)
        except OSError as e:
            FUSE_COUNTERS.error(op, e.errno or errno.EIO)
            if not e.errno:
                raise OSError(errno.EIO, str(e)) from None
            raise
        except Exception:
            log.exception("internal error in %s", fn.__name__)
            FUSE_COUNTERS.error(op, errno.EIO)
            raise OSError(errno.EIO, "internal error") from None

    return wrapper  # type: ignore[return-value]


def _fuse_now(op: str) -> Callable[[G], G]:
    """`_fuse` for the handlers answered at once (`getattr_now`, `getxattr_now`): counted under `op` when they
    answer (a None result is counted by the coroutine the transport then asks)."""
    requests = FUSE_COUNTERS.requests
    requests.setdefault(op, 0)

    def wrap(fn: G) -> G:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                result = fn(*args, **kwargs)
            except OSError as e:
                requests[op] += 1
                FUSE_COUNTERS.error(op, e.errno or errno.EIO)
                if not e.errno:
                    raise OSError(errno.EIO, str(e)) from None
                raise
            except Exception:
                requests[op] += 1
                log.exception("internal error in %s", op)
                FUSE_COUNTERS.error(op, errno.EIO)
                raise OSError(errno.EIO, "internal error") from None
            if result is not None:
                requests[op] += 1
            return result

        return wrapper  # type: ignore[return-value]

    return wrap


def _name(raw: bytes) -> str:
    if len(raw) > NAME_MAX:
        # the kernel leaves the limit to the filesystem: without this a lookup would say ENOENT
        raise OSError(errno.ENAMETOOLONG, "file name longer than 255 bytes")
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
    uid: int = 0  # who opened it: a write request has no request context
    kill_priv: bool = False  # the next write must drop setuid/setgid (the opener may not keep them)
    passthrough: bool = False  # the kernel reads/writes the cache file itself


class Guard(Protocol):
    """What every changing operation asks first; raises OSError (EPERM) to refuse.

    The filesystem owns this interface and the lifecycle supplies the implementation that knows
    protected checkpoints (lifecycle/protect.Guard, wired by the daemon), so fs.py never imports
    the lifecycle and, through it, the store."""

    def check_entry(self, parent: int, name: str, subtree: bool = False) -> None:
        """Before creating, removing or renaming `name` in directory `parent` (`subtree`: it may be a directory moving or going)."""

    def check_inode(self, ino: int) -> None:
        """Before changing the bytes or attributes of inode `ino`."""


class ReservedNames:
    """The guard of a mount without a lifecycle: only ckptfs's own names (.ckptfs*) are refused."""

    def check_entry(self, parent: int, name: str, subtree: bool = False) -> None:
        if is_reserved(name):
            raise OSError(errno.EPERM, f"{name}: names beginning with .ckptfs are reserved for ckptfs")

    def check_inode(self, ino: int) -> None:
        pass


class FastPath:
    """The copy-mode handles the copy workers (fuse/workers.py) serve themselves, and the rule they keep:
    a file is dirty in the journal before any byte of it changes. A worker's WRITE makes no journal
    write (no round trip to the trio thread), so a write handle is published only while its file is
    dirty in the journal, and withdrawn before the journal may say otherwise (its file made durable or
    to be published by a copy: `Uploads.stop_fast_writes`) or when its next write must drop setuid/setgid."""

    def __init__(self, ns: Namespace, handles: dict[int, Handle]) -> None:
        self.ns = ns
        self.handles = handles  # CkptFS's, by fh
        self.table: dict[int, FastHandle] = {}  # read by the workers, changed here on the trio thread
        ns.uploads.stop_fast_writes = self.stop_writes

    def publish(self, fh: int) -> None:
        """Put a copy-mode handle in the table: a read handle once every byte is local; a write handle
        once its file is dirty in the journal (a durable file rewritten in place is marked dirty by its
        first write, which goes the ordinary way) and unless its next write must drop setuid/setgid."""
        h = self.handles[fh]
        if h.passthrough or h.download is not None or h.write and h.kill_priv:
            return
        current = self.table.get(fh)
        if current is not None and not current.withdrawn:
            return
        if h.write and not self.ns.files.dirty_in_journal(h.ino):
            return
        self.table[fh] = FastHandle(h.fd, h.ino, h.write, self.ns.cfg.file_size_limit)

    def withdraw(self, fh: int) -> int:
        """Take handle `fh` off the fast path: its writes go the ordinary way until published again.
        Returns its writes in flight (pwritten by a worker, not yet accounted)."""
        fast = self.table.pop(fh, None)
        return fast.withdraw() if fast is not None else 0

    def stop_writes(self, ino: int) -> bool:
        """Before the journal says `ino` is durable (or to be published by a copy): no worker may change
        its bytes unseen. Its write handles leave the fast path (a later write goes the ordinary way, marks
        the file dirty first and publishes the handle again); False if a worker's write is still to be
        accounted (the bytes uploaded may not be the file's)."""
        live = self.ns.files.live.get(ino)
        if live is None or not live.writers:
            return True
        in_flight = 0
        for fh, fast in list(self.table.items()):
            if fast.ino == ino and fast.write:
                in_flight += self.withdraw(fh)
        return in_flight == 0

    def wrote(self, handle: FastHandle, offset: int, lent: int, written: int, error: int) -> None:
        """A worker's pwrite, accounted before its reply; an error here is the WRITE's answer."""
        FUSE_COUNTERS.requests["write"] += 1
        try:
            self.ns.files.wrote(handle.ino, offset, lent, written)
        except Exception as e:
            # the bytes are in the cache file and the accounting failed: the WRITE is answered with the
            # error, and an upload in flight must not publish the file as it was
            if not isinstance(e, OSError):
                log.exception("internal error in write (a copy worker's)")
            error = e.errno if isinstance(e, OSError) and e.errno else errno.EIO
            handle.withdraw()  # its next writes go the ordinary way, which reports what fails
            try:
                self.ns.files.abandon_upload(handle.ino)
            finally:
                FUSE_COUNTERS.error("write", error)
            raise OSError(error, "accounting a write failed") from None
        if error:
            FUSE_COUNTERS.error("write", error)


def _chown_to_the_same(fields: SetattrFields) -> bool:
    """`chown(path, -1, -1)`: with HANDLE_KILLPRIV(_V2) the kernel drops the kill bits it leaves to us and has no
    owner to send, so it arrives as a SETATTR that changes nothing (at most the change time, with a writeback
    cache). Linux's own file systems drop setuid and setgid then, as on any chown, whoever calls it (tmpfs:
    06555 -> 0555). utimensat with both times omitted never reaches a file system; nothing else sends an empty one."""
    return (fields.size is None and fields.mode is None and fields.uid is None and fields.gid is None
            and fields.atime_ns is None and fields.mtime_ns is None)


class CkptFS(Operations):
    def __init__(self, ns: Namespace, fetcher: Fetcher, remote: Remote, control_socket: str, guard: Guard | None = None) -> None:
        super().__init__()
        self.ns = ns
        self.guard: Guard = guard or ReservedNames()  # refuses changes to protected checkpoints and ckptfs's own names
        self.fetcher = fetcher
        self.remote = remote
        self._opened_etag: dict[int, tuple[str | None, int]] = {}  # (etag, version) of the bytes the kernel may still cache
        self.control_socket = control_socket
        self.xattrs = Xattrs(ns, fetcher, control_socket)
        self.checkpoint_states: CheckpointStates | None = None  # a checkpoint directory's user.ckptfs.state (the lifecycle)
        self.peers: Replication | None = None  # durability = peer: fsync and FLUSH wait for the peers' copies
        self.invalidations: Invalidations | None = None  # what listings made the kernel forget (the daemon's)
        self.handles: dict[int, Handle] = {}
        self._next_fh = 1
        # fsync gets threads of its own: worker threads stuck on a hung object store never delay it
        self._fsyncs = trio.CapacityLimiter(8)
        self._pt_writers: dict[int, list[int]] = {}  # ino -> fhs of passthrough write handles
        self.fast = FastPath(ns, self.handles)
        self.fast_handles: dict[int, FastHandle] = self.fast.table  # copy-mode handles the copy workers serve themselves

    @property
    def passthrough_handles(self) -> int:
        return sum(1 for h in self.handles.values() if h.passthrough)

    # ------------------------------------------------------------- attributes
    def _entry(self, row: Row) -> Attr:
        if row.is_dir:
            nlink = 2 + self.ns.journal.subdirs(row.ino)
        else:
            nlink = 0 if row.parent is None else 1  # unlinked while open
        size = row.size if not row.is_dir else BLOCK
        mtime_ns, ctime_ns = row.mtime_ns, row.ctime_ns
        fhs = self._pt_writers.get(row.ino)
        if fhs:
            # the kernel writes the cache file behind our back: it knows the size and times
            st = os.fstat(self.handles[fhs[0]].fd)
            size, mtime_ns, ctime_ns = st.st_size, st.st_mtime_ns, max(ctime_ns, st.st_mtime_ns)
        return Attr(
            ino=row.ino,
            mode=row.mode,
            nlink=nlink,
            uid=row.uid,
            gid=row.gid,
            size=size,
            blksize=BLOCK,
            blocks=(size + 511) // 512,
            atime_ns=row.atime_ns if row.atime_ns is not None else mtime_ns,
            mtime_ns=mtime_ns,
            ctime_ns=ctime_ns,
            entry_timeout=ATTR_TIMEOUT,
            attr_timeout=ATTR_TIMEOUT,
        )

    def _sync_passthrough(self, ino: int) -> None:
        """Take the size and mtime of a file the kernel writes itself from its cache file."""
        fhs = self._pt_writers.get(ino)
        if fhs:
            st = os.fstat(self.handles[fhs[0]].fd)
            self.ns.files.changed_behind(ino, st.st_size, st.st_mtime_ns)

    def sync_passthrough_all(self) -> None:
        """Files open for writing under passthrough get their sizes recorded: at unmount, and before `status` counts
        dirty and cached bytes (the kernel wrote them without telling us: an open 1 MiB file would count as 0 B)."""
        for ino in list(self._pt_writers):
            try:
                self._sync_passthrough(ino)
            except OSError:
                log.exception("recording the size of inode %d", ino)

    @_fuse
    async def getattr(self, ino: int, fh: int | None, ctx: RequestContext) -> Attr:
        return self._entry(self.ns.files.row(ino))

    @_fuse_now("getattr")
    def getattr_now(self, ino: int, fh: int | None, ctx: RequestContext) -> Attr:
        """Everything getattr does is at hand: the journal's row and, for a passthrough writer, its cache file."""
        return self._entry(self.ns.files.row(ino))

    @_fuse
    async def lookup(self, parent_inode: int, name: bytes, ctx: RequestContext) -> Attr:
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

    def ref(self, ino: int) -> None:
        self.ns.tree.ref(ino)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            try:
                self.ns.tree.forget(ino, n)
            except Exception:  # forget cannot report errors
                log.exception("forget(%d)", ino)

    @_fuse
    async def setattr(self, inode: int, fields: SetattrFields, ctx: RequestContext) -> Attr:
        self.guard.check_inode(inode)
        if fields.size is not None:
            if self.ns.files.row(inode).is_dir:
                raise OSError(errno.EISDIR, "is a directory")
            if self.ns.files.needs_fetch(inode):
                await self.fetcher.ensure_local(inode)
            self._sync_passthrough(inode)  # the size to account from is the cache file's
            self.ns.files.truncate(inode, fields.size)
        self.ns.tree.setattr(
            inode,
            mode=fields.mode,
            uid=fields.uid,
            gid=fields.gid,
            atime_ns=fields.atime_ns,
            mtime_ns=fields.mtime_ns,
            # a truncate by a caller who may not keep setuid/setgid, or a chown/chgrp: as local file systems do
            # (Linux drops them on every chown of a file), and with HANDLE_KILLPRIV(_V2) the kernel leaves it to
            # us; in the same journal write as the new owner, so a chown is never half done
            kill_priv=fields.mode is None and (fields.kill_suidgid or fields.uid is not None or fields.gid is not None
                                               or _chown_to_the_same(fields)),
        )
        if fields.mode is not None:
            for fh, h in self.handles.items():
                if h.ino == inode and h.write:
                    h.kill_priv = self._kill_priv(h.uid, inode)
                    if h.kill_priv:
                        self.fast.withdraw(fh)  # its next write must drop setuid/setgid: the ordinary way does
        return self._entry(self.ns.files.row(inode))

    @_fuse
    async def statfs(self, ctx: RequestContext) -> StatFs:
        cache = self.ns.cache
        free = max(0, cache.capacity_bytes - cache.used_bytes) // BLOCK
        return StatFs(bsize=BLOCK, frsize=BLOCK, blocks=cache.capacity_bytes // BLOCK, bfree=free, bavail=free,
                      files=1 << 32, ffree=1 << 31, namemax=255)

    # ------------------------------------------------------------- directories
    @_fuse
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: RequestContext) -> Attr:
        self.guard.check_entry(parent_inode, _name(name))
        row = self.ns.tree.mkdir(parent_inode, _name(name), mode, ctx.uid, ctx.gid)
        self.ns.tree.ref(row.ino)
        return self._entry(row)

    @_fuse
    async def opendir(self, inode: int, ctx: RequestContext) -> int:
        if not self.ns.files.row(inode).is_dir:
            raise OSError(errno.ENOTDIR, "not a directory")
        await self.remote.refresh(inode)
        if self.invalidations is not None:
            # before the READDIR shows the listing: a name it no longer shows must not answer a stat from the
            # kernel's cache (OPENDIR holds no directory lock, so the invalidation can be waited for here)
            await self.invalidations.delivered()
        return inode

    @_fuse
    async def readdir(self, fh: int, offset: int, plus: bool, ctx: RequestContext) -> list[DirEntry]:
        # the transport sends what fits and, with `plus`, calls `ref` for each entry it sent; a page of about
        # what fits (a 4 KiB reply), so listing or `rm -rf` of a directory of many files costs each call the same
        children = self.ns.tree.children(fh, offset, READDIRPLUS_PAGE if plus else READDIR_PAGE)
        return [(row.name.encode(), self._entry(row), i + 1) for i, row in enumerate(children, start=offset)]

    async def releasedir(self, fh: int) -> None:
        return None

    @_fuse
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        await self.ns.journal.durable()

    @_fuse
    async def rmdir(self, parent_inode: int, name: bytes, ctx: RequestContext) -> None:
        row = self.ns.tree.lookup(parent_inode, _name(name))
        if row.is_dir:
            await self.remote.refresh_tree(row.ino, "rmdir")  # objects never looked at here still make it non-empty
        self.guard.check_entry(parent_inode, _name(name), subtree=True)
        self.ns.tree.rmdir(parent_inode, _name(name))
        if self.peers is not None:
            await self.peers.names_replicated()  # the peers hold the change before it returns (docs/peers.md)

    @_fuse
    async def unlink(self, parent_inode: int, name: bytes, ctx: RequestContext) -> None:
        self.guard.check_entry(parent_inode, _name(name))
        self.ns.tree.unlink(parent_inode, _name(name))
        if self.peers is not None:
            await self.peers.names_replicated()  # the peers hold the change before it returns (docs/peers.md)

    @_fuse
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes, flags: int, ctx: RequestContext) -> None:
        if flags & RENAME_EXCHANGE:
            raise OSError(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        src = self.ns.tree.lookup(parent_inode_old, _name(name_old))
        if src.is_dir:
            await self.remote.refresh_tree(src.ino, "rename")  # every object below moves, looked at here or not
        self.guard.check_entry(parent_inode_old, _name(name_old), subtree=True)
        self.guard.check_entry(parent_inode_new, _name(name_new))
        self.ns.tree.rename(parent_inode_old, _name(name_old), parent_inode_new, _name(name_new), bool(flags & RENAME_NOREPLACE))
        if self.peers is not None:
            # under durability = peer a rename returns once R peers hold the new names (one round trip): a node lost
            # right after is taken over with the names the writer saw, directory fsync or not (docs/semantics.md)
            await self.peers.names_replicated()

    @_fuse
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: RequestContext) -> Attr:
        raise OSError(errno.EPERM, "hard links are not supported")

    @_fuse
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: RequestContext) -> Attr:
        raise OSError(errno.EPERM, "symbolic links are not supported")

    @_fuse
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: RequestContext) -> Attr:
        if not stat.S_ISREG(mode):
            raise OSError(errno.EPERM, "only regular files and directories are supported")
        self.guard.check_entry(parent_inode, _name(name))
        row = self.ns.tree.create(parent_inode, _name(name), mode, ctx.uid, ctx.gid, closed=True)
        self.ns.tree.ref(row.ino)
        return self._entry(row)

    # ------------------------------------------------------------------- files
    def _add_handle(self, ino: int, fd: int, write: bool, uid: int = 0) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = Handle(ino, fd, write, uid=uid, kill_priv=write and self._kill_priv(uid, ino))
        return fh

    def _kill_priv(self, uid: int, ino: int) -> bool:
        """True if a write by `uid` must drop the file's setuid/setgid bits (as the kernel does for a
        writer without CAP_FSETID; with direct_io writes it leaves that to the filesystem)."""
        return uid != 0 and bool(self.ns.files.row(ino).mode & (stat.S_ISUID | stat.S_ISGID))

    def _offer_passthrough(self, fh: int, download: Download | None) -> int | None:
        """The cache file's fd if handle `fh` may be passthrough: the whole file is in the cache,
        and a writer (never stalled by us under passthrough) leaves the cache enough room."""
        h = self.handles[fh]
        if download is not None or h.ino in self.ns.files.fetching or self.ns.files.needs_fetch(h.ino):
            return None  # bytes still arriving: copy mode until the file is whole
        if h.write:
            if h.kill_priv:
                return None  # its first write must drop setuid/setgid: we must see it
            if self.ns.files.size_of(self.ns.files.row(h.ino)) >= self.ns.cfg.file_size_limit:
                return None  # copy mode refuses the write past the limit with EFBIG
            if self.ns.cache.room() < self.ns.cfg.passthrough_min_room:
                return None  # copy mode: writers wait for the drain (backpressure), then ENOSPC
        return h.fd

    def opened(self, fh: int, passthrough: bool) -> None:
        h = self.handles.get(fh)
        if h is None:
            return
        if not passthrough:
            self.fast.publish(fh)
            return
        h.passthrough = True
        if h.write:
            # no WRITE will tell us: the file counts as modified from now to its last release
            self._pt_writers.setdefault(h.ino, []).append(fh)
            self.ns.files.changed_behind(h.ino, None, None)

    @_fuse
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: RequestContext) -> tuple[OpenReply, Attr]:
        self.guard.check_entry(parent_inode, _name(name))
        row = self.ns.tree.create(parent_inode, _name(name), mode, ctx.uid, ctx.gid)
        fd = self.ns.files.open(row.ino, write=True, created=row)
        self.ns.tree.ref(row.ino)
        direct = self.ns.cfg.direct_io_writes
        fh = self._add_handle(row.ino, fd, True, ctx.uid)
        return OpenReply(fh=fh, direct_io=direct, passthrough_fd=self._offer_passthrough(fh, None)), self._entry(row)

    @_fuse
    async def open(self, inode: int, flags: int, ctx: RequestContext) -> OpenReply:
        write = (flags & os.O_ACCMODE) != os.O_RDONLY
        truncate = write and bool(flags & os.O_TRUNC)
        if write:
            self.guard.check_inode(inode)
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
                await self.fetcher.refuse_if_archived(inode)  # ENOMEDIUM naming `ckptfs restore PATH`, before any GET
                await self.fetcher.ensure_local(inode)  # writes go to a complete copy
            else:
                FUSE_COUNTERS.cache_misses += 1
                await self.fetcher.refuse_if_archived(inode)
                download = self.fetcher.start(inode)
        else:
            FUSE_COUNTERS.cache_hits += 1
        fd = self.ns.files.open(inode, write)
        if write and flags & os.O_TRUNC:
            # libfuse negotiates atomic_o_trunc: the kernel leaves O_TRUNC to us
            try:
                self.ns.files.truncate(inode, 0)
            except BaseException:  # refused (a full cache disk): the open did not happen, no handle stays behind
                os.close(fd)
                with contextlib.suppress(OSError):
                    self.ns.files.release(inode, write)
                raise
        fh = self._add_handle(inode, fd, write, ctx.uid)
        self.handles[fh].download = download
        # the kernel may keep its cached pages only if they are of the same bytes
        row = self.ns.files.row(inode)
        seen = (row.etag, row.version)
        keep = download is None and self._opened_etag.get(inode, seen) == seen
        self._opened_etag[inode] = seen
        # a write handle with direct_io: no copy into the kernel's page cache, and no cached pages
        # for the kernel to drop when the file's attributes change (see config direct_io_writes)
        direct = write and self.ns.cfg.direct_io_writes
        return OpenReply(fh=fh, keep_cache=keep and not direct, direct_io=direct, passthrough_fd=self._offer_passthrough(fh, download))

    @_fuse
    async def read(self, fh: int, off: int, size: int) -> bytes:
        h = self.handles[fh]
        if h.download is not None:
            await h.download.wait(off, size)
        return os.pread(h.fd, size, off)

    @_fuse
    async def write(self, fh: int, off: int, buf: memoryview) -> int:
        h = self.handles[fh]
        n = await self.ns.space.when_room(lambda: self.ns.files.write(h.ino, h.fd, off, buf), h.ino)
        if h.kill_priv:
            h.kill_priv = False
            self.ns.tree.kill_priv(h.ino)
        if fh in self.handles and not h.passthrough:
            self.fast.publish(fh)  # the file is dirty in the journal now: later writes may go to the copy workers
        return n

    # ------------------------------------- the copy workers' fast path (fuse/ops.py, fuse/workers.py)
    def lend(self, want: int, need: int) -> int:
        return self.ns.space.lend(want, need)

    def repay(self, n: int) -> None:
        self.ns.space.repay(n)

    def wrote(self, handle: FastHandle, offset: int, lent: int, written: int, error: int) -> None:
        self.fast.wrote(handle, offset, lent, written, error)

    def fast_reads(self, count: int, error: int = 0) -> None:
        FUSE_COUNTERS.requests["read"] += count
        if error:
            FUSE_COUNTERS.error("read", error)

    @_fuse
    async def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        """Mode 0 and FALLOC_FL_KEEP_SIZE on a cached file; punching holes, zeroing ranges and the like: EOPNOTSUPP.

        The kernel transport passes FALLOCATE on; pyfuse3 3.5 has no fallocate handler (libfuse
        answers ENOSYS and the kernel then gives EOPNOTSUPP to every caller; glibc's
        posix_fallocate falls back to writing).
        """
        if mode & ~FALLOC_FL_KEEP_SIZE:
            raise OSError(errno.EOPNOTSUPP, "only fallocate mode 0 and FALLOC_FL_KEEP_SIZE are supported")
        if offset < 0 or length <= 0:
            raise OSError(errno.EINVAL, "bad offset or length")
        h = self.handles[fh]
        if not h.write:
            raise OSError(errno.EBADF, "not open for writing")
        await self.ns.space.when_room(lambda: self.ns.files.allocate(h.ino, h.fd, offset, length, bool(mode & FALLOC_FL_KEEP_SIZE)),
                                     h.ino)

    @_fuse
    async def fsync(self, fh: int, datasync: bool) -> None:
        # under passthrough too: the kernel does not fsync the cache file, we do
        h = self.handles[fh]
        await trio.to_thread.run_sync(os.fsync, h.fd, limiter=self._fsyncs)
        self._sync_passthrough(h.ino)
        await self.ns.files.fsync(h.ino)
        if self.peers is not None:
            await self.peers.replicated(h.ino)

    async def flush(self, fh: int) -> None:
        """close(2). Under `durability = local` ENOSYS: the kernel then never sends FLUSH again (one request less per
        close). Under `peer` the close of a write handle waits for the peers' copies, as an fsync does: torch.save and
        safetensors never call fsync."""
        if self.peers is None:
            raise OSError(errno.ENOSYS, "not implemented")
        await self._flush(fh)

    @_fuse
    async def _flush(self, fh: int) -> None:
        h = self.handles.get(fh)
        if h is None or not h.write or self.peers is None:
            return
        self._sync_passthrough(h.ino)  # what the kernel wrote under passthrough: a new version to seal
        await self.peers.replicated(h.ino)

    def passthrough_writers(self) -> list[int]:
        """Files the kernel is writing itself now (passthrough): the peers' sender polls their sizes."""
        return list(self._pt_writers)

    @_fuse
    async def release(self, fh: int) -> None:
        self.fast_handles.pop(fh, None)
        h = self.handles[fh]
        try:
            if h.passthrough and h.write:
                self._sync_passthrough(h.ino)
                fhs = self._pt_writers[h.ino]
                fhs.remove(fh)
                if not fhs:
                    del self._pt_writers[h.ino]
        finally:
            del self.handles[fh]
        try:
            os.close(h.fd)
        finally:
            if self.ns.files.release(h.ino, h.write):
                self.ns.on_change()
            self.ns.tree.reap(h.ino)

    # ------------------------------------------------------------------ xattrs (their values: xattrs.py)
    @_fuse_now("getxattr")
    def getxattr_now(self, inode: int, name: bytes, ctx: RequestContext) -> bytes | None:
        return self.xattrs.known_now(inode, name)

    @_fuse
    async def getxattr(self, inode: int, name: bytes, ctx: RequestContext) -> bytes:
        return await self.xattrs.value(inode, name, self.checkpoint_states, self.peers)

    @_fuse
    async def listxattr(self, inode: int, ctx: RequestContext) -> list[bytes]:
        return self.xattrs.names(inode, self.checkpoint_states)

    @_fuse
    async def setxattr(self, inode: int, name: bytes, value: bytes, flags: int, ctx: RequestContext) -> None:
        raise OSError(errno.ENOTSUP, "extended attributes are read-only")

    @_fuse
    async def removexattr(self, inode: int, name: bytes, ctx: RequestContext) -> None:
        raise OSError(errno.ENOTSUP, "extended attributes are read-only")
