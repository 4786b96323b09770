"""mount(2) and umount2(2) of a FUSE file system, through ctypes.

Why not fusermount3: passthrough needs CAP_SYS_ADMIN for the backing-file ioctls anyway, so
the kernel transport only runs as root, and root can mount the /dev/fuse fd directly, with
the options the kernel parses (fs/fuse/inode.c): fd, rootmode, user_id, group_id,
default_permissions, allow_other.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MNT_FORCE = 1
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def options(fd: int, *, allow_other: bool = True, default_permissions: bool = True,
            uid: int | None = None, gid: int | None = None, max_read: int | None = None) -> str:
    opts = [f"fd={fd}", "rootmode=40000",
            f"user_id={os.getuid() if uid is None else uid}",
            f"group_id={os.getgid() if gid is None else gid}"]
    if default_permissions:
        opts.append("default_permissions")
    if allow_other:
        opts.append("allow_other")
    if max_read:
        opts.append(f"max_read={max_read}")
    return ",".join(opts)


def mount(source: str, target: str, fstype: str, data: str, flags: int = MS_NOSUID | MS_NODEV) -> None:
    if _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags, data.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {fstype} on {target}: {os.strerror(e)}")


def umount(target: str, lazy: bool = False) -> bool:
    """Unmount; a busy mount is detached lazily. False if nothing was mounted there."""
    flags = MNT_DETACH if lazy else 0
    if _libc.umount2(os.fsencode(target), flags) == 0:
        return True
    e = ctypes.get_errno()
    if e == errno.EBUSY and not lazy:
        return umount(target, lazy=True)
    if e in (errno.EINVAL, errno.ENOENT):
        return False
    raise OSError(e, f"umount {target}: {os.strerror(e)}")


def max_pages_limit(default: int = 256) -> int:
    """/proc/sys/fs/fuse/max_pages_limit: the most pages one request may carry."""
    try:
        with open("/proc/sys/fs/fuse/max_pages_limit") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return default
