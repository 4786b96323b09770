"""The transport-neutral filesystem interface: what a transport calls, in plain Python types.

Why: ckptfs has two transports (the FUSE protocol spoken on /dev/fuse by `kernel.py`, and
pyfuse3/libfuse via `libfuse.py`). The filesystem is written once against this interface;
each transport only turns requests into these calls and the results into replies. Nothing
here imports pyfuse3 or knows the wire format.

Rules every implementation follows:
- Methods raise `OSError(errno, ...)` on failure; the transport turns it into the error
  reply. Any other exception is a bug: the transport logs it and answers EIO.
- Names and xattr names/values are `bytes` exactly as the kernel sent them.
- Lookup counting is the filesystem's: every reply carrying an `Attr` of a new entry
  (lookup, mkdir, mknod, create, symlink, link) gives the kernel one reference, and so does
  each READDIRPLUS entry the transport actually sends (it calls `ref` for those);
  `forget` gives them back. An inode number is never reused.
- `OpenReply.passthrough_fd` is an offer, not an order: the transport decides per inode
  (see `iomode.py`) and tells the filesystem with `opened`. The file handle must be able
  to serve `read`/`write` either way.
"""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestContext:
    """Who asked: the caller's ids as the kernel reports them."""

    uid: int = 0
    gid: int = 0
    pid: int = 0


@dataclass(slots=True)
class Attr:
    """Attributes of one inode, and how long the kernel may cache them (seconds)."""

    ino: int
    mode: int
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    rdev: int = 0
    size: int = 0
    blksize: int = 4096
    blocks: int = 0
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    generation: int = 0
    entry_timeout: float = 1.0
    attr_timeout: float = 1.0


@dataclass(slots=True)
class OpenReply:
    """The result of open/create.

    `direct_io`: the kernel bypasses its page cache for this handle (copy mode only).
    `keep_cache`: the kernel may keep pages cached from an earlier open (copy mode only).
    `passthrough_fd`: a file descriptor of the backing file the kernel may do the reads and
    writes on itself; the filesystem keeps owning it (the kernel takes its own reference).
    """

    fh: int
    direct_io: bool = False
    keep_cache: bool = False
    passthrough_fd: int | None = None


@dataclass(slots=True)
class SetattrFields:
    """What a setattr changes; None means unchanged. `*_now` are already resolved to times."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None
    ctime_ns: int | None = None
    fh: int | None = None  # the handle the change came through (ftruncate), if any
    kill_suidgid: bool = False  # a truncate or chown that must drop setuid/setgid (the kernel leaves it to us)


@dataclass(slots=True)
class StatFs:
    bsize: int = 4096
    frsize: int = 4096
    blocks: int = 0
    bfree: int = 0
    bavail: int = 0
    files: int = 0
    ffree: int = 0
    namemax: int = 255


# one directory entry: (name, attributes, offset of the entry after it)
DirEntry = tuple[bytes, Attr, int]


def _nosys() -> OSError:
    return OSError(errno.ENOSYS, "not implemented")


@dataclass(slots=True)
class FastHandle:
    """A handle a copy worker may serve without asking: its cache file descriptor, its inode, whether
    WRITEs may be served (else READs only), and the size no write may pass (EFBIG by the ordinary way).

    A write handle is withdrawn (`withdraw`, on the trio thread) where the journal must change before
    its bytes do again (its file about to be durable, a write that must drop setuid/setgid). A worker
    asks `admit_write` before each pwrite; one it admitted counts as in flight until its accounting ran
    (`write_accounted`), so the trio thread knows whether bytes changed that it has not heard of yet."""

    fd: int
    ino: int
    write: bool
    size_limit: int
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    withdrawn: bool = False
    writes_in_flight: int = 0

    def admit_write(self) -> bool:
        """In a worker, before its pwrite: False once withdrawn (the WRITE goes the ordinary way)."""
        with self.lock:
            if self.withdrawn:
                return False
            self.writes_in_flight += 1
            return True

    def write_accounted(self) -> None:
        """On the trio thread, once a worker's admitted write was accounted (or failed to be)."""
        with self.lock:
            self.writes_in_flight -= 1

    def withdraw(self) -> int:
        """On the trio thread: no worker starts another write through this handle. Returns the writes
        admitted and not yet accounted: bytes that may have changed, of which the trio thread has not heard."""
        with self.lock:
            self.withdrawn = True
            return self.writes_in_flight


