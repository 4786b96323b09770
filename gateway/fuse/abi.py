"""The kernel's FUSE ABI (Linux include/uapi/linux/fuse.h, 7.40): numbers, layouts, INIT.

Why a module of its own: what depends on the protocol minor the kernel speaks is here, in one
place: the opcodes and flag bits, every struct's layout (and the shorter layouts of older
minors), and the INIT negotiation that settles the minor, the flags, `max_pages` and
passthrough. `messages.py` parses requests and encodes replies with these layouts; `kernel.py`
speaks them on /dev/fuse. Everything here is a constant or a pure function, testable without
a mount.

Layouts are little-endian and 64-bit aligned, as the kernel's structs: every request starts
with fuse_in_header (40 bytes), every reply with fuse_out_header (16 bytes: len, -errno,
unique); a notification is a reply with unique 0 and the notify code in the error field.

What the protocol minors change, of what ckptfs reads or writes (the kernel transport is
tested from 7.31 on; `tests/unit/test_fuse_protocol.py` checks the INIT reply of 7.31, 7.33,
7.36, 7.38, 7.40 and 7.45 byte by byte, `make test-vm` runs Linux 6.1, protocol 7.38):
- before 7.12: refused at INIT (`OLDEST_MINOR`). Before 7.23 fuse_init_out is 24 bytes (up
  to max_write), from 7.23 64 (time_gran, then max_pages at 7.28): `init_out_size`.
- every init flag exists from a minor on (`FLAG_SINCE`); `negotiate` grants none the
  kernel's minor does not have, even if its offer had the bit set.
- 7.28: MAX_PAGES (before it a request carries at most 32 pages: max_write 128 KiB).
- 7.31 (Linux 5.4): map_alignment in fuse_init_out (0: no DAX).
- 7.33 (5.11): HANDLE_KILLPRIV_V2 and FATTR_KILL_SUIDGID; SETXATTR_EXT, with which
  fuse_setxattr_in grows from 8 to 16 bytes (`SETXATTR_EXT_IN`; ckptfs never asks for it,
  so SETXATTR keeps the 8-byte layout on every minor).
- 7.36 (5.17): INIT_EXT: fuse_init_in grows from 16 to 64 bytes (flags2: the init flags from
  bit 32 on) and fuse_init_out carries flags2, read by the kernel only if INIT_EXT is granted.
- 7.38 (6.2; Debian 12's 6.1 has it too): total_extlen in fuse_in_header (request extensions
  at a request's end; padding before, read as 0).
- 7.40 (6.9): PASSTHROUGH: backing_id in fuse_open_out (padding before), max_stack_depth in
  fuse_init_out, the backing-file ioctls (`DEV_IOC_BACKING_*`).
- after 7.40 (7.41-7.45: idmapped mounts, io_uring, request timeouts, ...): nothing we ask
  for; the reply says 7.40 and the kernel speaks 7.40 to us.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

KERNEL_VERSION = 7
KERNEL_MINOR_VERSION = 40  # the newest we speak: passthrough, init flags2, max_stack_depth
OLDEST_MINOR = 12  # INIT refuses kernels older than this
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

# The protocol minor each init flag appeared in (include/uapi/linux/fuse.h's changelog).
FLAG_SINCE = {
    ATOMIC_O_TRUNC: 9, EXPORT_SUPPORT: 10, BIG_WRITES: 10, DONT_MASK: 12, FLOCK_LOCKS: 17,
    AUTO_INVAL_DATA: 20, DO_READDIRPLUS: 21, READDIRPLUS_AUTO: 21, ASYNC_DIO: 22,
    WRITEBACK_CACHE: 23, PARALLEL_DIROPS: 25, HANDLE_KILLPRIV: 26, POSIX_ACL: 26,
    MAX_PAGES: 28, CACHE_SYMLINKS: 28, EXPLICIT_INVAL_DATA: 30, HANDLE_KILLPRIV_V2: 33,
    SETXATTR_EXT: 33, INIT_EXT: 36, SECURITY_CTX: 36, CREATE_SUPP_GROUP: 38, HAS_EXPIRE_ONLY: 38,
    DIRECT_IO_ALLOW_MMAP: 39, PASSTHROUGH: 40, NO_EXPORT_SUPPORT: 40, HAS_RESEND: 40,
}


def flags_of_minor(minor: int) -> int:
    """Every init flag a kernel speaking 7.`minor` can have (those of `FLAG_SINCE` up to it,
    and the older ones it does not list)."""
    newer = 0
    for flag, since in FLAG_SINCE.items():
        if since > minor:
            newer |= flag
    return ~newer & 0xFFFFFFFFFFFFFFFF


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
# _IOR(229, 0, uint32_t), Linux >= 4.2: a new /dev/fuse fd becomes another channel of the
# connection of the fd whose number it is given; a request read from it is answered on it
DEV_IOC_CLONE = 0x8004E500

# -------------------------------------------------------------------- layouts
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid total_extlen padding
OUT_HEADER = struct.Struct("<IiQ")  # len error unique

# request bodies
INIT_IN = struct.Struct("<IIIII")  # major minor max_readahead flags flags2 (+ unused)
INIT_IN_BEFORE_7_36 = struct.Struct("<IIII")  # major minor max_readahead flags
GETATTR_IN = struct.Struct("<IIQ")
SETATTR_IN = struct.Struct("<IIQQQqqqIIIIIIII")  # 88 bytes
MKNOD_IN = struct.Struct("<IIII")
MKDIR_IN = struct.Struct("<II")
RENAME2_IN = struct.Struct("<QII")
OPEN_IN = struct.Struct("<II")
CREATE_IN = struct.Struct("<IIII")
RW_IN = struct.Struct("<QQIIQII")  # fh offset size rw_flags lock_owner flags padding: 40 bytes
READ_IN_BEFORE_7_9 = struct.Struct("<QQII")  # fh offset size read_flags: 24 bytes
RELEASE_IN = struct.Struct("<QIIQ")
FLUSH_IN = struct.Struct("<QIIQ")
FSYNC_IN = struct.Struct("<QII")
SETXATTR_IN = struct.Struct("<II")
SETXATTR_EXT_IN = struct.Struct("<IIII")
GETXATTR_IN = struct.Struct("<II")
ACCESS_IN = struct.Struct("<II")
FALLOCATE_IN = struct.Struct("<QQQII")
LSEEK_IN = struct.Struct("<QQII")
FORGET_ONE = struct.Struct("<QQ")
BATCH_FORGET_IN = struct.Struct("<II")

# reply bodies
ATTR = struct.Struct("<QQQqqqIIIIIIIIII")  # 88 bytes
ENTRY_OUT_HEAD = struct.Struct("<QQQQII")  # nodeid generation entry_valid attr_valid + nsecs
ATTR_OUT_HEAD = struct.Struct("<QII")  # attr_valid attr_valid_nsec dummy
OPEN_OUT = struct.Struct("<QIi")  # fh open_flags backing_id
WRITE_OUT = struct.Struct("<II")
STATFS_OUT = struct.Struct("<QQQQQIIII24x")  # fuse_kstatfs, 80 bytes
GETXATTR_OUT = struct.Struct("<II")
LSEEK_OUT = struct.Struct("<Q")
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # 64 bytes
INIT_OUT_BEFORE_7_23 = 24  # FUSE_COMPAT_22_INIT_OUT_SIZE: up to max_write
DIRENT_HEAD = struct.Struct("<QQII")  # ino off namelen type

# notification bodies
INVAL_INODE_OUT = struct.Struct("<Qqq")
INVAL_ENTRY_OUT = struct.Struct("<QII")


# ----------------------------------------------------------------------- INIT
@dataclass(slots=True)
class Init:
    """The kernel's offer (fuse_init_in), parsed by `messages.parse_request`."""

    major: int
    minor: int
    max_readahead: int
    flags: int  # 64 bits: flags | flags2 << 32


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


