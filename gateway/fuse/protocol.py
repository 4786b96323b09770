"""The FUSE wire protocol (Linux include/uapi/linux/fuse.h, 7.40+): parse requests, encode replies.

Why a module of its own: Debian's libfuse 3.14 / pyfuse3 3.5 stop at protocol 7.38 and cannot
ask for passthrough, so ckptfs speaks the protocol itself (`kernel.py`). Everything here is a
pure function of bytes and dataclasses, testable without a mount.

Layouts (all little-endian, 64-bit aligned, as the kernel's structs):
- every request starts with fuse_in_header (40 bytes), every reply with fuse_out_header
  (16 bytes: len, -errno, unique); a notification is a reply with unique 0 and the notify
  code in the error field.
- WRITE payloads are returned as a memoryview into the read buffer (no copy): the caller
  keeps the buffer until the write is handled.
"""

from __future__ import annotations

import enum
import stat
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

from .ops import Attr, StatFs

KERNEL_VERSION = 7
KERNEL_MINOR_VERSION = 40  # what we implement: passthrough, init flags2, max_stack_depth
ROOT_ID = 1
MIN_READ_BUFFER = 8192
# header + fuse_write_in: a read buffer must hold this much beyond max_write
WRITE_OVERHEAD = 40 + 40


class Op(enum.IntEnum):
    LOOKUP = 1
    FORGET = 2
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47
    SETUPMAPPING = 48
    REMOVEMAPPING = 49
    SYNCFS = 50
    TMPFILE = 51
    STATX = 52


class Notify(enum.IntEnum):
    POLL = 1
    INVAL_INODE = 2
    INVAL_ENTRY = 3
    STORE = 4
    RETRIEVE = 5
    DELETE = 6
    RESEND = 7


# INIT flags; bits 32..63 travel in flags2
ASYNC_READ = 1 << 0
POSIX_LOCKS = 1 << 1
ATOMIC_O_TRUNC = 1 << 3
EXPORT_SUPPORT = 1 << 4
BIG_WRITES = 1 << 5
DONT_MASK = 1 << 6
FLOCK_LOCKS = 1 << 10
AUTO_INVAL_DATA = 1 << 12
DO_READDIRPLUS = 1 << 13
READDIRPLUS_AUTO = 1 << 14
ASYNC_DIO = 1 << 15
WRITEBACK_CACHE = 1 << 16
PARALLEL_DIROPS = 1 << 18
HANDLE_KILLPRIV = 1 << 19
POSIX_ACL = 1 << 20
MAX_PAGES = 1 << 22
CACHE_SYMLINKS = 1 << 23
EXPLICIT_INVAL_DATA = 1 << 25
HANDLE_KILLPRIV_V2 = 1 << 28
SETXATTR_EXT = 1 << 29
INIT_EXT = 1 << 30
SECURITY_CTX = 1 << 32
CREATE_SUPP_GROUP = 1 << 34
HAS_EXPIRE_ONLY = 1 << 35
DIRECT_IO_ALLOW_MMAP = 1 << 36
PASSTHROUGH = 1 << 37
NO_EXPORT_SUPPORT = 1 << 38
HAS_RESEND = 1 << 39

# fuse_open_out.open_flags
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_NONSEEKABLE = 1 << 2
FOPEN_CACHE_DIR = 1 << 3
FOPEN_STREAM = 1 << 4
FOPEN_NOFLUSH = 1 << 5
FOPEN_PARALLEL_DIRECT_WRITES = 1 << 6
FOPEN_PASSTHROUGH = 1 << 7

# fuse_setattr_in.valid
FATTR_MODE = 1 << 0
FATTR_UID = 1 << 1
FATTR_GID = 1 << 2
FATTR_SIZE = 1 << 3
FATTR_ATIME = 1 << 4
FATTR_MTIME = 1 << 5
FATTR_FH = 1 << 6
FATTR_ATIME_NOW = 1 << 7
FATTR_MTIME_NOW = 1 << 8
FATTR_LOCKOWNER = 1 << 9
FATTR_CTIME = 1 << 10
FATTR_KILL_SUIDGID = 1 << 11

