"""The digests a seal carries: xxh3-128 and BLAKE3 of a file's bytes, taken in one pass (docs/peers.md).

Why two: the xxh3-128 is what the bucket's metadata holds (`upload.XXH3_META`), what a HEAD compares and what the
drain computes anyway; it is fast, and not cryptographic (its stripes accumulate under a public secret, so an edit
can be compensated). A replica is what a takeover uploads and a reconcile accepts: if bytes altered on the wire
passed the seal, whoever loads the checkpoint (a pickle) runs the alterer's code. The seal frame is MACed, so an
unkeyed cryptographic digest in it is enough: the holder's BLAKE3 of what it wrote must equal the owner's, and a
takeover checks it again from the disk before it uploads. BLAKE3 costs about 0.15 s of CPU per GiB here, once on
each side; both digests are fed from the same buffer, so the file is read once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import xxhash
from blake3 import blake3


class SealDigest(NamedTuple):
    xxh3: str  # xxh3-128, hex: the bucket's
    blake3: str  # BLAKE3-256, hex: the replica's integrity


class SealHash:
    """An xxh3-128 and a BLAKE3 fed together (as `upload.hash_range` feeds any hash: `update`)."""

    __slots__ = ("_x", "_b")

    def __init__(self, x: Any = None, b: Any = None) -> None:
        self._x = xxhash.xxh3_128() if x is None else x
        self._b = blake3() if b is None else b

    def update(self, data: Any) -> None:
        self._x.update(data)
        self._b.update(data)

    def copy(self) -> "SealHash":
        return SealHash(self._x.copy(), self._b.copy())

    def digest(self) -> SealDigest:
        return SealDigest(self._x.hexdigest(), self._b.hexdigest())


def seal_digest(data: bytes) -> SealDigest:
    h = SealHash()
    h.update(data)
    return h.digest()
