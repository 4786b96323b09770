"""Replicas placed in a real ReplicaStore (gateway/peers/replicas.py) as the listener leaves them after an owner's
frames (the entry, the bytes, the seal), for unit tests of the takeover and the sweep without a connection."""

from __future__ import annotations

import os
from typing import Any

import xxhash

from ckptfs.peers.replicas import ReplicaEntry, ReplicaStore


def replica_store(cfg: Any, cache_dir: str) -> ReplicaStore:
    os.makedirs(cache_dir, exist_ok=True)  # the daemon's cache directory exists before its replica store
    return ReplicaStore(cfg, cache_dir)


def hold(replicas: ReplicaStore, owner: str, ino: int, key: str, data: bytes, *, seq: int, mtime: float, sealed: bool = True,
         marker: bool = False, copy_from: str | None = None, checkpoint: str | None = None, xxh3: str | None = None,
         size: int | None = None) -> ReplicaEntry:
    """One file of `owner` held here: its entry, its bytes (none for a renamed durable file, `copy_from`), sealed with
    their xxh3-128 (or `xxh3`) unless `sealed` is False (never acknowledged)."""
    length = len(data) if size is None else size
    replicas.put_entry(owner, ino, {"key": key, "version": 1, "size": length, "copy_from": copy_from, "marker": marker,
                                    "seq": seq, "mtime": mtime, "checkpoint": checkpoint})
    if copy_from is None:
        fd = replicas.reserve(owner, ino, len(data))
        os.pwrite(fd, data, 0)
        replicas.wrote(owner, ino, 0)
    if sealed:
        replicas.seal(owner, ino, 1, length, xxh3 or xxhash.xxh3_128_hexdigest(data))
    entry = replicas.entry(owner, ino)
    assert entry is not None
    return entry


def hold_delete(replicas: ReplicaStore, owner: str, op_id: int, key: str, seq: int, after_ino: int | None = None) -> None:
    """A delete `owner` queued; `after_ino`: the file it waits for (a rename's old key)."""
    replicas.add_delete(owner, op_id, key, seq, after_ino)
