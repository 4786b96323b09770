"""Which peers' copies of this node's files count: the holders its record lists, written before a new one counts.

Why: the sender streams to R peers; one that stops taking this node's changes (its disk filled, it paused past
`peer_timeout`, its link broke) is replaced by the next candidate, which is sent every file not yet durable again.
From then on the old holder's copies are older than what the new one holds: a delete or a rename sent since, a
newer version. Were both to hold replicas of a dead owner, whichever won the claim would take it over with what it
alone holds, and the old one would bring back a file deleted since (issue 42: the peers campaign, seed 396681806
episode 73, a full holder). So the owner's record names the holders it sends to, and only they may claim it
(records.may_claim).

* The record is rewritten (a renewal, If-Match) once a new holder's channel is ready, and that holder's seals count
  only once the bucket has the record listing it (Sender.sealed_on): a copy that counts is always on a node that may
  claim.
* A holder whose channel failed stays listed until another is: until then it holds the most of what the owner
  acknowledged (what was acknowledged meanwhile was single-copy: degraded, counted and logged, or refused).
* A restart with the same journal keeps the list its previous incarnation wrote (their replicas are the same).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

import trio

from ..objects import StoreError
from .records import LIVE, NodeRecord

log = logging.getLogger(__name__)


class HolderListing:
    def __init__(self, membership: Any) -> None:
        self.membership = membership
        self.wanted: list[str] = []  # what every write of our record lists
        self._asked = trio.Event()
        self.on_listed: Callable[[], None] = lambda: None  # the sender's notify: fsyncs waiting for a count look again

    def listed(self) -> frozenset[str]:
        """The holders our record in the bucket lists, as this incarnation last wrote it: only their copies count."""
        m = self.membership
        own = m.record_of(m.me)
        if own is None or own.incarnation != m.incarnation or own.state != LIVE or own.holders is None:
            return frozenset()
        return frozenset(own.holders)

    def ask(self, nodes: Iterable[str]) -> None:
        """List exactly `nodes` (the sender's ready channels), written now."""
        wanted = sorted(set(nodes))
        if wanted != self.wanted or set(wanted) != self.listed():
            self.wanted = wanted
            self._asked.set()

    def keep(self, rec: NodeRecord | None) -> None:
        """The list a previous incarnation with our journal wrote (`rec`, read at start): what it counted is held there."""
        if rec is not None and rec.holders and rec.journal_id and rec.journal_id == self.membership.journal_id and not self.wanted:
            self.wanted = sorted(rec.holders)

    async def run(self) -> None:
        """Write the record each time the list asked for is not the one in the bucket."""
        m = self.membership
        while True:
            await self._asked.wait()
            self._asked = trio.Event()
            if set(self.wanted) == self.listed() or m.copies_uncounted() is not None:
                continue  # listed already; or no record of ours to write (its renewal writes the list when there is)
            try:
                await m.renew()
            except StoreError as e:
                wait = m.ttl / 6
                log.warning("node %s: could not write its record listing its holders %s (%s): again in %.1fs; their "
                            "copies do not count meanwhile", m.me, ", ".join(self.wanted) or "-", e, wait)
                await trio.sleep(wait)
                self._asked.set()
                continue
            if set(self.wanted) == self.listed():
                log.info("node %s: its record lists its holders %s", m.me, ", ".join(self.wanted) or "-")
            self.on_listed()
