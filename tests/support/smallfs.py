"""A small real file system for a cache directory (tmpfs), and a filler file that takes its free space.

The filler stands for another process on the node writing to the same disk: the daemon sees a full
file system, not a setting, and every write of its own (cache files, journal, lock file) can fail.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

MiB = 1 << 20


def can_mount_tmpfs() -> bool:
    return os.geteuid() == 0


class SmallFs:
    """A tmpfs of `size` bytes mounted on `path` (which must exist) until `close`."""

    def __init__(self, path: Path, size: int = 64 * MiB) -> None:
        self.path = path
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
        self.filler = path / "filler.bin"  # outside data/ and the journal's names: the daemon leaves it alone

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Take every free byte but `leave` (again, after the daemon freed some): the file system is full."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                free = self.free() - leave
                if free <= 0:
                    break
                size = os.fstat(fd).st_size
                try:
                    os.posix_fallocate(fd, size, free)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    # the last pages: one at a time, until none is left
                    try:
                        os.pwrite(fd, b"\0" * 4096, os.fstat(fd).st_size)
                    except OSError as e2:
                        if e2.errno == errno.ENOSPC:
                            break
                        raise
        finally:
            os.close(fd)

    def empty(self) -> None:
        """The other process deletes its file: the space is back."""
        try:
            os.unlink(self.filler)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        # lazily: a daemon of a failed test may still hold files here; the mount goes once it lets go
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)


@pytest.fixture
def small_fs() -> Iterator[Callable[[Path], SmallFs]]:
    """Mount a 64 MiB tmpfs on a (cache) directory; unmounted (lazily) after the test."""
    if not can_mount_tmpfs():
        pytest.skip("needs root to mount a small tmpfs as the cache disk")
    made: list[SmallFs] = []

    def factory(path: Path) -> SmallFs:
        fs = SmallFs(path)
        made.append(fs)
        return fs

    yield factory
    for fs in made:
        fs.close()
