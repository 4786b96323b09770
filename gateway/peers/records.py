"""Node records: what one node says of itself in the bucket, and what a reader concludes from them.

Pure logic, no store calls (membership.py reads and writes the records): the record's fields, who
is dead, and which nodes hold an owner's replicas (rendezvous hashing). Kept apart so that every
node computes the same answers from the same records: the takeover of a dead node rests on all
of them agreeing whose replicas a node holds and when a node is dead.

A record (`.ckptfs/nodes/<node>.json` under the mount's prefix, `FORMAT`) says: the node's name and
incarnation (random per daemon start), the nodes holding its replicas (`holders`: only they may claim it), its
journal id (random per cache directory: `same_journal`), the address its peer listener answers on, its failure
domain, `state` (`live`; `taken_over` once another node claimed it; `left` once it unmounted cleanly with
everything durable, or an operator removed it: nothing of it to take over), `expires_at` (wall time,
Unix seconds: renewed every ttl/3) and, once taken over, by whom (`taken_over_by` and that
node's incarnation), when, and whether the takeover finished (`takeover_done`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable

import xxhash

from ..objects import json_document

NODES_DIR = ".ckptfs/nodes/"
FORMAT = "ckptfs-node/1"
LIVE = "live"
TAKEN_OVER = "taken_over"
LEFT = "left"  # the node left the cluster with nothing undrained (a clean unmount): nobody takes it over
DOWN = "down"  # a peer's state as peers() reports it: not live (expired, taken over, or no record)


def record_path(node: str) -> str:
    """The mount-relative path of `node`'s record."""
    return f"{NODES_DIR}{node}.json"


@dataclass
class NodeRecord:
    node: str
    incarnation: str
    peer_addr: str
    failure_domain: str
    state: str  # LIVE | TAKEN_OVER | LEFT
    expires_at: float  # wall clock
    renewed_at: float
    taken_over_by: str | None = None
    taken_over_by_incarnation: str | None = None
    taken_over_at: float | None = None
    takeover_done: bool = False
    etag: str | None = field(default=None, compare=False)  # of the object it was read from or written as
    # the node's journal (journal.Journal.journal_id): its cache directory's identity. Another one under the same name is
    # another incarnation of the node that lost the first one's files. "" in a record of an earlier release.
    journal_id: str = ""
    # the nodes whose copies of this node's files count (peers/holders.py): written before a new holder's copies count,
    # so only a node listed here holds everything the node acknowledged. None in a record of an earlier release.
    holders: list[str] | None = None

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc.pop("etag")
        doc["format"] = FORMAT
        doc["expires_at_iso"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.expires_at))
        return json_document(doc)

    @classmethod
    def from_doc(cls, doc: dict[str, Any], etag: str | None) -> "NodeRecord | None":
        """The record in `doc`; None if it is not one this version can read (then nobody may act on it)."""
        try:
            if doc.get("format") != FORMAT or doc["state"] not in (LIVE, TAKEN_OVER, LEFT):
                return None
            by = doc.get("taken_over_by")
            by_inc = doc.get("taken_over_by_incarnation")
            at = doc.get("taken_over_at")
            return cls(str(doc["node"]), str(doc["incarnation"]), str(doc.get("peer_addr") or ""),
                       str(doc.get("failure_domain") or ""), doc["state"], float(doc["expires_at"]),
                       float(doc.get("renewed_at") or 0.0), None if by is None else str(by),
                       None if by_inc is None else str(by_inc), None if at is None else float(at),
                       bool(doc.get("takeover_done", False)), etag, str(doc.get("journal_id") or ""),
                       _holders(doc.get("holders")))
        except (KeyError, TypeError, ValueError):
            return None

    def claimed_by(self, node: str, incarnation: str, now: float, expires_at: float | None = None) -> "NodeRecord":
        """This record taken over by `node`: what a claim writes (If-Match on the ETag it was read with)."""
        return replace(self, state=TAKEN_OVER, taken_over_by=node, taken_over_by_incarnation=incarnation,
                       taken_over_at=now, takeover_done=False,
                       expires_at=self.expires_at if expires_at is None else expires_at, etag=None)

    def describe(self) -> str:
        if self.state == LEFT:
            return f"{self.node} (left the cluster at {time.strftime('%H:%M:%S', time.gmtime(self.renewed_at))} UTC)"
        if self.state == LIVE:
            return f"{self.node} (incarnation {self.incarnation}, until {time.strftime('%H:%M:%S', time.gmtime(self.expires_at))} UTC)"
        done = "finished" if self.takeover_done else "unfinished"
        return f"{self.node} (taken over by {self.taken_over_by}, {done})"


def _holders(value: Any) -> list[str] | None:
    if not isinstance(value, list):
        return None
    return [str(v) for v in value]


