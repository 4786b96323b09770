"""Whose replicas are whose: a node's identity is its name, its journal id and its incarnation (docs/peers.md).

Why it is more than the name: a node that comes back under its name with an empty cache (a replaced disk, a
rescheduled pod with an emptyDir, a reimaged host) has a new journal that lists none of the files its peers hold
for the old one; and a node paused past its lease and claimed, then resumed, still sends. So:

* the new incarnation waits for its predecessor's takeover before it writes its record (`wait_for_predecessor`,
  called by `Membership.announce`);
* a holder takes replicas only from the incarnation whose record is live in the bucket (`Owners`, asked by the
  listener at each connection, with a GET, and at each frame, by the records as last read): an owner without a
  record could never be taken over, and a claimed incarnation's bytes would be dropped by the takeover that claimed
  it; refused, the owner's seal fails and its write is not counted as replicated.
"""

from __future__ import annotations

import logging
from typing import Any

from ..objects import StoreError
from ..peering import PeerOptionError
from .records import LEFT, LIVE, NodeRecord, is_dead, is_live, same_journal

log = logging.getLogger(__name__)


def stamp(rec: NodeRecord) -> float:
    """When a record was last written (a renewal, a claim): of two reads of one record, the later one."""
    return max(rec.renewed_at, rec.taken_over_at or 0.0)


def refusal(rec: NodeRecord | None, incarnation: str, journal: str) -> str | None:
    """Why replicas from `incarnation` (journal `journal`) of `rec`'s node are refused by that record; None: taken."""
    if rec is None:
        return "it has no node record in the bucket"
    if rec.incarnation != incarnation or not same_journal(rec.journal_id, journal):
        return (f"its record names another incarnation ({rec.incarnation}, journal {rec.journal_id[:8] or '-'}), "
                f"not {incarnation} (journal {journal[:8] or '-'})")
    if rec.state == LEFT:
        return "it left the cluster (a clean unmount, or an operator removed it)"
    if rec.state != LIVE:
        return f"this incarnation was taken over by {rec.taken_over_by}"
    return None


class Owners:
    """The listener's judge of which owners' frames this node keeps, from the membership's records."""

    def __init__(self, membership: Any) -> None:  # membership.Membership (it imports this module)
        self.m = membership
        self.admitted: dict[str, str] = {}  # owner -> the incarnation whose replicas the listener last admitted

    def remember(self, rec: NodeRecord) -> None:
        """A record read for a connection: the membership's view takes it if it is the later read."""
        old = self.m._records.get(rec.node)
        if rec.node != self.m.me and (old is None or stamp(rec) >= stamp(old)):
            self.m._records[rec.node] = rec

    def owner_refused(self, node: str, incarnation: str, journal: str, admitted: NodeRecord | None = None) -> str | None:
        """Why this node must refuse `node`'s frames now, None if it may keep them: by the records as last read (no
        store call; `admitted`: the record a connection was admitted by; the later of the two counts)."""
        rec = self.m._records.get(node)
        if admitted is not None and (rec is None or stamp(admitted) > stamp(rec)):
            rec = admitted
        return refusal(rec, incarnation, journal)

    async def admit_owner(self, node: str, incarnation: str, journal: str) -> tuple[str | None, NodeRecord | None]:
        """At a connection from `node`: its record read now (one GET), then judged. (why refused or None, the record
        read). A record that cannot be read now is judged by the last one read."""
        try:
            rec = await self.m._read(node)
        except StoreError as e:
            why = self.owner_refused(node, incarnation, journal)
            return (None if why is None else f"{why}; its record cannot be read now ({e})"), None
        if rec is None:
            self.m._records.pop(node, None)
            return "it has no node record in the bucket (its announce failed, or it was never written)", None
        self.remember(rec)
        why = self.owner_refused(node, incarnation, journal, rec)
        if why is None:
            self.admitted[node] = incarnation
        return why, rec


async def refuse_live_duplicate(m: Any, rec: NodeRecord) -> None:  # m: membership.Membership
    """At mount: `rec`, our name with another journal, is live. If a daemon answers as this name at the address it
    announces (`m.answers_as_me`), it is not a predecessor that died but another mount given the same node_name:
    PeerOptionError, the mount refused with one line. Otherwise (nothing answers: the predecessor's host is gone)
    the record is waited for as a predecessor's."""
    probe = getattr(m, "answers_as_me", None)
    if probe is None or not is_live(rec, m.clock()) or not rec.peer_addr:
        return
    if await probe(rec.peer_addr):
        raise PeerOptionError(f"node_name = {m.me} is taken: a live node answers as {m.me} at {rec.peer_addr} (another "
                              f"cache directory, journal {rec.journal_id[:8] or '-'}); give each mount its own node_name")


def wait_for_predecessor(m: Any, rec: NodeRecord) -> bool:  # m: membership.Membership
    """`rec` (our name, another journal) was not taken over to the end: True while this incarnation must wait for
    its holders to take it over (its record left as it is: they claim it when its lease runs out). False once it is
    dead and nobody claimed it for 2 x ttl: no live node held its replicas (or it had none), and the name would
    otherwise stay unusable."""
    now = m.clock()
    records = m._with_own()
    records.pop(m.me, None)
    dead_for = now - max(rec.expires_at, rec.taken_over_at or 0.0)
    if is_dead(rec, records, now) and dead_for >= 2 * m.ttl:
        # the replacement path of a node that had nothing undrained: a warning, not an error (issue 43). What it had
        # undrained, if anything, was on holders that are down too: CkptfsPeerTakeoverOverdue said so meanwhile
        log.warning("node %s: its predecessor under this name (journal %s, %s) was not taken over within 2 x "
                    "peer_lease_ttl: no live node holds copies of its files (it had nothing undrained, or its holders "
                    "are down too); its record is written over", m.me, rec.journal_id, rec.describe())
        return False
    if m.waiting_for is None or now - m._warned_predecessor >= m.ttl:
        m._warned_predecessor = now
        log.warning("node %s: the bucket's record for this name belongs to another cache directory (journal %s, %s): "
                    "a predecessor whose files its peers may hold. Waiting for them to take it over before announcing "
                    "(this node's writes count no peer copies meanwhile)", m.me, rec.journal_id, rec.describe())
    m.waiting_for = rec
    m._notify()
    return True
