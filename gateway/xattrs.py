"""The `user.ckptfs.*` extended attributes: what each says, for a file, a checkpoint directory and the root.

Apart from fs.py so the filesystem's class keeps to its requests: the values come from the journal's
row, the lifecycle (a checkpoint directory's state), the peers (`replicated`) and the fetcher (an
archived object's restore state), each handed in as a small interface, so this module imports none of them.
"""

from __future__ import annotations

import errno
from typing import Protocol

from .journal import DIRTY, DURABLE, ROOT_INODE
from .namespace import Namespace
from .storageclass import ArchiveState

XATTR_STATE = b"user.ckptfs.state"
XATTR_ETAG = b"user.ckptfs.etag"
XATTR_XXH3 = b"user.ckptfs.xxh3"
XATTR_CONTROL = b"user.ckptfs.control"  # on the root: path of the control socket
REPLICATED = "replicated"  # user.ckptfs.state of a dirty file whose current version R peers hold (durability = peer)
FILE_XATTRS = (XATTR_STATE, XATTR_ETAG, XATTR_XXH3)


class CheckpointStates(Protocol):
    """A checkpoint directory's state for its `user.ckptfs.state` attribute (lifecycle/service.Lifecycle, wired by the
    daemon): the word `ckptfs.state()` and `ckptfs checkpoints` give, so the two never disagree."""

    def is_checkpoint(self, path: str) -> bool:
        """Whether mount-relative directory `path` is a checkpoint (no I/O)."""

    async def checkpoint_state(self, path: str) -> str | None:
        """writing, draining, committed, protected or expiring; None if `path` is not a checkpoint. OSError (EIO) when
        the bucket cannot say."""


class Replication(Protocol):
    """Peer durability (peers/service.Peers, wired by the daemon when `durability = peer`): fsync and a writer's
    close wait until R peers hold the file too."""

    async def replicated(self, ino: int) -> None:
        """Until the file's current version is on R peers' disks; OSError(EIO) if none answers and on_no_peer = fail."""

    async def names_replicated(self) -> None:
        """Until every rename, unlink and rmdir made so far is on R peers' disks (one round trip); with fewer peers it
        returns anyway, counted as degraded: the operation is already applied here."""

    def is_replicated(self, ino: int) -> bool:
        """The file's current version is on R peers' disks (its `user.ckptfs.state`: `replicated`)."""


class ArchiveStates(Protocol):
    """fetch.Fetcher's restore state of a file only in the bucket."""

    async def archive_state(self, ino: int) -> ArchiveState | None: ...


class Xattrs:
    def __init__(self, ns: Namespace, archive: ArchiveStates, control_socket: str) -> None:
        self.ns, self.archive, self.control_socket = ns, archive, control_socket

    def known_now(self, inode: int, name: bytes) -> bytes | None:
        """The names ckptfs does not have, answered at once: the kernel asks for security.capability before
        a write to a file whose attributes it has refreshed since its last write (every write Ganesha
        follows with a stat); None for ckptfs's own names, which may have to ask the lifecycle or fetcher."""
        if inode == ROOT_INODE and name == XATTR_CONTROL:
            return self.control_socket.encode()
        if name not in FILE_XATTRS:
            raise OSError(errno.ENODATA, "no such attribute")
        return None

    async def value(self, inode: int, name: bytes, checkpoints: CheckpointStates | None, peers: Replication | None) -> bytes:
        known = self.known_now(inode, name)  # the kernel asks for security.capability and the like on every new file
        if known is not None:
            return known
        row = self.ns.files.row(inode)
        if row.is_dir:
            path = self.ns.journal.path_of(inode) if name == XATTR_STATE and checkpoints is not None else None
            state = await checkpoints.checkpoint_state(path) if path and checkpoints else None
            if state is None:
                raise OSError(errno.ENODATA, "no such attribute")  # a directory that is not a checkpoint: no state of its own
            return state.encode()
        value = {XATTR_STATE: row.state, XATTR_ETAG: row.etag, XATTR_XXH3: row.xxh3}.get(name)
        if name in (XATTR_ETAG, XATTR_XXH3) and row.state != DURABLE:
            value = None
        if name == XATTR_STATE and row.state == DIRTY and peers is not None and peers.is_replicated(inode):
            value = REPLICATED  # between dirty and durable: on R peers' disks too
        if name == XATTR_STATE and row.state == DURABLE:
            archived = await self.archive.archive_state(inode)  # None unless listed in a class that may need a restore
            if archived is not None and archived.label:
                value = archived.label  # archived | restoring: not readable until restored
        if not value:
            raise OSError(errno.ENODATA, "no such attribute")
        return value.encode()

    def names(self, inode: int, checkpoints: CheckpointStates | None) -> list[bytes]:
        if inode == ROOT_INODE:
            return [XATTR_CONTROL]
        row = self.ns.files.row(inode)
        if row.is_dir:
            path = self.ns.journal.path_of(inode) if checkpoints is not None else None
            return [XATTR_STATE] if path and checkpoints and checkpoints.is_checkpoint(path) else []
        return [XATTR_STATE] + ([XATTR_ETAG, XATTR_XXH3] if row.state == DURABLE else [])
