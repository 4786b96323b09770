"""The FUSE wire protocol (gateway/fuse/abi.py, gateway/fuse/messages.py) and the per-inode
I/O mode table (gateway/fuse/iomode.py): byte layouts against the kernel's structs, no mount."""

from __future__ import annotations

import errno
import stat
import struct

import pytest

from ckptfs.fuse import abi
from ckptfs.fuse import messages as P
from ckptfs.fuse.iomode import IoModes
from ckptfs.fuse.handlers import setattr_fields
from ckptfs.fuse.ops import Attr, StatFs


def request(opcode: int, body: bytes, *, unique: int = 7, nodeid: int = 1, uid: int = 1000, gid: int = 100, pid: int = 42, extlen: int = 0) -> memoryview:
    total = abi.IN_HEADER.size + len(body)
    return memoryview(bytearray(abi.IN_HEADER.pack(total, opcode, unique, nodeid, uid, gid, pid, extlen, 0) + body))


def test_struct_sizes_match_the_kernel() -> None:
    assert abi.IN_HEADER.size == 40
    assert abi.OUT_HEADER.size == 16
    assert abi.ATTR.size == 88
    assert abi.ENTRY_OUT_HEAD.size + abi.ATTR.size == 128
    assert abi.ATTR_OUT_HEAD.size + abi.ATTR.size == 104
    assert abi.OPEN_OUT.size == 16
    assert abi.INIT_OUT.size == 64
    assert abi.STATFS_OUT.size == 80
    assert abi.BACKING_MAP.size == 16
    assert abi.WRITE_OVERHEAD == 80


def test_ioctl_numbers() -> None:
    def iow(typ: int, nr: int, size: int) -> int:
        return (1 << 30) | (size << 16) | (typ << 8) | nr

    assert abi.DEV_IOC_BACKING_OPEN == iow(229, 1, 16) == 0x4010E501
    assert abi.DEV_IOC_BACKING_CLOSE == iow(229, 2, 4) == 0x4004E502


def test_header_fields() -> None:
    req = P.parse_request(request(abi.Op.GETATTR, struct.pack("<IIQ", 0, 0, 0), unique=99, nodeid=5))
    h = req.header
    assert (h.opcode, h.unique, h.nodeid, h.uid, h.gid, h.pid) == (abi.Op.GETATTR, 99, 5, 1000, 100, 42)
    assert req.args == P.Getattr(0, None)


def test_init_parse_and_negotiate_passthrough() -> None:
    kflags = abi.ASYNC_READ | abi.WRITEBACK_CACHE | abi.MAX_PAGES | abi.INIT_EXT | abi.BIG_WRITES | abi.PASSTHROUGH | abi.SECURITY_CTX
    body = struct.pack("<IIIII", 7, 45, 131072, kflags & 0xFFFFFFFF, kflags >> 32) + bytes(44)
    req = P.parse_request(request(abi.Op.INIT, body))
    init = req.args
    assert (init.major, init.minor, init.max_readahead) == (7, 45, 131072)
    assert init.flags == kflags
    out = abi.negotiate(init, passthrough=True, max_pages=256, max_stack_depth=1)
    assert out.flags & abi.PASSTHROUGH and out.flags & abi.INIT_EXT and out.flags & abi.MAX_PAGES
    assert not out.flags & abi.WRITEBACK_CACHE  # writeback cache rules passthrough out
    assert not out.flags & abi.SECURITY_CTX  # not asked for: no request extensions
    assert out.minor == abi.KERNEL_MINOR_VERSION
    raw = abi.encode_init(out)
    assert len(raw) == 64
    major, minor, ra, flags = struct.unpack_from("<IIII", raw)
    assert (major, minor, ra) == (7, 40, 131072)
    assert struct.unpack_from("<H", raw, 28)[0] == 256  # max_pages
    assert struct.unpack_from("<I", raw, 20)[0] == 256 * 4096  # max_write
    flags2 = struct.unpack_from("<I", raw, 32)[0]
    assert flags2 == 1 << 5  # FUSE_PASSTHROUGH is bit 37
    assert flags | flags2 << 32 == out.flags
    assert struct.unpack_from("<I", raw, 36)[0] == 1  # max_stack_depth


