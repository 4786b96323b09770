"""The drain's writes as a fence: each upload conditional on the object this node last saw at the key.

Why: with `durability = peer` a node's writes can outlive its lease. A PutObject of v1 held up in the network (or a
node paused between its lease check and its request) can land after a taker uploaded v2 from a replica, and the
bucket would go back to v1 (issue 42, case 7). The lease check before each request bounds when a request starts,
never when it lands; only the store can refuse a write that comes too late. So the drain sends each PutObject and
CompleteMultipartUpload with `If-Match` on the ETag its journal last recorded at that key (its own last upload, or
what a listing showed), or `If-None-Match: *` when it knows of none. A taker's newer object fails the condition.

A refusal (412) is judged by `publishing.after_refusal`: the same bytes are durable already; this file's own newer
version (a taker's) is a conflict, left alone; anything else was another node's write, which the last writer
replaces, under a condition on the ETag judged now. Only when the mount found that the store honours conditions
(`conditional_writes`, probed by the peers at start); otherwise, and without peers, writes go unconditional as before.

Deletes likewise: a delete is queued with the ETag of the object it removes (`Journal.queue_delete`), and sent with
`If-Match` on it where the store honours that (`conditional_deletes`: SeaweedFS does; probed apart, as not every
store that fences writes fences deletes). A key another node (or a taker) wrote since keeps that object.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import trio

from .journal import OWN_OBJECT_ONLY, Journal
from .namespace import UploadTicket
from .objects import NO_OBJECT, PRECONDITION, StoreError
from .publishing import CONFLICT, DURABLE, Provenance, after_refusal, delete_own_stale_version
from .storeapi import ObjectStore
from .upload import file_digests, head_or_none

log = logging.getLogger(__name__)


class DrainFence:
    def __init__(self, store: ObjectStore, journal: Journal, node: str, enabled: Callable[[], bool] | None = None,
                 key_of: Callable[[str], str] = lambda path: path) -> None:
        self.store, self.journal, self.node, self.key_of = store, journal, node, key_of
        # whether writes go conditional (the daemon: the peers' probe said the store refuses a stale write)
        self.enabled: Callable[[], bool] = enabled or (lambda: False)
        self.refusals_total = 0  # writes the store refused: the key changed since this node saw it
        self.conflicts_total = 0  # of those, the ones left alone: this file's own newer version was there
        # whether deletes go conditional (the daemon: the peers' probe found the store refuses a stale delete)
        self.deletes_enabled: Callable[[], bool] = lambda: False
        self.deletes_refused_total = 0  # deletes not done: the key held another object than the one deleted

    def condition(self, ino: int, key: str) -> dict[str, Any]:
        """The condition of a write of inode `ino` at `key`: on what this node last saw there ({}: unconditional)."""
        if not self.enabled():
            return {}
        row = self.journal.get(ino)
        if row is not None and row.etag and row.remote_key == key:
            return {"if_match": row.etag}
        return {"if_none_match": True}

    def deleter(self, delete_id: int) -> Callable[[str], None]:
        """The request of a queued delete: conditional on the object it was queued for, when the store honours
        conditional deletes and the journal knows that object's ETag. A key another node wrote since is left to it
        (the delete was for an object that is gone already): done, not retried."""
        queued_for = self.journal.delete_etag(delete_id)
        if queued_for == OWN_OBJECT_ONLY:  # whatever a takeover made of a file removed or renamed while away
            return self._delete_if_own
        etag = queued_for if self.deletes_enabled() else None
        if etag is None:
            return self.store.delete

        def delete_if_still(key: str) -> None:
            try:
                self.store.delete_if_match(key, etag)
            except StoreError as e:
                if e.kind == NO_OBJECT:
                    return
                if e.kind != PRECONDITION:
                    raise
                if self._delete_own_stale_version(key):
                    return
                self.deletes_refused_total += 1
                log.info("delete of %s not done: the key holds another object than the one this node deleted (written "
                         "since, by another node or a takeover); it stays", key)
        return delete_if_still

    def _delete_if_own(self, key: str) -> None:
        if not self._delete_own_stale_version(key):
            log.info("delete of %s not done: the key holds no version of this node's own file (nothing a takeover "
                     "made of it, or another node's object): it stays", key)

    def _delete_own_stale_version(self, key: str) -> bool:
        """In the delete's worker thread, after its condition failed: the object at `key` now is another version of a
        file of this node's that no longer lives there (publishing.own_stale_version: uploaded for it by a takeover
        while it was away, whose ETag the journal never saw): deleted too, If-Match that ETag. True when the key is
        done with (deleted, or gone meanwhile)."""
        def lives_at_key(ino: int) -> bool:  # asked of the journal on the trio thread, which owns it
            def ask() -> bool:
                path = self.journal.path_of(ino)  # None: removed (or never this journal's)
                return path is not None and self.key_of(path) == key
            return bool(trio.from_thread.run_sync(ask))

        return delete_own_stale_version(self.store, key, self.node, self.journal.journal_id, lives_at_key)  # type: ignore[arg-type]

    async def rejudge(self, ticket: UploadTicket, fd: int) -> tuple[dict[str, Any] | None, tuple[str, str] | None]:
        """After a refused write: (the condition to write again under, None) or (None, (etag, xxh3)) when the bytes
        are there already. Raises StoreError(PRECONDITION) when the write must not happen (retried later, by then
        behind a fence that holds: a node taken over reconciles instead)."""
        self.refusals_total += 1
        info = await head_or_none(self.store, ticket.key)
        xxh3 = (await trio.to_thread.run_sync(functools.partial(file_digests, fd, ticket.size, max(ticket.size, 1))))[0]
        mine = Provenance(self.node, self.journal.journal_id, ticket.ino, ticket.version)
        verdict = after_refusal(mine, ticket.size, xxh3, info)
        log.info("upload of %s refused by the store (the key changed since this node saw it): %s", ticket.key, verdict.why)
        if verdict.action == DURABLE and info is not None:
            return None, (info.etag, xxh3)
        if verdict.action == CONFLICT:
            self.conflicts_total += 1
            raise StoreError(PRECONDITION, f"{ticket.key} not uploaded: {verdict.why}")
        if verdict.if_match is not None:
            return {"if_match": verdict.if_match}, None
        return {"if_none_match": True}, None

