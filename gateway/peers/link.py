"""PeerLink: the owner's side of one connection to a peer (a placeholder with the design's API until the
transport's branch is merged; peers-transport owns this module and replaces it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class PeerError(Exception):
    """Connection lost, timed out, handshake refused (message: one line)."""


class PeerFull(PeerError):
    """peer_capacity reached on the peer: try the next candidate."""


class SealMismatch(PeerError):
    """The peer's xxh3 of the replica differs: send the whole file again."""


@dataclass
class Held:
    """What a peer holds of one of our files."""

    ino: int
    version: int
    size: int
    sealed: bool
    xxh3: str | None


class PeerLink:
    node: str

    @classmethod
    async def open(cls, cfg: Any, me: str, incarnation: str, node: str, addr: str, secret: bytes) -> "PeerLink":
        raise PeerError("the peer transport is not built yet")

    async def holdings(self) -> dict[int, Held]:
        raise NotImplementedError

    async def entry(self, ino: int, meta: dict[str, Any]) -> None:
        raise NotImplementedError

    async def write(self, ino: int, fd: int, offset: int, length: int) -> None:
        raise NotImplementedError

    async def truncate(self, ino: int, size: int) -> None:
        raise NotImplementedError

    async def seal(self, ino: int, version: int, size: int, xxh3: str) -> None:
        raise NotImplementedError

    async def forget(self, ino: int, version: int | None) -> None:
        raise NotImplementedError

    async def delete(self, op_id: int, key: str, seq: int) -> None:
        raise NotImplementedError

    async def delete_done(self, op_id: int) -> None:
        raise NotImplementedError

    async def barrier(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError
