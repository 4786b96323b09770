"""FUSE messages: requests parsed from /dev/fuse, replies and notifications encoded for it.

Why a module of its own: turning bytes into requests and results into bytes is pure, so it is
tested without a mount (tests/unit/test_fuse_protocol.py); the kernel transport (`kernel.py`)
only moves the bytes. The numbers and layouts are the kernel's, in `abi.py`; results come in
the neutral types of `ops.py`.

- A WRITE's payload is a memoryview into the read buffer (no copy): the caller keeps the
  buffer until the write is handled. Names and values are copied out.
- A reply is a list of buffers for writev, the fuse_out_header first; a notification is a
  reply with unique 0 and the notify code in the error field.
"""

from __future__ import annotations

import stat
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

from .abi import (
    ACCESS_IN, ATTR, ATTR_OUT_HEAD, BATCH_FORGET_IN, CREATE_IN, DIRENT_HEAD, ENTRY_OUT_HEAD, FALLOCATE_IN,
    FLUSH_IN, FORGET_ONE, FSYNC_IN, GETATTR_FH, GETATTR_IN, GETXATTR_IN, GETXATTR_OUT, IN_HEADER, INIT_EXT,
    INIT_IN, INIT_IN_BEFORE_7_36, INVAL_ENTRY_OUT, INVAL_INODE_OUT, LSEEK_IN, LSEEK_OUT, MKDIR_IN, MKNOD_IN,
    OPEN_IN, OPEN_OUT, OUT_HEADER, READ_IN_BEFORE_7_9, RELEASE_IN, RENAME2_IN, RW_IN, SETATTR_IN,
    SETXATTR_EXT_IN, SETXATTR_IN, STATFS_OUT, WRITE_OUT, Init, Notify, Op,
)
from .ops import Attr, StatFs

_U64 = struct.Struct("<Q")

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
    _need(b, INIT_IN_BEFORE_7_36.size, "init")
    if len(b) >= INIT_IN.size:
        major, minor, ra, flags, flags2 = INIT_IN.unpack_from(b)
    else:
        major, minor, ra, flags = INIT_IN_BEFORE_7_36.unpack_from(b)
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
    count = BATCH_FORGET_IN.unpack_from(b)[0]
    _need(b, 8 + 16 * count, "batch_forget")
    return BatchForget([FORGET_ONE.unpack_from(b, 8 + 16 * i) for i in range(count)])


def _p_getattr(b: memoryview) -> Getattr:
    if len(b) < GETATTR_IN.size:
        return Getattr(0, None)
    flags, _, fh = GETATTR_IN.unpack_from(b)
    return Getattr(flags, fh if flags & GETATTR_FH else None)


def _p_setattr(b: memoryview) -> Setattr:
    _need(b, SETATTR_IN.size, "setattr")
    (valid, _, fh, size, lock_owner, atime, mtime, ctime, atimensec, mtimensec, ctimensec,
     mode, _, uid, gid, _) = SETATTR_IN.unpack_from(b)
    return Setattr(valid, fh, size, lock_owner, _ns(atime, atimensec), _ns(mtime, mtimensec),
                   _ns(ctime, ctimensec), mode, uid, gid)


def _p_symlink(b: memoryview) -> Symlink:
    name, off = _cstr(b)
    return Symlink(name, _cstr(b, off)[0])


def _p_mknod(b: memoryview) -> Mknod:
    _need(b, MKNOD_IN.size, "mknod")
    mode, rdev, umask, _ = MKNOD_IN.unpack_from(b)
    return Mknod(mode, rdev, umask, _cstr(b, MKNOD_IN.size)[0])


def _p_mkdir(b: memoryview) -> Mkdir:
    _need(b, MKDIR_IN.size, "mkdir")
    mode, umask = MKDIR_IN.unpack_from(b)
    return Mkdir(mode, umask, _cstr(b, MKDIR_IN.size)[0])


def _names(b: memoryview, start: int) -> tuple[bytes, bytes]:
    old, off = _cstr(b, start)
    return old, _cstr(b, off)[0]


