"""File data on the node's local disk: one cache file per inode, `data/<ino>`.

Why by inode and not by path: a rename then touches no data at all, and the
journal alone says which path a cache file belongs to.

Space accounting is by logical file size (what applications wrote), checked
against `capacity_bytes` before a write grows a file. Dirty bytes can never
be evicted, so when they reach the capacity the writer gets ENOSPC rather
than losing data silently.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from .config import auto_min_free

DISK_SAMPLE_SECONDS = 0.25


class CacheFull(OSError):
    """Growing a file would pass the cache's capacity or its disk reserve."""

    def __init__(self, needed: int) -> None:
        super().__init__(errno.ENOSPC, "ckptfs cache is full")
        self.needed = needed


class Cache:
    def __init__(self, root: Path, capacity: int, min_free: int | None = 0) -> None:
        self.data_dir = root / "data"
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        st = os.statvfs(self.data_dir)
        fs_size = st.f_blocks * st.f_frsize
        self.fs_size = fs_size
        self.capacity_bytes = capacity if capacity > 0 else int(fs_size * 0.9)
        self.min_free = auto_min_free(fs_size) if min_free is None else min_free
        self.used_bytes = 0
        self.lent_bytes = 0  # set aside for the kernel transport's copy workers (`Space.lend`), not yet written
        self._disk_free = 0
        self._sampled_at = -1e9
        self._grown_since_sample = 0

    def forget_disk_sample(self) -> None:
        """The next `room` reads the disk's free space afresh: before a refusal, whose answer must not rest on a
        sample taken before another process freed space."""
        self._sampled_at = -1e9

    def room(self) -> int:
        """Bytes that may still be added: the lesser of the capacity left and the disk above its reserve."""
        now = time.monotonic()
        if now - self._sampled_at > DISK_SAMPLE_SECONDS:
            st = os.statvfs(self.data_dir)
            self._disk_free = st.f_bavail * st.f_frsize
            self._sampled_at = now
            self._grown_since_sample = 0
        return min(self.capacity_bytes - self.used_bytes, self._disk_room()) - self.lent_bytes

    def _disk_room(self) -> int:
        return self._disk_free - self._grown_since_sample - self.min_free

    def limit(self) -> str:
        """Which setting bounds the room now: 'cache_capacity' or 'cache_min_free' (the disk's free space)."""
        self.room()
        return "cache_min_free" if self._disk_room() < self.capacity_bytes - self.used_bytes else "cache_capacity"

    def disk_free(self) -> int:
        self.room()
        return self._disk_free - self._grown_since_sample

    def path(self, ino: int) -> Path:
        return self.data_dir / str(ino)

    def scan(self, known: set[int]) -> None:
        """Count what is on disk; remove files no inode owns (left by a crash)."""
        used = 0
        for entry in os.scandir(self.data_dir):
            try:
                ino = int(entry.name)
            except ValueError:
                ino = -1
            if ino not in known:
                os.unlink(entry.path)
                continue
            used += entry.stat().st_size
        self.used_bytes = used

    def create(self, ino: int) -> None:
        fd = os.open(self.path(ino), os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        os.close(fd)

    def open(self, ino: int) -> int:
        return os.open(self.path(ino), os.O_RDWR)

    def size(self, ino: int) -> int:
        try:
            return os.stat(self.path(ino)).st_size
        except FileNotFoundError:
            return 0

    def remove(self, ino: int, size: int) -> None:
        try:
            os.unlink(self.path(ino))
        except FileNotFoundError:
            return
        self.used_bytes = max(0, self.used_bytes - size)
        self._grown_since_sample -= size

    def resized(self, old_size: int, new_size: int) -> None:
        """Account a size change already on disk (the kernel wrote the file itself, FUSE
        passthrough): nothing to refuse any more."""
        self.used_bytes += new_size - old_size
        self._grown_since_sample += new_size - old_size

    def grow(self, old_size: int, new_size: int) -> None:
        """Account a size change; raise CacheFull if growing would pass the capacity or the disk reserve."""
        delta = new_size - old_size
        if delta > 0 and delta > self.room():
            raise CacheFull(delta)
        self.used_bytes += delta
        self._grown_since_sample += delta


def mtimes_change_after_stat(directory: str | os.PathLike[str], tries: int = 64) -> bool:
    """True if a write right after a stat of a file in `directory` always gets a new mtime on this kernel and file
    system (multigrain timestamps, Linux 6.13+ on ext4, xfs, btrfs, tmpfs: a queried timestamp makes the next change
    fine-grained). Where it does not, an mtime is taken from a coarse clock (a jiffy), and a size and mtime unchanged
    since a stat prove no byte unchanged unless that mtime was already older than a tick then. Measured, not guessed
    from the kernel's version: `tries` rewrites in place, each right after a stat, well inside one tick."""
    fd = -1
    path = os.path.join(directory, f".mtime-probe-{os.getpid()}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.unlink(path)
        os.pwrite(fd, b"\0", 0)
        for _ in range(tries):
            before = os.fstat(fd).st_mtime_ns
            os.pwrite(fd, b"\1", 0)
            if os.fstat(fd).st_mtime_ns == before:
                return False
        return True
    except OSError:
        return False  # cannot tell: assume the coarse clock (only costs a hash more)
    finally:
        if fd >= 0:
            os.close(fd)