def test_negotiate_without_passthrough_or_ext() -> None:
    init = abi.Init(7, 31, 65536, abi.ASYNC_READ | abi.MAX_PAGES)  # an old kernel: no INIT_EXT
    out = abi.negotiate(init, passthrough=True, max_pages=1000)
    assert out.flags == abi.ASYNC_READ | abi.MAX_PAGES
    assert out.max_stack_depth == 0
    assert out.max_pages == 1000 and out.minor == 31
    raw = abi.encode_init(out)
    assert struct.unpack_from("<I", raw, 32)[0] == 0


# --- INIT on every protocol minor from 7.31 (Linux 5.4) on: the reply's bytes, as the kernel reads them
# what a kernel of each minor offers: every flag it has (Linux offers what it supports)
EVERY_FLAG = (abi.ASYNC_READ | abi.POSIX_LOCKS | abi.ATOMIC_O_TRUNC | abi.EXPORT_SUPPORT | abi.BIG_WRITES
              | abi.DONT_MASK | abi.FLOCK_LOCKS | abi.AUTO_INVAL_DATA | abi.DO_READDIRPLUS | abi.READDIRPLUS_AUTO
              | abi.ASYNC_DIO | abi.WRITEBACK_CACHE | abi.PARALLEL_DIROPS | abi.HANDLE_KILLPRIV | abi.POSIX_ACL
              | abi.MAX_PAGES | abi.CACHE_SYMLINKS | abi.EXPLICIT_INVAL_DATA | abi.HANDLE_KILLPRIV_V2
              | abi.SETXATTR_EXT | abi.INIT_EXT | abi.SECURITY_CTX | abi.CREATE_SUPP_GROUP | abi.HAS_EXPIRE_ONLY
              | abi.DIRECT_IO_ALLOW_MMAP | abi.PASSTHROUGH | abi.NO_EXPORT_SUPPORT | abi.HAS_RESEND
              | 1 << 41 | 1 << 42)  # 7.41+: FUSE_OVER_IO_URING, FUSE_REQUEST_TIMEOUT
# granted on every minor from 7.31: WANTED less the flags of 7.33, 7.36 and 7.40
BASE = (abi.ASYNC_READ | abi.ATOMIC_O_TRUNC | abi.EXPORT_SUPPORT | abi.BIG_WRITES | abi.AUTO_INVAL_DATA
        | abi.DO_READDIRPLUS | abi.READDIRPLUS_AUTO | abi.ASYNC_DIO | abi.PARALLEL_DIROPS | abi.MAX_PAGES)


def kernel_init(minor: int, offered: int) -> abi.Init:
    """The INIT request a kernel of 7.`minor` sends: fuse_init_in of 16 bytes, 64 from 7.36."""
    if minor >= 36:
        body = struct.pack("<IIIII", 7, minor, 131072, offered & 0xFFFFFFFF, offered >> 32) + bytes(44)
    else:
        body = struct.pack("<IIII", 7, minor, 131072, offered & 0xFFFFFFFF)
    init = P.parse_request(request(abi.Op.INIT, body)).args
    assert (init.major, init.minor) == (7, minor)
    return init


def init_reply(minor: int, flags: int, *, pages: int = 256, flags2: int = 0, depth: int = 0) -> bytes:
    """fuse_init_out written field by field (include/uapi/linux/fuse.h), 64 bytes."""
    return struct.pack("<IIIIHHIIHHII", 7, minor, 131072, flags, 64, 48, pages * 4096, 1, pages, 0, flags2, depth) + bytes(24)