def _p_rename(b: memoryview) -> Rename:
    _need(b, 8, "rename")
    return Rename(_U64.unpack_from(b)[0], 0, *_names(b, 8))


def _p_rename2(b: memoryview) -> Rename:
    _need(b, RENAME2_IN.size, "rename2")
    newdir, flags, _ = RENAME2_IN.unpack_from(b)
    return Rename(newdir, flags, *_names(b, RENAME2_IN.size))


def _p_link(b: memoryview) -> Link:
    _need(b, 8, "link")
    return Link(_U64.unpack_from(b)[0], _cstr(b, 8)[0])


def _p_open(b: memoryview) -> Open:
    _need(b, OPEN_IN.size, "open")
    return Open(*OPEN_IN.unpack_from(b))


def _p_create(b: memoryview) -> Create:
    _need(b, CREATE_IN.size, "create")
    flags, mode, umask, open_flags = CREATE_IN.unpack_from(b)
    return Create(flags, mode, umask, open_flags, _cstr(b, CREATE_IN.size)[0])


def _p_read(b: memoryview) -> Read:
    _need(b, READ_IN_BEFORE_7_9.size, "read")
    if len(b) >= RW_IN.size:
        fh, off, size, rflags, owner, flags, _ = RW_IN.unpack_from(b)
    else:
        fh, off, size, rflags = READ_IN_BEFORE_7_9.unpack_from(b)
        owner = flags = 0
    return Read(fh, off, size, rflags, owner, flags)


def _p_write(b: memoryview) -> Write:
    _need(b, RW_IN.size, "write")
    fh, off, size, wflags, owner, flags, _ = RW_IN.unpack_from(b)
    _need(b, RW_IN.size + size, "write payload")
    return Write(fh, off, size, wflags, owner, flags, b[RW_IN.size:RW_IN.size + size])


def _p_release(b: memoryview) -> Release:
    _need(b, RELEASE_IN.size, "release")
    return Release(*RELEASE_IN.unpack_from(b))


def _p_flush(b: memoryview) -> Flush:
    _need(b, FLUSH_IN.size, "flush")
    fh, _, _, owner = FLUSH_IN.unpack_from(b)
    return Flush(fh, owner)


def _p_fsync(b: memoryview) -> Fsync:
    _need(b, FSYNC_IN.size, "fsync")
    fh, flags, _ = FSYNC_IN.unpack_from(b)
    return Fsync(fh, flags)


def parse_setxattr(b: memoryview, ext: bool = False) -> Setxattr:
    """SETXATTR; `ext` when FUSE_SETXATTR_EXT was negotiated (a 16-byte fixed part)."""
    st = SETXATTR_EXT_IN if ext else SETXATTR_IN
    _need(b, st.size, "setxattr")
    size, flags = st.unpack_from(b)[:2]
    name, off = _cstr(b, st.size)
    _need(b, off + size, "setxattr value")
    return Setxattr(flags, name, b[off:off + size].tobytes())


def _p_getxattr(b: memoryview) -> Getxattr:
    _need(b, GETXATTR_IN.size, "getxattr")
    return Getxattr(GETXATTR_IN.unpack_from(b)[0], _cstr(b, GETXATTR_IN.size)[0])


def _p_listxattr(b: memoryview) -> Listxattr:
    _need(b, GETXATTR_IN.size, "listxattr")
    return Listxattr(GETXATTR_IN.unpack_from(b)[0])


def _p_access(b: memoryview) -> Access:
    _need(b, ACCESS_IN.size, "access")
    return Access(ACCESS_IN.unpack_from(b)[0])


def _p_interrupt(b: memoryview) -> Interrupt:
    _need(b, 8, "interrupt")
    return Interrupt(_U64.unpack_from(b)[0])


def _p_fallocate(b: memoryview) -> Fallocate:
    _need(b, FALLOCATE_IN.size, "fallocate")
    fh, off, length, mode, _ = FALLOCATE_IN.unpack_from(b)
    return Fallocate(fh, off, length, mode)


def _p_lseek(b: memoryview) -> Lseek:
    _need(b, LSEEK_IN.size, "lseek")
    fh, off, whence, _ = LSEEK_IN.unpack_from(b)
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