def may_claim(rec: NodeRecord, node: str) -> bool:
    """`node` may take `rec.node` over: its record lists `node` among the holders whose copies it counted, or lists
    none (a record of an earlier release, or a node that has not counted a peer's copy yet: every holder may). A
    holder it stopped sending to (its disk filled, it paused, its link broke) keeps copies older than what the owner
    acknowledged since on another: only the holders listed hold it all, and a claim by another would bring back what
    the owner deleted or renamed since."""
    return not rec.holders or node in rec.holders


def assume_renewed(rec: NodeRecord, etag: str | None, expires_at: float) -> NodeRecord:
    """`rec` as last read, its object since rewritten (`etag`) and taken for a renewal: live until `expires_at` (a ttl
    after the change was seen, by the reader's clock) unless read in full before. Its `renewed_at` stays the one read:
    a full read of the record is always the later one. (A copy with two fields set, not `dataclasses.replace`: a
    refresh makes one per other node, and replace's checks cost 9 us each, most of a refresh at 1,000 nodes.)"""
    new = NodeRecord.__new__(NodeRecord)
    new.__dict__.update(rec.__dict__)
    new.etag, new.expires_at = etag, max(rec.expires_at, expires_at)
    return new


def listed_only(node: str, etag: str | None, expires_at: float) -> NodeRecord:
    """A node this one knows only from the LIST (its name, its record's ETag): never read in full because it did not
    need it (membership.py). Taken for live until `expires_at` (a ttl after the LIST showed it written, by the LIST's
    LastModified), pushed on like a renewal while its ETag keeps changing; its incarnation, address and domain are
    unknown (empty), so it is never a target and nobody is judged by it (a claim or a listener reads the record)."""
    return NodeRecord(node, "", "", "", LIVE, expires_at, 0.0, etag=etag)


def is_listed_only(rec: NodeRecord) -> bool:
    """`listed_only`'s stand-in, not a record read: every record written has an incarnation."""
    return not rec.incarnation


def nothing_to_take_over(rec: NodeRecord) -> bool:
    """Its node's files are all in the bucket by its record: a takeover finished, or the node left the cluster."""
    return rec.state == LEFT or (rec.state == TAKEN_OVER and rec.takeover_done)


def same_journal(a: str, b: str) -> bool:
    """Two journal ids name the same journal; an empty one (a record or replica of an earlier release) matches any:
    there is nothing to tell them apart by, and that release had no other rule."""
    return not a or not b or a == b


def is_live(rec: NodeRecord | None, now: float) -> bool:
    """A node that renews its record: replicas may go to it."""
    return rec is not None and rec.state == LIVE and rec.expires_at > now


def is_dead(rec: NodeRecord, records: dict[str, NodeRecord], now: float) -> bool:
    """True if a holder of `rec.node`'s replicas may claim it now (records: the others, by node; the taker's among them).

    Dead: a live record that expired; or a takeover that did not finish whose taker is gone (its record
    expired, taken over itself, or renewed by another incarnation: a taker that restarted has forgotten
    its takeover), so that takeover can be taken over. A node taken over by itself (an owner back after a
    takeover whose taker died, reconciling its own files) renews `expires_at` meanwhile and is dead only
    when that passes. A finished takeover is not dead: there is nothing left to take over; nor is a node that left.
    """
    if rec.state == LEFT:
        return False
    if rec.state == LIVE:
        return rec.expires_at <= now
    if rec.takeover_done:
        return False
    if rec.taken_over_by == rec.node:
        return rec.expires_at <= now
    taker = records.get(rec.taken_over_by or "")
    return taker is None or not is_live(taker, now) or taker.incarnation != rec.taken_over_by_incarnation


def unclaimed_for(rec: NodeRecord, now: float) -> float:
    """Seconds since a dead node (`is_dead`) could first be claimed: its lease ran out, or its taker's claim (the
    claim was written when the taker could not yet know it would die: counted from then, a bound from below)."""
    return now - max(rec.expires_at, rec.taken_over_at or 0.0)


def is_expired(rec: NodeRecord, now: float, expiry: float) -> bool:
    """A record nobody needs any more: its node was taken over, the takeover finished (the bucket has what the node
    had), or it left the cluster, and nothing was written to it for `expiry` seconds (peer_record_expiry). A live
    record never is."""
    last = max(rec.renewed_at, rec.taken_over_at or 0.0)
    return nothing_to_take_over(rec) and now - last >= expiry


def other_domain(mine: str, theirs: str) -> bool:
    """Replicas go only to another failure domain; an empty domain differs from every other."""
    return not mine or not theirs or mine != theirs


def rendezvous_score(owner: str, candidate: str) -> int:
    return xxhash.xxh3_64_intdigest(f"{owner}\0{candidate}".encode())


def rendezvous(owner: str, candidates: Iterable[str]) -> list[str]:
    """`candidates` in the order `owner`'s replicas go to them: score xxh3_64(owner NUL candidate), highest first.

    Rendezvous (highest random weight) hashing: every node computes the same order from the names alone,
    and a node joining or leaving moves only the owners whose first choices it is.
    """
    return sorted((c for c in set(candidates) if c != owner), key=lambda c: (rendezvous_score(owner, c), c), reverse=True)