@pytest.mark.parametrize("minor, reply_minor, granted, flags2, depth", [
    (31, 31, BASE, 0, 0),  # Linux 5.4: no KILLPRIV_V2, no flags2
    (33, 33, BASE | abi.HANDLE_KILLPRIV_V2, 0, 0),  # 5.11: SETXATTR_EXT offered, never granted
    (36, 36, BASE | abi.HANDLE_KILLPRIV_V2 | abi.INIT_EXT, 0, 0),  # 5.17: flags2 in both directions
    (38, 38, BASE | abi.HANDLE_KILLPRIV_V2 | abi.INIT_EXT, 0, 0),  # 6.1 (Debian 12, AL2023): no passthrough
    (40, 40, BASE | abi.HANDLE_KILLPRIV_V2 | abi.INIT_EXT | abi.PASSTHROUGH, 1 << 5, 1),  # 6.9: passthrough
    (45, 40, BASE | abi.HANDLE_KILLPRIV_V2 | abi.INIT_EXT | abi.PASSTHROUGH, 1 << 5, 1),  # newer: we speak 7.40
])
def test_init_reply_bytes_per_minor(minor: int, reply_minor: int, granted: int, flags2: int, depth: int) -> None:
    offered = EVERY_FLAG & abi.flags_of_minor(minor) if minor <= 40 else EVERY_FLAG
    out = abi.negotiate(kernel_init(minor, offered), passthrough=True, max_pages=256)
    assert out.flags == granted
    assert abi.encode_init(out) == init_reply(reply_minor, granted & 0xFFFFFFFF, flags2=flags2, depth=depth)


@pytest.mark.parametrize("minor", [31, 33, 36, 38])
def test_init_grants_no_flag_the_minor_lacks(minor: int) -> None:
    """A kernel whose offer has bits of later minors set (a backport, a bad kernel) gets none of
    them: passthrough only from 7.40, KILLPRIV_V2 only from 7.33, flags2 only from 7.36."""
    out = abi.negotiate(kernel_init(minor, EVERY_FLAG), passthrough=True, max_pages=256)
    assert not out.flags & abi.PASSTHROUGH and out.max_stack_depth == 0
    assert bool(out.flags & abi.HANDLE_KILLPRIV_V2) == (minor >= 33)
    assert bool(out.flags & abi.INIT_EXT) == (minor >= 36)
    assert not out.flags & ~abi.flags_of_minor(minor)
    assert struct.unpack_from("<II", abi.encode_init(out), 32) == (0, 0)


def test_init_passthrough_not_wanted_or_not_offered() -> None:
    off = abi.negotiate(kernel_init(40, EVERY_FLAG & abi.flags_of_minor(40)), passthrough=False, max_pages=256)
    assert abi.encode_init(off) == init_reply(40, (BASE | abi.HANDLE_KILLPRIV_V2 | abi.INIT_EXT) & 0xFFFFFFFF)
    # a 6.9+ kernel built without CONFIG_FUSE_PASSTHROUGH does not offer it
    none = abi.negotiate(kernel_init(45, EVERY_FLAG & ~abi.PASSTHROUGH), passthrough=True, max_pages=256)
    assert not none.flags & abi.PASSTHROUGH
    assert struct.unpack_from("<II", abi.encode_init(none), 32) == (0, 0)


def test_init_without_max_pages_or_before_7_23() -> None:
    """Without MAX_PAGES (before 7.28) a request carries 32 pages: max_write 128 KiB and the
    max_pages field 0. Before 7.23 the reply is 24 bytes: a longer one the kernel refuses."""
    out = abi.negotiate(kernel_init(27, abi.ASYNC_READ | abi.BIG_WRITES), passthrough=True, max_pages=256)
    assert (out.flags, out.max_pages, out.max_write) == (abi.ASYNC_READ | abi.BIG_WRITES, 32, 32 * 4096)
    raw = abi.encode_init(out)
    assert len(raw) == 64 and struct.unpack_from("<H", raw, 28)[0] == 0
    old = abi.encode_init(abi.negotiate(kernel_init(22, abi.ASYNC_READ), passthrough=False, max_pages=256))
    assert old == struct.pack("<IIIIHHI", 7, 22, 131072, abi.ASYNC_READ, 64, 48, 32 * 4096)


def test_setxattr_keeps_the_short_layout_on_every_minor() -> None:
    """SETXATTR_EXT (7.33) is never granted, so SETXATTR's fixed part stays 8 bytes."""
    assert not abi.WANTED & abi.SETXATTR_EXT
    req = P.parse_request(request(abi.Op.SETXATTR, struct.pack("<II", 3, 1) + b"user.a\0abc"))
    assert req.args == P.Setxattr(1, b"user.a", b"abc")