GETATTR_FH = 1 << 0
FSYNC_FDATASYNC = 1 << 0
RELEASE_FLUSH = 1 << 0
EXPIRE_ONLY = 1 << 0  # notify_inval_entry flags

# ioctls on the /dev/fuse fd: _IOW(229, 1, struct fuse_backing_map), _IOW(229, 2, uint32_t)
DEV_IOC_BACKING_OPEN = 0x4010E501
DEV_IOC_BACKING_CLOSE = 0x4004E502
BACKING_MAP = struct.Struct("<iIQ")  # fd, flags, padding

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid total_extlen padding
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
ATTR = struct.Struct("<QQQqqqIIIIIIIIII")  # 88 bytes
ENTRY_OUT_HEAD = struct.Struct("<QQQQII")  # nodeid generation entry_valid attr_valid + nsecs
ATTR_OUT_HEAD = struct.Struct("<QII")  # attr_valid attr_valid_nsec dummy
OPEN_OUT = struct.Struct("<QIi")  # fh open_flags backing_id
WRITE_OUT = struct.Struct("<II")
STATFS_OUT = struct.Struct("<QQQQQIIII24x")  # fuse_kstatfs, 80 bytes
GETXATTR_OUT = struct.Struct("<II")
LSEEK_OUT = struct.Struct("<Q")
INIT_IN = struct.Struct("<IIIII")  # major minor max_readahead flags flags2 (+ unused)
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # 64 bytes
DIRENT_HEAD = struct.Struct("<QQII")  # ino off namelen type
INVAL_INODE_OUT = struct.Struct("<Qqq")
INVAL_ENTRY_OUT = struct.Struct("<QII")

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_GETATTR_IN = struct.Struct("<IIQ")
_SETATTR_IN = struct.Struct("<IIQQQqqqIIIIIIII")  # 88 bytes
_MKNOD_IN = struct.Struct("<IIII")
_MKDIR_IN = struct.Struct("<II")
_RENAME2_IN = struct.Struct("<QII")
_OPEN_IN = struct.Struct("<II")
_CREATE_IN = struct.Struct("<IIII")
_RW_IN = struct.Struct("<QQIIQII")  # fh offset size rw_flags lock_owner flags padding: 40 bytes
_RELEASE_IN = struct.Struct("<QIIQ")
_FLUSH_IN = struct.Struct("<QIIQ")
_FSYNC_IN = struct.Struct("<QII")
_SETXATTR_IN = struct.Struct("<II")
_SETXATTR_EXT_IN = struct.Struct("<IIII")
_GETXATTR_IN = struct.Struct("<II")
_ACCESS_IN = struct.Struct("<II")
_FALLOCATE_IN = struct.Struct("<QQQII")
_LSEEK_IN = struct.Struct("<QQII")
_FORGET_ONE = struct.Struct("<QQ")
_BATCH_FORGET_IN = struct.Struct("<II")

NS = 1_000_000_000


class ProtocolError(Exception):
    """A request we cannot make sense of (short or malformed): answered with EIO."""


# ------------------------------------------------------------------------- requests
@dataclass(slots=True)
class InHeader:
    len: int
    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int
    total_extlen: int = 0


@dataclass(slots=True)
class Init:
    major: int
    minor: int
    max_readahead: int
    flags: int  # 64 bits: flags | flags2 << 32


@dataclass(slots=True)
class Name:  # LOOKUP UNLINK RMDIR REMOVEXATTR
    name: bytes


@dataclass(slots=True)
class Forget:
    nlookup: int


@dataclass(slots=True)
class BatchForget:
    items: list[tuple[int, int]]


@dataclass(slots=True)
class Getattr:
    flags: int
    fh: int | None


@dataclass(slots=True)
class Setattr:
    valid: int
    fh: int
    size: int
    lock_owner: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    mode: int
    uid: int
    gid: int


@dataclass(slots=True)
class Symlink:
    name: bytes
    target: bytes


@dataclass(slots=True)
class Mknod:
    mode: int
    rdev: int
    umask: int
    name: bytes


@dataclass(slots=True)
class Mkdir:
    mode: int
    umask: int
    name: bytes


