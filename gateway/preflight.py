"""Start-up checks of what a user can get wrong before a mount, each reported as one `UserError` line.

Apart from daemon.py so the command line can run the cache directory's checks before it starts a daemon
(`ckptfs mount --daemon` refuses a busy or full cache directory before writing its log there), and so the
daemon's wiring stays readable.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

from .config import Config
from .journal import disk_full_message
from .lifecycle import codec

log = logging.getLogger("ckptfs")


class UserError(Exception):
    """A problem the user can fix; the message is one line naming it and the fix."""


# ------------------------------------------------------------------ preflight
def check_cold_extra(cfg: Config) -> None:
    """A cold tier that compresses needs numpy and zstandard, the 'cold' extra: one line at start, not an error at the first move."""
    if cfg.tier_move_target and cfg.cold_compression != "none" and codec.MISSING_EXTRA is not None:
        raise UserError(f"{codec.NEEDS_EXTRA}, or set cold_compression = \"none\"")


def check_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        raise UserError("/dev/fuse is missing: load the fuse kernel module (modprobe fuse) or, in a container, pass --device /dev/fuse")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise UserError("/dev/fuse is not readable and writable by this user: run as root or fix its permissions")
    if shutil.which("fusermount3") is None:
        raise UserError("fusermount3 is not installed: install the fuse3 package (apt-get install fuse3)")


def check_mountpoint(path: str) -> None:
    p = Path(path)
    try:
        p.stat()
    except FileNotFoundError:
        raise UserError(f"mount point {path} does not exist: create it with mkdir -p {path}") from None
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            # a FUSE mount whose daemon died: unmount the corpse, it serves nobody
            log.warning("mount point %s is a dead FUSE mount (its daemon died); unmounting it", path)
            subprocess.run(["fusermount3", "-u", "-z", path], check=False, capture_output=True)
            try:
                p.stat()
            except OSError:
                raise UserError(f"mount point {path} is a dead mount that could not be cleaned: run fusermount3 -uz {path}") from None
        else:
            raise UserError(f"mount point {path} cannot be used: {e.strerror}") from None
    if not p.is_dir():
        raise UserError(f"mount point {path} is not a directory: give a directory")
    if os.path.ismount(path):
        raise UserError(f"mount point {path} is already mounted: unmount it first (ckptfs unmount {path})")
    if any(p.iterdir()):
        raise UserError(f"mount point {path} is not empty: use an empty directory")


def check_cache_dir(path: str, mountpoint: str = "") -> None:
    check_cache_dir_placement(path, mountpoint)
    p = Path(path)
    if not p.exists():
        raise UserError(f"cache directory {path} does not exist: create it (mkdir -p {path}) on the local NVMe")
    if not p.is_dir():
        raise UserError(f"cache directory {path} is not a directory")
    if os.statvfs(p).f_flag & os.ST_RDONLY:  # access() says EROFS to root as to anyone: name the real cause
        raise UserError(f"cache directory {path} is on a read-only file system: give a directory on a writable local disk "
                        "(or remount it read-write)")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UserError(f"cache directory {path} is not writable by this user: fix its permissions or run as its owner")


def _mount_table() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount this process sees."""
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3:
                    # spaces and the like are escaped as octal (\040) in the table
                    where = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
                    out.append((where, fields[2]))
    except OSError:
        pass
    return out


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def check_cache_dir_placement(path: str, mountpoint: str = "") -> None:
    """The cache must be on local disk: never the mount point itself, nor inside any ckptfs mount."""
    cache = os.path.realpath(path)
    if mountpoint and _inside(cache, os.path.realpath(mountpoint)):
        raise UserError(f"cache directory {path} is the mount point {mountpoint} or inside it: put the cache on a local disk outside the mount")
    for where, fstype in _mount_table():
        if fstype.startswith("fuse.ckptfs") and _inside(cache, where):
            raise UserError(f"cache directory {path} is inside the ckptfs mount {where}: put the cache on a local disk, not in a ckptfs mount")


def secure_cache_dir(path: str) -> None:
    """The journal, the log and the control socket are the owner's alone: 0600 files in a 0700 directory."""
    os.umask(0o077)  # whatever the daemon creates from now on
    p = Path(path)
    if p.stat().st_mode & 0o077:
        log.info("cache directory %s: access limited to its owner (mode 0700)", path)
        os.chmod(p, 0o700)
    for entry in os.scandir(p):
        if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mode & 0o077:
            os.chmod(entry.path, 0o600)


def lock_cache_dir(path: str) -> int:
    """Hold an exclusive lock on the cache dir for the daemon's life: two daemons on one journal would corrupt it."""
    lock_path = Path(path) / "lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise UserError(f"cache directory {path} is in use by a running ckptfs (pid {owner}): unmount it first or use another --cache-dir") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(disk_full_message(path)) from None
        raise UserError(f"cannot write the lock file {lock_path}: {e.strerror}: check the cache disk (dmesg)") from None
    return fd


def check_cache_dir_free(path: str) -> None:
    """Refuse a cache directory a running daemon holds (UserError), before anything is written into it: its log
    file there is that daemon's, and a refused start must not write into it."""
    os.close(lock_cache_dir(path))