def test_negotiate_rejects() -> None:
    with pytest.raises(abi.InitError):
        abi.negotiate(abi.Init(8, 0, 0, 0), passthrough=False, max_pages=32)
    with pytest.raises(ValueError):
        abi.negotiate(abi.Init(7, 45, 0, abi.INIT_EXT | abi.PASSTHROUGH), passthrough=True, max_pages=32, max_stack_depth=3)


def test_names_and_two_name_requests() -> None:
    assert P.parse_request(request(abi.Op.LOOKUP, b"hello\0")).args == P.Name(b"hello")
    assert P.parse_request(request(abi.Op.UNLINK, b"x\0")).args == P.Name(b"x")
    sym = P.parse_request(request(abi.Op.SYMLINK, b"link\0/target/path\0")).args
    assert sym == P.Symlink(b"link", b"/target/path")
    ren = P.parse_request(request(abi.Op.RENAME, struct.pack("<Q", 9) + b"a\0b\0")).args
    assert ren == P.Rename(9, 0, b"a", b"b")
    ren2 = P.parse_request(request(abi.Op.RENAME2, struct.pack("<QII", 9, 1, 0) + b"old\0new\0")).args
    assert ren2 == P.Rename(9, 1, b"old", b"new")
    link = P.parse_request(request(abi.Op.LINK, struct.pack("<Q", 12) + b"n\0")).args
    assert link == P.Link(12, b"n")
    with pytest.raises(P.ProtocolError):
        P.parse_request(request(abi.Op.LOOKUP, b"no-nul"))


def test_create_mknod_mkdir_open() -> None:
    c = P.parse_request(request(abi.Op.CREATE, struct.pack("<IIII", 0o1101, 0o100644, 0o22, 0) + b"f\0")).args
    assert c == P.Create(0o1101, 0o100644, 0o22, 0, b"f")
    m = P.parse_request(request(abi.Op.MKNOD, struct.pack("<IIII", 0o100600, 0, 0o22, 0) + b"n\0")).args
    assert m == P.Mknod(0o100600, 0, 0o22, b"n")
    d = P.parse_request(request(abi.Op.MKDIR, struct.pack("<II", 0o755, 0o22) + b"d\0")).args
    assert d == P.Mkdir(0o755, 0o22, b"d")
    assert P.parse_request(request(abi.Op.OPEN, struct.pack("<II", 2, 0))).args == P.Open(2, 0)
    assert P.parse_request(request(abi.Op.OPENDIR, struct.pack("<II", 0, 0))).args == P.Open(0, 0)


def test_read_write_zero_copy() -> None:
    body = struct.pack("<QQIIQII", 3, 4096, 10, 0, 0, 2, 0)
    assert P.parse_request(request(abi.Op.READ, body)).args == P.Read(3, 4096, 10, 0, 0, 2)
    buf = request(abi.Op.WRITE, struct.pack("<QQIIQII", 3, 8192, 5, 0, 0, 1, 0) + b"hello")
    w = P.parse_request(buf).args
    assert (w.fh, w.offset, w.size) == (3, 8192, 5)
    assert bytes(w.data) == b"hello"
    assert w.data.obj is buf.obj  # a view into the read buffer, not a copy
    with pytest.raises(P.ProtocolError):
        P.parse_request(request(abi.Op.WRITE, struct.pack("<QQIIQII", 3, 0, 50, 0, 0, 1, 0) + b"short"))


def test_release_flush_fsync_forget() -> None:
    assert P.parse_request(request(abi.Op.RELEASE, struct.pack("<QIIQ", 5, 1, 1, 77))).args == P.Release(5, 1, 1, 77)
    assert P.parse_request(request(abi.Op.FLUSH, struct.pack("<QIIQ", 5, 0, 0, 77))).args == P.Flush(5, 77)
    assert P.parse_request(request(abi.Op.FSYNC, struct.pack("<QII", 5, 1, 0))).args == P.Fsync(5, 1)
    assert P.parse_request(request(abi.Op.FORGET, struct.pack("<Q", 3))).args == P.Forget(3)
    bf = P.parse_request(request(abi.Op.BATCH_FORGET, struct.pack("<II", 2, 0) + struct.pack("<QQQQ", 10, 1, 11, 2))).args
    assert bf == P.BatchForget([(10, 1), (11, 2)])


