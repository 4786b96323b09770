"""The owner's seal digests (xxh3-128 and BLAKE3: sealhash.py) of each file it replicates, kept between seals: one of
the sender's jobs, in a room of its own.

Why keep them: a seal carries the whole file's digests, and hashing a checkpoint shard again at every fsync and
close would cost a read of the file each time. So the sender keeps, per file, the last digest and of which bytes
(`Hashed`), and the hash state of the file's first bytes (`prefix`): a seal after an append hashes only the new
bytes, and bytes streamed to the peers in order are hashed as they leave (`extend`). Under passthrough the kernel
writes the cache file itself and may rewrite bytes in place unseen: no prefix is kept for such a file, and a kept
digest holds only while the cache file's size and mtime are as they were when it was taken (`versions_held`) and
that mtime proves it (`Hashed.proof`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import trio

from ..cache import mtimes_change_after_stat
from ..journal import Row
from ..namespace import Namespace
from ..namespace.files import MTIME_SETTLED_NS
from ..upload import hash_range
from .sealhash import SealDigest, SealHash

HASHING_THREADS = 2  # files hashed at once (each a sequential read of the page cache)


@dataclass(frozen=True)
class Hashed:
    """The last digests taken of a file, and of which bytes: its version and size, and its cache file's size and mtime
    then. While the cache file still has that size and mtime (and no write callback came), the peers sealed at that
    version hold the file's bytes, even if a passthrough close or fsync has counted a new version since: but only
    if that mtime proves it (`proof`). On a kernel whose mtimes come from a coarse clock (before Linux 6.13's
    multigrain timestamps), a rewrite in place within the same tick as the hash leaves size and mtime as they were,
    so an mtime younger than a tick when hashed proves nothing about the bytes a later version holds."""

    version: int
    size: int
    stat: tuple[int, int]  # (st_size, st_mtime_ns) of the cache file when hashed
    seal: SealDigest
    proof: bool = True  # an unchanged stat proves unchanged bytes (see above): `Digests.fine_mtimes`, or an mtime a tick old


class Digests:
    def __init__(self, ns: Namespace, current: Callable[[int], tuple[Row, int, int] | None],
                 kernel_writes: Callable[[int], bool]) -> None:
        self.ns, self.current, self.kernel_writes_now = ns, current, kernel_writes
        self.hashed: dict[int, Hashed] = {}  # dropped at every change the namespace reports
        # the hash state of each file's first bytes, as hashed at its last seal: a seal after an append hashes only
        # the new bytes (a file fsynced every few MiB is not hashed whole each time). Forgotten by a write or truncate
        # below it; never kept for a file the kernel writes itself (passthrough: a rewrite in place is not seen)
        self.prefix: dict[int, tuple[int, Any]] = {}  # ino -> (bytes hashed, SealHash state)
        self._extending: dict[int, list[Any]] = {}  # ino -> [end, still valid] of a prefix being extended (`extend`)
        self._threads = trio.CapacityLimiter(HASHING_THREADS)
        # whether a size and mtime unchanged since a stat prove the bytes unchanged, whatever the mtime's age
        self.fine_mtimes = mtimes_change_after_stat(ns.cache.data_dir)

    def versions_held(self, ino: int, version: int) -> set[int]:
        """The sealed versions that hold the file's current bytes: `version`, and the one last hashed if its cache
        file is as it was then and that proves the bytes unchanged (a passthrough close or fsync counts a version
        without a byte changed). None at all if the cache file changed since that hash: the kernel wrote under
        passthrough, no version counted it yet."""
        h = self.hashed.get(ino)
        if h is None:
            return {version}
        try:
            st = os.stat(self.ns.cache.path(ino))
        except OSError:
            return set()
        return set() if (st.st_size, st.st_mtime_ns) != h.stat else {version, h.version} if h.proof else {version}

    def forget(self, ino: int) -> None:
        self.hashed.pop(ino, None)
        self.prefix.pop(ino, None)

    def kernel_writes(self, ino: int) -> None:
        """The kernel writes the file (passthrough): hashed whole at each seal, no prefix kept."""
        self.prefix.pop(ino, None)

    def below(self, ino: int, offset: int) -> None:
        """Bytes from `offset` on changed: a hashed prefix past it no longer holds (nor one being extended)."""
        self.hashed.pop(ino, None)
        prefix = self.prefix.get(ino)
        if prefix is not None and offset < prefix[0]:
            del self.prefix[ino]
        extending = self._extending.get(ino)
        if extending is not None and offset < extending[0]:
            extending[1] = False

    def holds(self, ino: int, version: int, seal: SealDigest) -> bool:
        """The digests `digest` gave for `version` still hold: no change reported and the cache file as it was."""
        h = self.hashed.get(ino)
        return h is not None and (h.version, h.seal) == (version, seal) and bool(self.versions_held(ino, version))

    async def extend(self, ino: int, start: int, end: int) -> None:
        """Bytes [start, end) just sent that continue the file's hashed prefix (or start it) are hashed now, so its
        seal hashes only what came after. Copy mode only: under passthrough the kernel may rewrite hashed bytes in
        place unseen, and the seal reads the whole file again."""
        if end <= start or ino in self._extending or self.kernel_writes_now(ino):
            return
        prefix = self.prefix.get(ino)
        if (prefix[0] if prefix is not None else 0) != start:
            return
        state = prefix[1] if prefix is not None else None
        path = self.ns.cache.path(ino)
        marker = self._extending[ino] = [end, True]

        def extend() -> Any:
            h = state.copy() if state is not None else SealHash()
            with open(path, "rb", buffering=0) as f:
                return h if hash_range(h, f.fileno(), start, end) == end - start else None  # shorter: truncated meanwhile

        try:
            h = await trio.to_thread.run_sync(extend, limiter=self._threads)
        except OSError:
            return
        finally:
            del self._extending[ino]
        if h is not None and marker[1] and self.prefix.get(ino) is prefix and not self.kernel_writes_now(ino):
            self.prefix[ino] = (end, h)

    async def digest(self, ino: int, version: int, size: int) -> SealDigest | None:
        """The seal digests of the file's cache copy at `version` (shared by the channels). None if the cache file is not
        that version's bytes now: it changed while hashed, or the kernel wrote more under passthrough."""
        path = self.ns.cache.path(ino)
        try:
            st = os.stat(path)
        except OSError:
            return None
        stat = (st.st_size, st.st_mtime_ns)
        if st.st_size != size:
            return None
        # taken before the hash: a write after this instant changes the mtime, unless it lands in the same coarse tick
        proof = self.fine_mtimes or time.time_ns() - st.st_mtime_ns >= MTIME_SETTLED_NS
        known = self.hashed.get(ino)
        if known is not None and (known.version, known.size, known.stat) == (version, size, stat):
            return known.seal

        prefix = self.prefix.get(ino)
        start, state = prefix if prefix is not None and prefix[0] <= size else (0, None)

        def hash_file() -> tuple[SealDigest, Any]:
            h = state.copy() if state is not None else SealHash()
            with open(path, "rb", buffering=0) as f:
                hash_range(h, f.fileno(), start, size)
            return h.digest(), h.copy()

        try:
            value, state_after = await trio.to_thread.run_sync(hash_file, limiter=self._threads)
            after = os.stat(path)
        except OSError:
            return None
        cur = self.current(ino)
        if (after.st_size, after.st_mtime_ns) != stat or cur is None or cur[1] != version or cur[2] != size:
            return None
        self.hashed[ino] = Hashed(version, size, stat, value, proof)
        if self.kernel_writes_now(ino):
            self.prefix.pop(ino, None)
        else:
            self.prefix[ino] = (size, state_after)
        return value
