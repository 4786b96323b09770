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
from pathlib import Path


class Cache:
    def __init__(self, root: Path, capacity: int) -> None:
        self.data_dir = root / "data"
        self.data_dir.mkdir(exist_ok=True)
        st = os.statvfs(self.data_dir)
        fs_size = st.f_blocks * st.f_frsize
        self.capacity_bytes = capacity if capacity > 0 else int(fs_size * 0.9)
        self.used_bytes = 0

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

    def grow(self, old_size: int, new_size: int) -> None:
        """Account a size change; raise ENOSPC if growing would pass the capacity."""
        delta = new_size - old_size
        if delta > 0 and self.used_bytes + delta > self.capacity_bytes:
            raise OSError(errno.ENOSPC, "ckptfs cache is full")
        self.used_bytes += delta