@dataclass(slots=True)
class Rename:
    newdir: int
    flags: int
    old: bytes
    new: bytes


@dataclass(slots=True)
class Link:
    oldnodeid: int
    name: bytes


@dataclass(slots=True)
class Open:  # OPEN OPENDIR
    flags: int
    open_flags: int


@dataclass(slots=True)
class Create:
    flags: int
    mode: int
    umask: int
    open_flags: int
    name: bytes


@dataclass(slots=True)
class Read:  # READ READDIR READDIRPLUS
    fh: int
    offset: int
    size: int
    read_flags: int
    lock_owner: int
    flags: int


@dataclass(slots=True)
class Write:
    fh: int
    offset: int
    size: int
    write_flags: int
    lock_owner: int
    flags: int
    data: memoryview = field(repr=False)


@dataclass(slots=True)
class Release:  # RELEASE RELEASEDIR
    fh: int
    flags: int
    release_flags: int
    lock_owner: int


@dataclass(slots=True)
class Flush:
    fh: int
    lock_owner: int


@dataclass(slots=True)
class Fsync:  # FSYNC FSYNCDIR
    fh: int
    fsync_flags: int


@dataclass(slots=True)
class Setxattr:
    flags: int
    name: bytes
    value: bytes


@dataclass(slots=True)
class Getxattr:
    size: int
    name: bytes


@dataclass(slots=True)
class Listxattr:
    size: int


@dataclass(slots=True)
class Access:
    mask: int


@dataclass(slots=True)
class Interrupt:
    unique: int


@dataclass(slots=True)
class Fallocate:
    fh: int
    offset: int
    length: int
    mode: int


@dataclass(slots=True)
class Lseek:
    fh: int
    offset: int
    whence: int


@dataclass(slots=True)
class Empty:  # GETATTR before 7.9, READLINK STATFS DESTROY, and anything unknown
    pass


@dataclass(slots=True)
class Request:
    header: InHeader
    args: Any

    @property
    def opcode(self) -> int:
        return self.header.opcode

    @property
    def unique(self) -> int:
        return self.header.unique

    @property
    def nodeid(self) -> int:
        return self.header.nodeid


def _need(body: memoryview, n: int, what: str) -> None:
    if len(body) < n:
        raise ProtocolError(f"{what}: {len(body)} bytes, need {n}")


def _cstr(body: memoryview, start: int = 0) -> tuple[bytes, int]:
    """A NUL-terminated string at `start`; returns it and the offset after the NUL."""
    raw = body[start:].tobytes()
    end = raw.find(b"\0")
    if end < 0:
        raise ProtocolError("name is not NUL-terminated")
    return raw[:end], start + end + 1


def _ns(sec: int, nsec: int) -> int:
    return sec * NS + nsec


def _p_init(b: memoryview) -> Init:
    _need(b, 16, "init")
    if len(b) >= INIT_IN.size:
        major, minor, ra, flags, flags2 = INIT_IN.unpack_from(b)
    else:
        major, minor, ra, flags = struct.unpack_from("<IIII", b)
        flags2 = 0
    if flags & INIT_EXT:
        flags |= flags2 << 32
    return Init(major, minor, ra, flags)


def _p_name(b: memoryview) -> Name:
    return Name(_cstr(b)[0])


def _p_forget(b: memoryview) -> Forget:
    _need(b, 8, "forget")
    return Forget(_U64.unpack_from(b)[0])


def _p_batch_forget(b: memoryview) -> BatchForget:
    _need(b, 8, "batch_forget")
    count = _BATCH_FORGET_IN.unpack_from(b)[0]
    _need(b, 8 + 16 * count, "batch_forget")
    return BatchForget([_FORGET_ONE.unpack_from(b, 8 + 16 * i) for i in range(count)])


def _p_getattr(b: memoryview) -> Getattr:
    if len(b) < _GETATTR_IN.size:
        return Getattr(0, None)
    flags, _, fh = _GETATTR_IN.unpack_from(b)
    return Getattr(flags, fh if flags & GETATTR_FH else None)


