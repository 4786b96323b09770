"""The bucket's side of the namespace: directory listings, cached for `metadata_ttl`.

Every node mounts the same bucket, so the tree a node shows is the bucket
listing overlaid by its own journal (see `namespace/merge.py` for who
wins). A directory is listed again when a lookup or readdir touches it and its
last listing is older than the TTL; concurrent lookups in one directory share
one listing. Before a directory is renamed or removed its whole subtree is
listed (one recursive listing), so that objects this node never looked at move
or block the removal too.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import trio

from .journal import ROOT_INODE
from .namespace import Namespace
from .store import Listing, RemoteObject, Store, StoreError

log = logging.getLogger(__name__)


class Remote:
    def __init__(self, ns: Namespace, store: Store, ttl: float) -> None:
        self.ns, self.store, self.ttl = ns, store, ttl
        self.listed_at: dict[int, float] = {}  # directory inode -> monotonic time of its last listing
        self._locks: dict[int, trio.Lock] = {}
        self.listings_total = 0
        self.listing_errors_total = 0
        # told every directory listing merged (mount-relative path, listing): the lifecycle learns protection from it
        self.on_listing: Callable[[str, Listing], None] = lambda path, listing: None

    def _fresh(self, ino: int) -> bool:
        at = self.listed_at.get(ino)
        return at is not None and time.monotonic() - at < self.ttl

    def _prefix(self, ino: int) -> str | None:
        path = self.ns.journal.path_of(ino)
        if path is None:
            return None
        return self.ns.keys.of(path + "/" if path else "")

    async def refresh(self, ino: int) -> None:
        """List directory `ino` unless its listing is fresh. A store failure keeps the last view (logged)."""
        row = self.ns.journal.get(ino)
        if row is None or not row.is_dir or self._fresh(ino):
            return
        lock = self._locks.setdefault(ino, trio.Lock())
        async with lock:
            if self._fresh(ino):
                return
            prefix = self._prefix(ino)
            if prefix is None:
                return
            started_wall, started_mono = time.time(), time.monotonic()
            try:
                listing = await trio.to_thread.run_sync(self.store.list, prefix)
            except StoreError as e:
                self.listing_errors_total += 1
                log.warning("listing %s failed, showing what this node knows: %s", prefix or "/", e)
                return
            self.listings_total += 1
            self.ns.merge.merge(ino, started_wall, listing)
            self.listed_at[ino] = started_mono
            self.on_listing(prefix[len(self.ns.keys.prefix):].rstrip("/"), listing)
        if not lock.statistics().tasks_waiting and not lock.locked():
            self._locks.pop(ino, None)

    async def refresh_tree(self, ino: int) -> None:
        """Bring every object below directory `ino` into the journal (one recursive listing)."""
        prefix = self._prefix(ino)
        if prefix is None:
            return
        started_wall, started_mono = time.time(), time.monotonic()
        try:
            listing = await trio.to_thread.run_sync(lambda: self.store.list(prefix, recursive=True))
        except StoreError as e:
            self.listing_errors_total += 1
            log.warning("listing %s failed, showing what this node knows: %s", prefix or "/", e)
            return
        self.listings_total += 1
        # split the flat listing into one listing per directory, parents first
        per_dir: dict[str, Listing] = {"": Listing([], [], listing.marker)}
        for obj in listing.objects:
            parts = obj.name.split("/")
            for depth in range(len(parts) - 1):
                parent, name = "/".join(parts[:depth]), parts[depth]
                here = per_dir.setdefault(parent, Listing([], [], False))
                if name not in here.dirs:
                    here.dirs.append(name)
                per_dir.setdefault("/".join(parts[: depth + 1]), Listing([], [], False))
            parent, name = "/".join(parts[:-1]), parts[-1]
            if name:
                per_dir[parent].objects.append(RemoteObject(name, obj.size, obj.etag, obj.mtime))
            else:
                per_dir[parent].marker = True
        base = self.ns.journal.path_of(ino)
        for rel in sorted(per_dir, key=lambda p: p.count("/") if p else -1):
            path = f"{base}/{rel}".strip("/") if rel else base
            if path is None:
                continue
            row = self.ns.journal.resolve(path)
            if row is None or not row.is_dir:
                continue  # a local change won over this part of the listing
            self.ns.merge.merge(row.ino, started_wall, per_dir[rel])
            self.listed_at[row.ino] = started_mono
            self.on_listing(path, per_dir[rel])

    async def resolve(self, path: str) -> int | None:
        """The inode at mount-relative `path`, listing each directory on the way as needed."""
        ino = ROOT_INODE
        for part in [p for p in path.split("/") if p]:
            await self.refresh(ino)
            row = self.ns.journal.lookup(ino, part)
            if row is None:
                return None
            ino = row.ino
        return ino