class Operations:
    """Base class: every request answers ENOSYS until a subclass implements it.

    Methods are coroutines run in their own task: a slow one (the network) does not hold up
    others. `ref`, `opened` are plain calls made on the transport's thread.
    """

    # ---------------------------------------------------------------- lifecycle
    async def init(self) -> None:
        """The kernel has answered INIT: the mount is live."""

    async def destroy(self) -> None:
        """The mount is going away."""

    # ---------------------------------------------------------------- inodes
    async def lookup(self, parent: int, name: bytes, ctx: RequestContext) -> Attr:
        raise _nosys()

    def ref(self, ino: int) -> None:
        """One more kernel reference on `ino` (an entry sent in a READDIRPLUS reply)."""

    async def forget(self, items: list[tuple[int, int]]) -> None:
        """The kernel drops `nlookup` references on each inode. Cannot fail."""

    async def getattr(self, ino: int, fh: int | None, ctx: RequestContext) -> Attr:
        raise _nosys()

    async def setattr(self, ino: int, fields: SetattrFields, ctx: RequestContext) -> Attr:
        raise _nosys()

    # Answered at once, on the transport's thread, without a task of their own: requests the kernel sends in
    # the serial chain of every write (a GETATTR after it, the security.capability GETXATTR before the next),
    # where a task's cost is most of the round trip. Each returns None where it would have to wait (then the
    # coroutine above is asked), raises OSError for an error reply.
    def getattr_now(self, ino: int, fh: int | None, ctx: RequestContext) -> Attr | None:
        return None

    def getxattr_now(self, ino: int, name: bytes, ctx: RequestContext) -> bytes | None:
        return None

    async def readlink(self, ino: int, ctx: RequestContext) -> bytes:
        raise _nosys()

    async def access(self, ino: int, mask: int, ctx: RequestContext) -> None:
        """Only asked without `default_permissions`; allow by default."""

    # ---------------------------------------------------------------- namespace
    async def mkdir(self, parent: int, name: bytes, mode: int, ctx: RequestContext) -> Attr:
        raise _nosys()

    async def mknod(self, parent: int, name: bytes, mode: int, rdev: int, ctx: RequestContext) -> Attr:
        raise _nosys()

    async def symlink(self, parent: int, name: bytes, target: bytes, ctx: RequestContext) -> Attr:
        raise _nosys()

    async def link(self, ino: int, new_parent: int, new_name: bytes, ctx: RequestContext) -> Attr:
        raise _nosys()

    async def unlink(self, parent: int, name: bytes, ctx: RequestContext) -> None:
        raise _nosys()

    async def rmdir(self, parent: int, name: bytes, ctx: RequestContext) -> None:
        raise _nosys()

    async def rename(self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes, flags: int, ctx: RequestContext) -> None:
        """`flags`: RENAME_NOREPLACE (1) / RENAME_EXCHANGE (2) as in renameat2(2)."""
        raise _nosys()

    async def statfs(self, ctx: RequestContext) -> StatFs:
        return StatFs()

    # ---------------------------------------------------------------- files
    async def create(self, parent: int, name: bytes, mode: int, flags: int, ctx: RequestContext) -> tuple[OpenReply, Attr]:
        raise _nosys()

    async def open(self, ino: int, flags: int, ctx: RequestContext) -> OpenReply:
        raise _nosys()

    def opened(self, fh: int, passthrough: bool) -> None:
        """The transport's decision for handle `fh`: passthrough (no read/write will come)
        or copy mode. Called before the reply reaches the kernel."""

    async def read(self, fh: int, offset: int, size: int) -> bytes | bytearray | memoryview:
        raise _nosys()

    async def write(self, fh: int, offset: int, data: memoryview) -> int:
        """`data` is only valid until this returns: copy it if it must outlive the call."""
        raise _nosys()

    # The copy workers' fast path (kernel transport, copy mode; fuse/workers.py). Worker threads read
    # `fast_handles` (the trio thread alone changes it) and move the bytes of READ and WRITE themselves;
    # the calls below run on the trio thread, quick and synchronous. A handle not in the table, or no
    # room lent, sends the request the ordinary way (`read`/`write` in a trio task: waits, raises).
    fast_handles: dict[int, FastHandle]

    def lend(self, want: int, need: int) -> int:
        """Room in the cache for a worker's next writes: up to `want` bytes, at least `need`, or 0."""
        return 0

    def repay(self, n: int) -> None:
        """Lent room a worker did not use."""

    def wrote(self, handle: FastHandle, offset: int, lent: int, written: int, error: int) -> None:
        """A worker's pwrite of a WRITE through `handle`: `written` bytes at `offset` (`error`: its errno,
        0 if none), on `lent` bytes of lent room. The WRITE is answered after this returns (an OSError
        raised here: answered with its errno), so whatever the kernel sends next sees the write accounted."""

    def fast_reads(self, count: int, error: int = 0) -> None:
        """`count` READs a worker served (`error`: one of them failed with this errno)."""

    async def flush(self, fh: int) -> None:
        """close(2) of one file descriptor (may come several times per handle). Not implemented by
        default: the kernel takes ENOSYS as "never send FLUSH again" (fc->no_flush), which saves a
        request per close; a filesystem with something to do at each close overrides it."""
        raise _nosys()

    async def fsync(self, fh: int, datasync: bool) -> None:
        raise _nosys()

    async def release(self, fh: int) -> None:
        """The last reference to the handle is gone."""

    async def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "fallocate is not supported")

    async def lseek(self, fh: int, offset: int, whence: int) -> int:
        raise _nosys()

    # ---------------------------------------------------------------- directories
    async def opendir(self, ino: int, ctx: RequestContext) -> int:
        return 0

    async def readdir(self, fh: int, offset: int, plus: bool, ctx: RequestContext) -> list[DirEntry]:
        """Entries after `offset` (0 = from the start). The transport sends as many as fit
        and asks again from the last sent entry's next offset; return a prefix if listing all
        is costly. With `plus`, each entry sent is a lookup (the transport calls `ref`)."""
        raise _nosys()

    async def releasedir(self, fh: int) -> None:
        pass

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        pass

    # ---------------------------------------------------------------- xattrs
    async def getxattr(self, ino: int, name: bytes, ctx: RequestContext) -> bytes:
        raise OSError(errno.ENODATA, "no such attribute")

    async def listxattr(self, ino: int, ctx: RequestContext) -> list[bytes]:
        return []

    async def setxattr(self, ino: int, name: bytes, value: bytes, flags: int, ctx: RequestContext) -> None:
        raise OSError(errno.ENOTSUP, "extended attributes are not supported")

    async def removexattr(self, ino: int, name: bytes, ctx: RequestContext) -> None:
        raise OSError(errno.ENOTSUP, "extended attributes are not supported")


__all__ = [
    "Attr",
    "DirEntry",
    "OpenReply",
    "Operations",
    "RequestContext",
    "SetattrFields",
    "StatFs",
]