def _p_setattr(b: memoryview) -> Setattr:
    _need(b, _SETATTR_IN.size, "setattr")
    (valid, _, fh, size, lock_owner, atime, mtime, ctime, atimensec, mtimensec, ctimensec,
     mode, _, uid, gid, _) = _SETATTR_IN.unpack_from(b)
    return Setattr(valid, fh, size, lock_owner, _ns(atime, atimensec), _ns(mtime, mtimensec),
                   _ns(ctime, ctimensec), mode, uid, gid)


def _p_symlink(b: memoryview) -> Symlink:
    name, off = _cstr(b)
    return Symlink(name, _cstr(b, off)[0])


def _p_mknod(b: memoryview) -> Mknod:
    _need(b, _MKNOD_IN.size, "mknod")
    mode, rdev, umask, _ = _MKNOD_IN.unpack_from(b)
    return Mknod(mode, rdev, umask, _cstr(b, _MKNOD_IN.size)[0])


def _p_mkdir(b: memoryview) -> Mkdir:
    _need(b, _MKDIR_IN.size, "mkdir")
    mode, umask = _MKDIR_IN.unpack_from(b)
    return Mkdir(mode, umask, _cstr(b, _MKDIR_IN.size)[0])


def _names(b: memoryview, start: int) -> tuple[bytes, bytes]:
    old, off = _cstr(b, start)
    return old, _cstr(b, off)[0]


def _p_rename(b: memoryview) -> Rename:
    _need(b, 8, "rename")
    return Rename(_U64.unpack_from(b)[0], 0, *_names(b, 8))


def _p_rename2(b: memoryview) -> Rename:
    _need(b, _RENAME2_IN.size, "rename2")
    newdir, flags, _ = _RENAME2_IN.unpack_from(b)
    return Rename(newdir, flags, *_names(b, _RENAME2_IN.size))


def _p_link(b: memoryview) -> Link:
    _need(b, 8, "link")
    return Link(_U64.unpack_from(b)[0], _cstr(b, 8)[0])


def _p_open(b: memoryview) -> Open:
    _need(b, _OPEN_IN.size, "open")
    return Open(*_OPEN_IN.unpack_from(b))


def _p_create(b: memoryview) -> Create:
    _need(b, _CREATE_IN.size, "create")
    flags, mode, umask, open_flags = _CREATE_IN.unpack_from(b)
    return Create(flags, mode, umask, open_flags, _cstr(b, _CREATE_IN.size)[0])


def _p_read(b: memoryview) -> Read:
    _need(b, 24, "read")
    if len(b) >= _RW_IN.size:
        fh, off, size, rflags, owner, flags, _ = _RW_IN.unpack_from(b)
    else:
        fh, off, size, rflags = struct.unpack_from("<QQII", b)
        owner = flags = 0
    return Read(fh, off, size, rflags, owner, flags)


def _p_write(b: memoryview) -> Write:
    _need(b, _RW_IN.size, "write")
    fh, off, size, wflags, owner, flags, _ = _RW_IN.unpack_from(b)
    _need(b, _RW_IN.size + size, "write payload")
    return Write(fh, off, size, wflags, owner, flags, b[_RW_IN.size:_RW_IN.size + size])


def _p_release(b: memoryview) -> Release:
    _need(b, _RELEASE_IN.size, "release")
    return Release(*_RELEASE_IN.unpack_from(b))


def _p_flush(b: memoryview) -> Flush:
    _need(b, _FLUSH_IN.size, "flush")
    fh, _, _, owner = _FLUSH_IN.unpack_from(b)
    return Flush(fh, owner)


def _p_fsync(b: memoryview) -> Fsync:
    _need(b, _FSYNC_IN.size, "fsync")
    fh, flags, _ = _FSYNC_IN.unpack_from(b)
    return Fsync(fh, flags)


def parse_setxattr(b: memoryview, ext: bool = False) -> Setxattr:
    """SETXATTR; `ext` when FUSE_SETXATTR_EXT was negotiated (a 16-byte fixed part)."""
    st = _SETXATTR_EXT_IN if ext else _SETXATTR_IN
    _need(b, st.size, "setxattr")
    size, flags = st.unpack_from(b)[:2]
    name, off = _cstr(b, st.size)
    _need(b, off + size, "setxattr value")
    return Setxattr(flags, name, b[off:off + size].tobytes())


