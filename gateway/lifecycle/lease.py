"""A lease in the bucket: one object saying which node (its node_name and pid) may run a job until when.

Used so that one node at a time runs a bucket-wide job on a schedule
(retention today; replication will take another name). Key:
`.ckptfs/leases/<name>.json` under the mount's prefix (ckptfs's own, hidden
from the mount). The body records `name`, `holder` (`node`, `pid`, a random
`token` per Lease object), `taken_at`, `renewed_at`, `expires_at` (Unix time)
and `ttl`.

Every change is a conditional write, so two nodes never both hold it:

* a free lease (no object) is taken with `If-None-Match: *`;
* the holder renews it with `If-Match` on the ETag it last wrote;
* an expired one (`expires_at` in the past) is taken over with `If-Match` on
  the ETag that was read, so of two nodes taking it over at once one wins;
* release writes it back expired (`If-Match`), free for anyone at once.

A write that loses answers 412 and the loser reads who holds it. The holder
trusts its lease only until `ttl - margin` after the *start* of the request
that renewed it, measured on its own monotonic clock (`valid()`); takeovers
compare `expires_at` with the taker's wall clock, so the nodes' clocks must
agree to within `margin` (NTP does far better). The job checks `valid()`
before each irreversible step, and renews in the background meanwhile
(`keep`).

The methods are blocking (store calls): run them in a worker thread.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import trio

from ..objects import PRECONDITION, StoreError, json_document
from ..storeapi import LifecycleStore, read_json
from .manifest import now_iso

log = logging.getLogger(__name__)

LEASE_DIR = ".ckptfs/leases/"


@dataclass
class Holder:
    node: str
    pid: int
    token: str
    taken_at: float
    renewed_at: float
    expires_at: float

    def describe(self) -> str:
        return f"{self.node} (pid {self.pid}) until {now_iso(self.expires_at)}"


class Lease:
    def __init__(self, store: LifecycleStore, key: str, name: str, ttl: float, margin: float | None = None, *,
                 node: str, pid: int | None = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        if ttl <= 0:
            raise ValueError("a lease needs a positive ttl")
        self.store, self.key, self.name, self.ttl = store, key, name, ttl
        self.margin = ttl / 4 if margin is None else margin
        self.node = node  # peering.node_name_of(cfg)
        self.pid = os.getpid() if pid is None else pid
        self.token = uuid.uuid4().hex
        self.clock, self.monotonic = clock, monotonic
        self._etag: str | None = None  # of the object we last wrote while holding it
        self._taken_at = 0.0
        self._valid_until = 0.0  # monotonic
        self.takes_total = 0  # times this object took the lease (free or expired)

    @classmethod
    def for_mount(cls, store: LifecycleStore, key_of: Callable[[str], str], name: str, ttl: float, **kw: Any) -> "Lease":
        """The lease `name` of a mount: `key_of` is the mount's keys.of (path -> object key)."""
        return cls(store, key_of(f"{LEASE_DIR}{name}.json"), name, ttl, **kw)

    # ------------------------------------------------------------------ state
    def valid(self) -> bool:
        """True while this node may act as the holder (renewed recently enough, by its own clock)."""
        return self._etag is not None and self.monotonic() < self._valid_until

    def read(self) -> tuple[Holder | None, str | None]:
        """(holder in the bucket or None if free or unreadable, ETag or None if there is no object)."""
        doc, etag = read_json(self.store, self.key)
        if doc is None:
            return None, None
        try:
            h = doc["holder"]
            holder = Holder(str(h["node"]), int(h["pid"]), str(h["token"]), float(doc["taken_at"]), float(doc["renewed_at"]),
                            float(doc["expires_at"]))
        except (ValueError, KeyError, TypeError):
            log.warning("lease %s: %s is not readable; treating it as expired", self.name, self.key)
            return None, etag
        return holder, etag

    def _body(self, expires_at: float, now: float) -> bytes:
        doc = {"format": "ckptfs-lease/1", "name": self.name, "ttl": self.ttl,
               "holder": {"node": self.node, "pid": self.pid, "token": self.token},
               "taken_at": self._taken_at, "renewed_at": now, "expires_at": expires_at, "expires_at_iso": now_iso(expires_at)}
        return json_document(doc)

    def _write(self, if_none_match: bool, if_match: str | None, taking: bool) -> bool:
        started = self.monotonic()
        now = self.clock()
        if taking:
            self._taken_at = now
        try:
            etag = self.store.put_bytes(self.key, self._body(now + self.ttl, now), if_none_match=if_none_match, if_match=if_match)
        except StoreError as e:
            if e.kind == PRECONDITION:
                self._lost()
                return False
            raise
        self._etag = etag
        self._valid_until = started + self.ttl - self.margin
        if taking:
            self.takes_total += 1
        return True

    def _lost(self) -> None:
        if self._etag is not None:
            log.warning("lease %s: lost (another node wrote it)", self.name)
        self._etag = None
        self._valid_until = 0.0

    # ---------------------------------------------------------------- changes
    def acquire(self) -> bool:
        """Take the lease if it is free or expired, renew it if we hold it; True if we hold it now."""
        if self._etag is not None:
            if self._write(False, self._etag, taking=False):
                return True
            # our ETag is stale: someone else wrote it; look below
        holder, etag = self.read()
        if etag is None:
            return self._write(True, None, taking=True)
        if holder is not None and holder.token == self.token:
            # we wrote it but lost track of the ETag (a reply lost after the write): carry on from what is there
            self._taken_at = holder.taken_at
            return self._write(False, etag, taking=False)
        if holder is not None and holder.expires_at > self.clock():
            return False
        if holder is not None:
            log.info("lease %s: taking over from %s, expired", self.name, holder.describe())
        return self._write(False, etag, taking=True)

    def release(self) -> None:
        """Give the lease up now (written back expired, so another node may take it at once)."""
        if self._etag is None:
            return
        etag, self._etag, self._valid_until = self._etag, None, 0.0
        now = self.clock()
        try:
            self.store.put_bytes(self.key, self._body(0.0, now), if_match=etag)
        except StoreError as e:
            if e.kind != PRECONDITION:
                raise  # PRECONDITION: someone took it over meanwhile: nothing to give up

    def holder(self) -> Holder | None:
        """Who holds it now (None if free or expired)."""
        holder, _ = self.read()
        if holder is None or holder.expires_at <= self.clock():
            return None
        return holder


async def keep(lease: Lease, io: Callable[..., Awaitable[Any]], cancel: trio.CancelScope) -> None:
    """Renew `lease` every ttl/3 while the caller works; cancel `cancel` if it is lost or cannot be renewed in time.

    `io` runs a blocking call in a worker thread (Lifecycle.io). Run it in a
    nursery next to the work and cancel it when the work is done.
    """
    while True:
        await trio.sleep(lease.ttl / 3)
        try:
            held = await io(lease.acquire)
        except StoreError as e:
            log.warning("lease %s: could not renew (%s)", lease.name, e)
            held = lease.valid()
        if not held or not lease.valid():
            log.warning("lease %s: no longer held: stopping the work it guards", lease.name)
            cancel.cancel()
            return


@asynccontextmanager
async def kept(lease: Lease, io: Callable[..., Awaitable[Any]]) -> AsyncIterator[None]:
    """Run the body while `lease` (already acquired) is renewed beside it (`keep`); a lost lease cancels the body,
    and the block then ends without an error, as if the work were done."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep, lease, io, nursery.cancel_scope)
        yield
        nursery.cancel_scope.cancel()