def test_setattr_fields() -> None:
    valid = abi.FATTR_SIZE | abi.FATTR_MODE | abi.FATTR_MTIME | abi.FATTR_FH | abi.FATTR_ATIME_NOW
    body = struct.pack("<IIQQQqqqIIIIIIII", valid, 0, 9, 1234, 0, 5, 6, 7, 1, 2, 3, 0o100600, 0, 1000, 1000, 0)
    a = P.parse_request(request(abi.Op.SETATTR, body)).args
    assert (a.valid, a.fh, a.size, a.mode) == (valid, 9, 1234, 0o100600)
    assert (a.atime_ns, a.mtime_ns, a.ctime_ns) == (5_000_000_001, 6_000_000_002, 7_000_000_003)
    f = setattr_fields(a)
    assert (f.size, f.mode, f.fh, f.mtime_ns) == (1234, 0o100600, 9, 6_000_000_002)
    assert f.uid is None and f.gid is None and f.ctime_ns is None
    assert f.atime_ns is not None and f.atime_ns > 7_000_000_003  # ATIME_NOW resolved to now


def test_xattr_access_interrupt_fallocate_lseek() -> None:
    s = P.parse_request(request(abi.Op.SETXATTR, struct.pack("<II", 3, 1) + b"user.k\0abc")).args
    assert s == P.Setxattr(1, b"user.k", b"abc")
    s_ext = P.parse_setxattr(memoryview(struct.pack("<IIII", 2, 0, 0, 0) + b"n\0xy"), ext=True)
    assert s_ext == P.Setxattr(0, b"n", b"xy")
    assert P.parse_request(request(abi.Op.GETXATTR, struct.pack("<II", 0, 0) + b"user.k\0")).args == P.Getxattr(0, b"user.k")
    assert P.parse_request(request(abi.Op.LISTXATTR, struct.pack("<II", 64, 0))).args == P.Listxattr(64)
    assert P.parse_request(request(abi.Op.ACCESS, struct.pack("<II", 4, 0))).args == P.Access(4)
    assert P.parse_request(request(abi.Op.INTERRUPT, struct.pack("<Q", 1234))).args == P.Interrupt(1234)
    assert P.parse_request(request(abi.Op.FALLOCATE, struct.pack("<QQQII", 1, 0, 4096, 0, 0))).args == P.Fallocate(1, 0, 4096, 0)
    assert P.parse_request(request(abi.Op.LSEEK, struct.pack("<QQII", 1, 10, 3, 0))).args == P.Lseek(1, 10, 3)


def test_unknown_opcode_and_extensions() -> None:
    assert isinstance(P.parse_request(request(abi.Op.STATFS, b"")).args, P.Empty)
    assert isinstance(P.parse_request(request(abi.Op.DESTROY, b"")).args, P.Empty)
    assert isinstance(P.parse_request(request(4242, b"whatever")).args, P.Empty)
    # request extensions at the end (total_extlen in 8-byte units) are not part of the name
    req = P.parse_request(request(abi.Op.LOOKUP, b"a\0\0\0\0\0\0\0" + b"E" * 8, extlen=1))
    assert req.args == P.Name(b"a")
    with pytest.raises(P.ProtocolError):
        P.parse_request(memoryview(b"\0" * 10))


def attr(**kw: int) -> Attr:
    base = dict(ino=5, mode=stat.S_IFREG | 0o644, nlink=1, uid=1, gid=2, size=10, blocks=1,
                atime_ns=1_500_000_000, mtime_ns=2_000_000_001, ctime_ns=3_000_000_002)
    base.update(kw)
    return Attr(**base)  # type: ignore[arg-type]