def _p_getxattr(b: memoryview) -> Getxattr:
    _need(b, _GETXATTR_IN.size, "getxattr")
    return Getxattr(_GETXATTR_IN.unpack_from(b)[0], _cstr(b, _GETXATTR_IN.size)[0])


def _p_listxattr(b: memoryview) -> Listxattr:
    _need(b, _GETXATTR_IN.size, "listxattr")
    return Listxattr(_GETXATTR_IN.unpack_from(b)[0])


def _p_access(b: memoryview) -> Access:
    _need(b, _ACCESS_IN.size, "access")
    return Access(_ACCESS_IN.unpack_from(b)[0])


def _p_interrupt(b: memoryview) -> Interrupt:
    _need(b, 8, "interrupt")
    return Interrupt(_U64.unpack_from(b)[0])


def _p_fallocate(b: memoryview) -> Fallocate:
    _need(b, _FALLOCATE_IN.size, "fallocate")
    fh, off, length, mode, _ = _FALLOCATE_IN.unpack_from(b)
    return Fallocate(fh, off, length, mode)


def _p_lseek(b: memoryview) -> Lseek:
    _need(b, _LSEEK_IN.size, "lseek")
    fh, off, whence, _ = _LSEEK_IN.unpack_from(b)
    return Lseek(fh, off, whence)


_PARSERS: dict[int, Callable[[memoryview], Any]] = {
    Op.INIT: _p_init,
    Op.LOOKUP: _p_name,
    Op.UNLINK: _p_name,
    Op.RMDIR: _p_name,
    Op.REMOVEXATTR: _p_name,
    Op.FORGET: _p_forget,
    Op.BATCH_FORGET: _p_batch_forget,
    Op.GETATTR: _p_getattr,
    Op.SETATTR: _p_setattr,
    Op.SYMLINK: _p_symlink,
    Op.MKNOD: _p_mknod,
    Op.MKDIR: _p_mkdir,
    Op.RENAME: _p_rename,
    Op.RENAME2: _p_rename2,
    Op.LINK: _p_link,
    Op.OPEN: _p_open,
    Op.OPENDIR: _p_open,
    Op.CREATE: _p_create,
    Op.READ: _p_read,
    Op.READDIR: _p_read,
    Op.READDIRPLUS: _p_read,
    Op.WRITE: _p_write,
    Op.RELEASE: _p_release,
    Op.RELEASEDIR: _p_release,
    Op.FLUSH: _p_flush,
    Op.FSYNC: _p_fsync,
    Op.FSYNCDIR: _p_fsync,
    Op.SETXATTR: parse_setxattr,
    Op.GETXATTR: _p_getxattr,
    Op.LISTXATTR: _p_listxattr,
    Op.ACCESS: _p_access,
    Op.INTERRUPT: _p_interrupt,
    Op.FALLOCATE: _p_fallocate,
    Op.LSEEK: _p_lseek,
}


def parse_header(buf: memoryview) -> InHeader:
    if len(buf) < IN_HEADER.size:
        raise ProtocolError(f"request of {len(buf)} bytes is shorter than its header")
    return InHeader(*IN_HEADER.unpack_from(buf)[:8])


def parse_request(buf: memoryview, *, setxattr_ext: bool = False) -> Request:
    """One request as read from /dev/fuse. Names and values are copied out of `buf`;
    a WRITE's `data` is a view into it. Raises ProtocolError (header intact) on a bad body."""
    h = parse_header(buf)
    if h.len > len(buf):
        raise ProtocolError(f"request says {h.len} bytes, read {len(buf)}")
    # request extensions (security context, supplementary groups) sit at the end;
    # we negotiate none, but never read them as part of the body
    end = h.len - 8 * h.total_extlen
    body = buf[IN_HEADER.size:end]
    if h.opcode == Op.SETXATTR:
        return Request(h, parse_setxattr(body, setxattr_ext))
    parser = _PARSERS.get(h.opcode)
    return Request(h, parser(body) if parser else Empty())