def init_out_size(minor: int) -> int:
    """How long fuse_init_out is at 7.`minor`: the kernel refuses a longer reply (EINVAL)."""
    return INIT_OUT.size if minor >= 23 else INIT_OUT_BEFORE_7_23


def encode_init(o: InitOut) -> bytes:
    """fuse_init_out as the minor of the reply lays it out: max_pages at 28 (with MAX_PAGES),
    flags2 at 32 (with INIT_EXT), max_stack_depth at 36 (with PASSTHROUGH), 64 bytes from
    7.23 and 24 before. A field whose flag was not granted is 0, as libfuse sends it."""
    pages = o.max_pages if o.flags & MAX_PAGES else 0
    flags2 = o.flags >> 32 if o.flags & INIT_EXT else 0
    depth = o.max_stack_depth if o.flags & PASSTHROUGH else 0
    raw = INIT_OUT.pack(o.major, o.minor, o.max_readahead, o.flags & 0xFFFFFFFF,
                        o.max_background, o.congestion_threshold, o.max_write, o.time_gran,
                        pages, o.map_alignment, flags2, depth)
    return raw[:init_out_size(o.minor)]


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
    (/proc/sys/fs/fuse/max_pages_limit) and whether passthrough is wanted at all. Granted:
    what we want, the kernel offers and its minor has (`flags_of_minor`); the high half only
    with INIT_EXT. Passthrough therefore only from 7.40 and only where offered."""
    if init.major != KERNEL_VERSION:
        raise InitError(f"kernel speaks FUSE {init.major}.{init.minor}, we speak {KERNEL_VERSION}.x")
    if init.minor < OLDEST_MINOR:
        raise InitError(f"kernel FUSE protocol 7.{init.minor} is too old")
    if passthrough:
        if not 1 <= max_stack_depth <= 2:
            raise ValueError("max_stack_depth must be 1 or 2 for passthrough")
        want |= PASSTHROUGH
    want &= ~WRITEBACK_CACHE
    flags = want & init.flags & flags_of_minor(init.minor)
    if not flags & INIT_EXT:
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