def test_reply_encoding() -> None:
    parts = P.reply(9, P.encode_write(4096))
    assert parts[0] == struct.pack("<IiQ", 24, 0, 9)
    assert P.reply_error(9, errno.ENOENT) == [struct.pack("<IiQ", 16, -errno.ENOENT, 9)]
    a = attr()
    raw = P.encode_attr(a)
    fields = abi.ATTR.unpack(raw)
    assert fields[:6] == (5, 10, 1, 1, 2, 3)
    assert fields[6:9] == (500_000_000, 1, 2)
    assert fields[9:15] == (a.mode, 1, 1, 2, 0, 4096)
    e = P.encode_entry(Attr(ino=6, mode=stat.S_IFDIR | 0o755, entry_timeout=1.5, attr_timeout=2.0, generation=3))
    assert abi.ENTRY_OUT_HEAD.unpack_from(e) == (6, 3, 1, 2, 500_000_000, 0)
    assert len(P.encode_attr_out(a)) == 104
    assert P.encode_open(3, abi.FOPEN_PASSTHROUGH, 7) == struct.pack("<QIi", 3, 1 << 7, 7)
    st = P.encode_statfs(StatFs(blocks=10, bfree=5, bavail=4, files=3, ffree=2, bsize=4096, frsize=512, namemax=255))
    assert struct.unpack_from("<QQQQQIII", st) == (10, 5, 4, 3, 2, 4096, 255, 512)
    assert P.encode_xattr_list([b"a", b"bc"]) == b"a\0bc\0"
    assert P.encode_lseek(99) == struct.pack("<Q", 99)


def test_dirents_fit_and_align() -> None:
    entries = [(b"a", attr(ino=10), 1), (b"dir", attr(ino=11, mode=stat.S_IFDIR | 0o755), 2), (b"c" * 20, attr(ino=12), 3)]
    d = P.encode_dirent(10, 1, b"a", stat.S_IFREG)
    assert len(d) == 32 and abi.DIRENT_HEAD.unpack_from(d) == (10, 1, 1, 8)  # DT_REG
    payload, n = P.pack_dirents(entries, 4096, plus=False)
    assert n == 3 and len(payload) == 32 + 32 + 48
    assert abi.DIRENT_HEAD.unpack_from(payload, 32)[3] == 4  # DT_DIR
    payload, n = P.pack_dirents(entries, 70, plus=False)
    assert n == 2 and len(payload) == 64
    plus, n = P.pack_dirents(entries, 4096, plus=True)
    assert n == 3 and len(plus) == (128 + 32) * 2 + 128 + 48
    assert abi.ENTRY_OUT_HEAD.unpack_from(plus)[0] == 10
    _, n = P.pack_dirents(entries, 159, plus=True)
    assert n == 0  # not even one entry fits: an empty reply


def test_notifications() -> None:
    hdr, body = P.notify_inval_inode(5, 0, -1)
    assert hdr == struct.pack("<IiQ", 16 + 24, abi.Notify.INVAL_INODE, 0)
    assert body == struct.pack("<Qqq", 5, 0, -1)
    hdr, body = P.notify_inval_entry(1, b"name")
    assert hdr == struct.pack("<IiQ", 16 + 16 + 5, abi.Notify.INVAL_ENTRY, 0)
    assert body == struct.pack("<QII", 1, 4, 0) + b"name\0"


# ------------------------------------------------------------------ per-inode mode
class FakeBacking:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.next = 1
        self.open: dict[int, int] = {}

    def open_backing(self, fd: int) -> int:
        if self.fail:
            raise PermissionError(errno.EPERM, "no CAP_SYS_ADMIN")
        bid, self.next = self.next, self.next + 1
        self.open[bid] = fd
        return bid

    def close_backing(self, bid: int) -> None:
        del self.open[bid]


def test_iomode_passthrough_kept_until_last_release() -> None:
    b = FakeBacking()
    m = IoModes(b.open_backing, b.close_backing, enabled=True)
    assert m.open(ino=5, fh=1, offered_fd=30) == 1
    assert m.open(ino=5, fh=2, offered_fd=None) == 1  # same backing id, though not offered
    assert m.open(ino=5, fh=3, offered_fd=31) == 1  # no second backing id for the inode
    assert m.passthrough_handles == 3 and m.is_passthrough(2)
    m.release(1)
    m.release(3)
    assert b.open == {1: 30} and m.mode_of(5) == "passthrough"
    m.release(2)
    assert b.open == {} and m.mode_of(5) is None and m.passthrough_handles == 0


