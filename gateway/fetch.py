"""Bring back the local copy of a durable file whose cache copy was evicted.

The cache evicts clean copies to make room for new checkpoints; a later open
of such a file downloads it again, checks the bytes against the xxh3-128
recorded when it was uploaded, and only then serves it. A mismatch is EIO
for the reader, never wrong bytes.
"""

from __future__ import annotations

import errno
import logging
import os

import trio

from .namespace import Namespace
from .store import Store, StoreError

log = logging.getLogger(__name__)


class Fetcher:
    def __init__(self, ns: Namespace, store: Store) -> None:
        self.ns = ns
        self.store = store
        self._locks: dict[int, trio.Lock] = {}
        self.fetched_bytes_total = 0
        self.checksum_mismatches_total = 0

    async def ensure_local(self, ino: int) -> None:
        lock = self._locks.setdefault(ino, trio.Lock())
        try:
            async with lock:
                if self.ns.needs_fetch(ino):
                    await self._fetch(ino)
        finally:
            if not lock.statistics().tasks_waiting:
                self._locks.pop(ino, None)

    async def _fetch(self, ino: int) -> None:
        row = self.ns.row(ino)
        if not row.remote_key:
            raise OSError(errno.EIO, "no object to fetch")
        self.ns.make_room(row.size)
        final = self.ns.cache.path(ino)
        tmp = f"{final}.fetch"
        try:
            digest, size, _etag = await trio.to_thread.run_sync(self.store.download, row.remote_key, tmp)
        except StoreError as e:
            self.ns.cache.grow(row.size, 0)
            _unlink(tmp)
            log.error("fetching %s failed: %s", row.remote_key, e)
            raise OSError(errno.EIO, str(e)) from None
        if size != row.size or (row.xxh3 and digest != row.xxh3):
            self.ns.cache.grow(row.size, 0)
            _unlink(tmp)
            self.checksum_mismatches_total += 1
            log.error("object %s does not match what was uploaded (size %d vs %d, xxh3 %s vs %s): refusing to serve it",
                      row.remote_key, size, row.size, digest, row.xxh3)
            raise OSError(errno.EIO, "object changed behind ckptfs's back")
        os.replace(tmp, final)
        self.fetched_bytes_total += size
        self.ns.fetched(ino)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
