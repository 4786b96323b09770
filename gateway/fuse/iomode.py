"""Per-inode I/O mode: passthrough or copy, decided at the first open and kept to the last release.

Why: the kernel keeps one backing file per inode. While an inode has a passthrough open, every
other open of it must be passthrough with the same backing id (else open(2) fails with EIO),
and while it has a cached copy-mode open a passthrough open fails too. So the transport, not
each open, decides: the first open of an idle inode picks the mode (passthrough when the
filesystem offered a backing fd and the kernel takes it), later opens follow that mode, and
the backing id is closed when the last handle of the inode is released.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Inode:
    handles: int
    backing_id: int | None  # None: copy mode


class IoModes:
    """The table of open inodes. `open_backing(fd) -> id` and `close_backing(id)` are the
    ioctls on /dev/fuse (raising OSError); `enabled` is False when passthrough was not granted."""

    def __init__(self, open_backing: Callable[[int], int], close_backing: Callable[[int], None], enabled: bool) -> None:
        self._open_backing = open_backing
        self._close_backing = close_backing
        self.enabled = enabled
        self._inodes: dict[int, _Inode] = {}
        self._fh_ino: dict[int, tuple[int, bool]] = {}
        self.passthrough_handles = 0
        self.refused = 0  # offers of passthrough turned into copy mode

    def open(self, ino: int, fh: int, offered_fd: int | None) -> int | None:
        """Record handle `fh` of `ino`; returns its backing id (passthrough) or None (copy)."""
        st = self._inodes.get(ino)
        if st is None:
            backing = None
            if self.enabled and offered_fd is not None:
                try:
                    backing = self._open_backing(offered_fd)
                except OSError as e:
                    log.warning("passthrough refused for inode %d: %s", ino, e)
            st = self._inodes[ino] = _Inode(0, backing)
        elif offered_fd is not None and st.backing_id is None:
            self.refused += 1  # copy mode holds until its last handle is released
        st.handles += 1
        passthrough = st.backing_id is not None
        self._fh_ino[fh] = (ino, passthrough)
        if passthrough:
            self.passthrough_handles += 1
        return st.backing_id

    def is_passthrough(self, fh: int) -> bool:
        entry = self._fh_ino.get(fh)
        return bool(entry and entry[1])

    def mode_of(self, ino: int) -> str | None:
        st = self._inodes.get(ino)
        if st is None:
            return None
        return "passthrough" if st.backing_id is not None else "copy"

    def release(self, fh: int) -> None:
        """Handle `fh` is gone; the last handle of an inode closes its backing id."""
        entry = self._fh_ino.pop(fh, None)
        if entry is None:
            return
        ino, passthrough = entry
        if passthrough:
            self.passthrough_handles -= 1
        st = self._inodes[ino]
        st.handles -= 1
        if st.handles > 0:
            return
        del self._inodes[ino]
        if st.backing_id is not None:
            try:
                self._close_backing(st.backing_id)
            except OSError as e:
                log.warning("closing backing id %d of inode %d: %s", st.backing_id, ino, e)

    def close_all(self) -> None:
        """Release every handle (closing the backing ids)."""
        for fh in list(self._fh_ino):
            self.release(fh)

    def drop_all(self) -> None:
        """Forget every handle without the ioctls: closing /dev/fuse frees the backing ids."""
        self._inodes.clear()
        self._fh_ino.clear()
        self.passthrough_handles = 0