def test_iomode_copy_first_refuses_later_offers() -> None:
    b = FakeBacking()
    m = IoModes(b.open_backing, b.close_backing, enabled=True)
    assert m.open(5, 1, None) is None
    assert m.open(5, 2, 40) is None  # the inode is in copy mode until its last release
    assert m.refused == 1 and b.open == {}
    m.release(1)
    m.release(2)
    assert m.open(5, 3, 41) == 1  # idle again: decided afresh
    m.release(3)
    m.release(3)  # unknown handle: ignored
    assert b.open == {}


def test_iomode_disabled_or_ioctl_failing() -> None:
    off = IoModes(FakeBacking().open_backing, FakeBacking().close_backing, enabled=False)
    assert off.open(5, 1, 30) is None
    b = FakeBacking(fail=True)
    m = IoModes(b.open_backing, b.close_backing, enabled=True)
    assert m.open(5, 1, 30) is None and m.mode_of(5) == "copy"
    b.fail = False
    assert m.open(5, 2, 30) is None  # the inode stays in copy mode
    m.close_all()
    assert m.mode_of(5) is None


def test_choose_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from ckptfs.fuse import kernel

    assert kernel.choose_transport("libfuse") == "libfuse"
    assert kernel.choose_transport("kernel") == "kernel"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert kernel.choose_transport("auto") == "kernel"  # root: on any kernel, passthrough or not
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert kernel.choose_transport("auto") == "libfuse"  # not root: fusermount3 and pyfuse3


def test_iomode_drop_all_makes_no_ioctl() -> None:
    b = FakeBacking()
    m = IoModes(b.open_backing, b.close_backing, enabled=True)
    m.open(5, 1, 30)
    b.fail = True  # the device is gone: any ioctl would fail
    m.drop_all()
    assert m.passthrough_handles == 0 and m.mode_of(5) is None
    assert b.open == {1: 30}  # not closed by an ioctl


class _AtOnce:
    """An `ops` answering getattr and the xattrs it lacks at once, and its own xattr only by waiting."""

    def getattr_now(self, ino: int, fh: int | None, ctx: object) -> Attr | None:
        if ino == 404:
            raise OSError(errno.ENOENT, "no such inode")
        return attr(ino=ino, size=1 << 20)

    def getxattr_now(self, ino: int, name: bytes, ctx: object) -> bytes | None:
        if name.startswith(b"user.ckptfs."):
            return None  # would have to wait: the coroutine is asked
        raise OSError(errno.ENODATA, "no such attribute")


def test_getattr_and_absent_xattrs_answered_without_a_task() -> None:
    """What the kernel asks in the serial chain of every write under passthrough (a GETATTR after it, the
    security.capability GETXATTR before the next) is answered by `RequestHandlers.now`, without a task;
    what would have to wait, and every other request, is left to a task (None)."""
    from ckptfs.fuse.handlers import RequestHandlers

    handlers = RequestHandlers(_AtOnce(), IoModes(lambda fd: 1, lambda i: None, enabled=False))  # type: ignore[arg-type]
    got = handlers.now(P.parse_request(request(abi.Op.GETATTR, struct.pack("<IIQ", abi.GETATTR_FH, 0, 3), nodeid=5)))
    assert got is not None and got[0] == struct.pack("<IiQ", 16 + 104, 0, 7)
    assert abi.ATTR.unpack_from(got[1], abi.ATTR_OUT_HEAD.size)[:2] == (5, 1 << 20)
    missing = handlers.now(P.parse_request(request(abi.Op.GETATTR, struct.pack("<IIQ", 0, 0, 0), nodeid=404)))
    assert missing == P.reply_error(7, errno.ENOENT)
    cap = handlers.now(P.parse_request(request(abi.Op.GETXATTR, struct.pack("<II", 0, 0) + b"security.capability\0")))
    assert cap == P.reply_error(7, errno.ENODATA)
    assert handlers.now(P.parse_request(request(abi.Op.GETXATTR, struct.pack("<II", 64, 0) + b"user.ckptfs.state\0"))) is None
    assert handlers.now(P.parse_request(request(abi.Op.LOOKUP, b"a\0"))) is None
