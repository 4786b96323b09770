"""A stand-in for the peers' replica store (peers/replicas.py, the design's signatures) for unit tests of the takeover
and the sweep: the replicas as a listener would have left them on disk, placed by the test. Never proof the product
works: the SeaweedFS tests with real daemons are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import xxhash



@dataclass
class ReplicaEntry:
    owner: str
    ino: int
    key: str
    version: int
    size: int
    sealed: bool
    xxh3: str | None
    copy_from: str | None
    marker: bool
    seq: int
    mtime: float
    checkpoint: str | None
    path: str


@dataclass
class ReplicaDelete:
    owner: str
    op_id: int
    key: str
    seq: int


class FakeReplicaStore:
    """Replica files in `cache_dir/peers/<owner>/<ino>`, their index in memory."""

    def __init__(self, cache_dir: str) -> None:
        self.root = Path(cache_dir) / "peers"
        self._entries: dict[str, dict[int, ReplicaEntry]] = {}
        self._deletes: dict[str, dict[int, ReplicaDelete]] = {}

    # ------------------------------------------------ what a listener would do
    def hold(self, owner: str, ino: int, key: str, data: bytes, *, seq: int, mtime: float, sealed: bool = True,
             marker: bool = False, copy_from: str | None = None, checkpoint: str | None = None, xxh3: str | None = None) -> ReplicaEntry:
        folder = self.root / owner
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / str(ino)
        path.write_bytes(data)
        digest = xxh3 if xxh3 is not None else (xxhash.xxh3_128_hexdigest(data) if sealed else None)
        entry = ReplicaEntry(owner, ino, key, 1, len(data), sealed, digest, copy_from, marker, seq, mtime, checkpoint, str(path))
        self._entries.setdefault(owner, {})[ino] = entry
        return entry

    def hold_delete(self, owner: str, op_id: int, key: str, seq: int) -> None:
        self._deletes.setdefault(owner, {})[op_id] = ReplicaDelete(owner, op_id, key, seq)

    # ------------------------------------------------ the design's API
    def owners(self) -> list[str]:
        return sorted(o for o in set(self._entries) | set(self._deletes) if self._entries.get(o) or self._deletes.get(o))

    def entries(self, owner: str) -> list[ReplicaEntry]:
        return sorted(self._entries.get(owner, {}).values(), key=lambda e: e.seq)

    def deletes(self, owner: str) -> list[ReplicaDelete]:
        return sorted(self._deletes.get(owner, {}).values(), key=lambda d: d.seq)

    def held_bytes(self, owner: str | None = None) -> int:
        owners = [owner] if owner is not None else list(self._entries)
        return sum(e.size for o in owners for e in self._entries.get(o, {}).values())

    def verify(self, entry: ReplicaEntry) -> bool:
        return xxhash.xxh3_128_hexdigest(Path(entry.path).read_bytes()) == entry.xxh3

    def drop(self, owner: str, ino: int) -> None:
        entry = self._entries.get(owner, {}).pop(ino, None)
        if entry is not None:
            Path(entry.path).unlink(missing_ok=True)

    def drop_delete(self, owner: str, op_id: int) -> None:
        self._deletes.get(owner, {}).pop(op_id, None)

    def drop_owner(self, owner: str) -> None:
        for ino in list(self._entries.get(owner, {})):
            self.drop(owner, ino)
        self._entries.pop(owner, None)
        self._deletes.pop(owner, None)
        folder = self.root / owner
        if folder.is_dir() and not os.listdir(folder):
            folder.rmdir()
