"""What a lifecycle job needs from the object that runs it, as a protocol.

The jobs (catalogue, verify, protect, retention, drill, tiers, usage, the tracker and the cold
mover) each take the daemon's lifecycle as their first argument, and `service.Lifecycle`
imports all of them to hold them together. Typing that argument as `Lifecycle` made every job
import the module that imports it; typing it as this protocol keeps the arrows pointing down:
`service` sits above the jobs, and this module below them, naming only what lives lower still
(config, store, namespace, remote, patterns, manifest, lease) and, for the parts of the lifecycle
one job asks of another (the catalogue, the tracker, the mover), the few methods it calls.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol

import trio

from ..config import Config
from ..namespace import Namespace
from ..namespace.keys import Keys
from ..patterns import Checkpoint, Patterns
from ..remote import Remote
from ..storeapi import LifecycleStore
from .lease import Lease
from .manifest import Manifest

Progress = Callable[[dict[str, Any]], Awaitable[None]]


class Catalogued(Protocol):
    """The bucket's checkpoints (catalogue.Catalogue)."""

    async def find(self, path: str) -> list[Checkpoint]: ...

    async def manifest(self, ck: Checkpoint) -> Manifest | None: ...

    def set_protected(self, path: str, info: dict[str, Any] | None) -> None: ...


class LocalWork(Protocol):
    """Checkpoints with work on this node (tracker.Tracker)."""

    work: dict[str, str]
    commits_total: int
    commit_errors_total: int

    def local_state(self, path: str) -> str | None: ...

    def local_checkpoints(self) -> list[Checkpoint]: ...


class ColdRecords(Protocol):
    """Checkpoints moved to the cold target (coldmove.Mover)."""

    async def record(self, path: str) -> tuple[dict[str, Any] | None, str | None]: ...

    async def verify(self, ck: Checkpoint, deep: bool, progress: Progress, target: str | None = None) -> dict[str, Any]: ...

    async def delete_cold(self, path: str, rec: dict[str, Any]) -> int: ...


class Refusals(Protocol):
    """The guard fs.py asks before a change (protect.Guard), as the metrics see it."""

    refused_total: int


class Bucket(Protocol):
    """A bucket as verify and drills read it: the mount's own (the lifecycle), or a cold target (copier.TargetView)."""

    cfg: Config
    store: LifecycleStore
    keys: Keys
    last_verify: dict[str, Any] | None

    async def io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking store call in a worker thread."""
        ...


class Context(Bucket, Protocol):
    """The lifecycle as its jobs use it (service.Lifecycle is the one implementation)."""

    patterns: Patterns
    ns: Namespace
    remote: Remote
    retention_lock: trio.Lock
    retention_lease: Lease | None
    retention_stats: dict[str, Any]
    drill_record: dict[str, Any]
    drills_total: dict[str, int]
    tag_errors_total: int
    summary: dict[str, Any]
    on_commit: list[Callable[[str], None]]

    @property
    def catalogue(self) -> Catalogued: ...

    @property
    def tracker(self) -> LocalWork: ...

    @property
    def mover(self) -> ColdRecords: ...

    @property
    def guard(self) -> Refusals: ...

    async def scan(self, path: str) -> list[dict[str, Any]]:
        """The catalogue's entries at or under `path` (a walk of the bucket)."""
        ...