# -------------------------------------------------------------------------- replies
def out_header(unique: int, body_len: int, error: int = 0) -> bytes:
    """`error` is the raw field: 0, -errno for a failed request, the code of a notification."""
    return OUT_HEADER.pack(OUT_HEADER.size + body_len, error, unique)


def reply(unique: int, *parts: bytes | bytearray | memoryview) -> list[bytes | bytearray | memoryview]:
    """A success reply as a list of buffers for writev."""
    return [out_header(unique, sum(len(p) for p in parts)), *parts]


def reply_error(unique: int, errno_: int) -> list[bytes]:
    return [out_header(unique, 0, -abs(errno_))]


def _split_ns(t: int) -> tuple[int, int]:
    return t // NS, t % NS


def _split_timeout(seconds: float) -> tuple[int, int]:
    if seconds <= 0:
        return 0, 0
    whole = int(seconds)
    return whole, min(NS - 1, int(round((seconds - whole) * NS)))


def encode_attr(a: Attr) -> bytes:
    asec, ansec = _split_ns(a.atime_ns)
    msec, mnsec = _split_ns(a.mtime_ns)
    csec, cnsec = _split_ns(a.ctime_ns)
    return ATTR.pack(a.ino, a.size, a.blocks, asec, msec, csec, ansec, mnsec, cnsec,
                     a.mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize, 0)


def encode_entry(a: Attr) -> bytes:
    """fuse_entry_out (128 bytes): the reply of LOOKUP MKDIR MKNOD SYMLINK LINK, part of CREATE."""
    esec, ensec = _split_timeout(a.entry_timeout)
    asec, ansec = _split_timeout(a.attr_timeout)
    return ENTRY_OUT_HEAD.pack(a.ino, a.generation, esec, asec, ensec, ansec) + encode_attr(a)


def encode_attr_out(a: Attr) -> bytes:
    """fuse_attr_out (104 bytes): the reply of GETATTR and SETATTR."""
    sec, nsec = _split_timeout(a.attr_timeout)
    return ATTR_OUT_HEAD.pack(sec, nsec, 0) + encode_attr(a)


def encode_open(fh: int, open_flags: int, backing_id: int = 0) -> bytes:
    return OPEN_OUT.pack(fh, open_flags, backing_id)


def encode_write(size: int) -> bytes:
    return WRITE_OUT.pack(size, 0)


def encode_statfs(s: StatFs) -> bytes:
    return STATFS_OUT.pack(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namemax, s.frsize, 0)


def encode_xattr_size(size: int) -> bytes:
    return GETXATTR_OUT.pack(size, 0)


def encode_lseek(offset: int) -> bytes:
    return LSEEK_OUT.pack(offset)


def _align8(n: int) -> int:
    return (n + 7) & ~7


def dirent_type(mode: int) -> int:
    """DT_* of a mode: the file type bits shifted down (DT_REG = 8, DT_DIR = 4, ...)."""
    return stat.S_IFMT(mode) >> 12


def encode_dirent(ino: int, next_off: int, name: bytes, mode: int) -> bytes:
    raw = DIRENT_HEAD.pack(ino, next_off, len(name), dirent_type(mode)) + name
    return raw + b"\0" * (_align8(len(raw)) - len(raw))


def encode_direntplus(a: Attr, next_off: int, name: bytes) -> bytes:
    return encode_entry(a) + encode_dirent(a.ino, next_off, name, a.mode)


def pack_dirents(entries: list[tuple[bytes, Attr, int]], size: int, plus: bool) -> tuple[bytes, int]:
    """As many entries as fit in `size` bytes; returns the payload and how many were used."""
    out = bytearray()
    n = 0
    for name, attr, next_off in entries:
        rec = encode_direntplus(attr, next_off, name) if plus else encode_dirent(attr.ino, next_off, name, attr.mode)
        if len(out) + len(rec) > size:
            break
        out += rec
        n += 1
    return bytes(out), n


def encode_xattr_list(names: list[bytes]) -> bytes:
    return b"".join(n + b"\0" for n in names)


# ----------------------------------------------------------------------------- INIT
@dataclass(slots=True)
class InitOut:
    major: int = KERNEL_VERSION
    minor: int = KERNEL_MINOR_VERSION
    max_readahead: int = 0
    flags: int = 0  # 64 bits; the high half goes to flags2
    max_background: int = 64
    congestion_threshold: int = 48
    max_write: int = 1 << 20
    time_gran: int = 1
    max_pages: int = 256
    map_alignment: int = 0
    max_stack_depth: int = 0


def encode_init(o: InitOut) -> bytes:
    """fuse_init_out, 64 bytes: max_pages at 28, flags2 at 32, max_stack_depth at 36."""
    return INIT_OUT.pack(o.major, o.minor, o.max_readahead, o.flags & 0xFFFFFFFF,
                         o.max_background, o.congestion_threshold, o.max_write, o.time_gran,
                         o.max_pages, o.map_alignment, o.flags >> 32, o.max_stack_depth)


# What we ask for when the kernel offers it; never WRITEBACK_CACHE (it rules passthrough out).
# HANDLE_KILLPRIV_V2 makes the kernel set SB_NOSEC: without it every write(2) first asks the
# daemon for the file's security.capability xattr (one GETXATTR round trip per write, even
# under passthrough). Clearing suid/sgid/caps on write is then ours, and moot: the mount is
# nosuid and security.* xattrs cannot be set.
WANTED = (ASYNC_READ | ATOMIC_O_TRUNC | EXPORT_SUPPORT | BIG_WRITES | AUTO_INVAL_DATA
          | DO_READDIRPLUS | READDIRPLUS_AUTO | ASYNC_DIO | PARALLEL_DIROPS | MAX_PAGES
          | HANDLE_KILLPRIV_V2 | INIT_EXT)


class InitError(Exception):
    """The kernel speaks a protocol we cannot (major version other than 7, or too old)."""


def negotiate(init: Init, *, passthrough: bool, max_pages: int, max_stack_depth: int = 1,
              max_background: int = 64, want: int = WANTED) -> InitOut:
    """Our INIT reply to the kernel's offer. Pure: the caller supplies the page limit
    (/proc/sys/fs/fuse/max_pages_limit) and whether passthrough is wanted at all."""
    if init.major != KERNEL_VERSION:
        raise InitError(f"kernel speaks FUSE {init.major}.{init.minor}, we speak {KERNEL_VERSION}.x")
    if init.minor < 12:
        raise InitError(f"kernel FUSE protocol 7.{init.minor} is too old")
    if passthrough:
        if not 1 <= max_stack_depth <= 2:
            raise ValueError("max_stack_depth must be 1 or 2 for passthrough")
        want |= PASSTHROUGH
    want &= ~WRITEBACK_CACHE
    flags = want & init.flags
    if not init.flags & INIT_EXT:
        flags &= 0xFFFFFFFF
    pages = max(1, min(max_pages, 0xFFFF)) if flags & MAX_PAGES else 32
    return InitOut(
        minor=min(KERNEL_MINOR_VERSION, init.minor),
        max_readahead=init.max_readahead,
        flags=flags,
        max_background=max_background,
        congestion_threshold=max(1, max_background * 3 // 4),
        max_write=pages * 4096,
        max_pages=pages,
        max_stack_depth=max_stack_depth if flags & PASSTHROUGH else 0,
    )


# --------------------------------------------------------------------- notifications
def notify_inval_inode(ino: int, offset: int = 0, length: int = 0) -> list[bytes]:
    """Drop cached attributes of `ino` and its pages in [offset, offset+length) (0 = to the end;
    offset < 0 drops only the attributes)."""
    body = INVAL_INODE_OUT.pack(ino, offset, length)
    return [out_header(0, len(body), Notify.INVAL_INODE), body]


def notify_inval_entry(parent: int, name: bytes, flags: int = 0) -> list[bytes]:
    """Drop the kernel's cached name `name` in directory `parent`."""
    body = INVAL_ENTRY_OUT.pack(parent, len(name), flags) + name + b"\0"
    return [out_header(0, len(body), Notify.INVAL_ENTRY), body]
