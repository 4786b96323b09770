"""Which records a refresh reads that nobody asked for: the first candidates this node may send to (issue 44).

Why: a node needs in full only the records of the peers it may send to (their addresses and domains), of the owners
whose replicas it holds, and of a few others (membership.py's `interest`); every other record it knows from the LIST
alone (`records.listed_only`). The peers it sends to are the first live ones of another failure domain in its
rendezvous order, and the names alone give that order: so a refresh walks it and reads the records it has not read
until `want` live ones of another domain are known, passing over the ones it cannot use (`excluded`: peers whose
connection failed, which the sender skips). A cluster started all at once then costs each node a few GETs (its first
candidates, and each later arrival that ranks above them: about want x ln(N) in all), not one GET per node: N x
(R + spares) GETs instead of N^2, which at 1,000 nodes kept S3 throttling GETs for minutes (bench/peers_scale.py).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .records import NodeRecord, is_listed_only, is_live, other_domain, rendezvous_score

SPARES = 2  # candidates known beyond peer_replicas: a channel that fails moves on without waiting for a refresh


class RendezvousOrder:
    """`records.rendezvous(me, names)`, with each name's score kept: a refresh asks every ttl/3 and the set of nodes
    seldom changes, so the order is sorted again only when it did, and a score is hashed once per name."""

    def __init__(self, me: str) -> None:
        self.me = me
        self._scores: dict[str, int] = {}
        self._names: frozenset[str] = frozenset()
        self._order: list[str] = []

    def of(self, names: Iterable[str]) -> list[str]:
        current = frozenset(names) - {self.me}
        if current != self._names:
            self._scores = {n: self._scores[n] if n in self._scores else rendezvous_score(self.me, n) for n in current}
            scores = self._scores
            self._order = sorted(current, key=lambda c: (scores[c], c), reverse=True)
            self._names = current
        return self._order


def to_read(order: list[str], records: Mapping[str, NodeRecord], domain: str, now: float, want: int,
            excluded: set[str], reading: set[str]) -> list[str]:
    """The nodes known only from the LIST, in `order`, whose records to read now so that `want` live targets of
    another domain than `domain` are known (`reading`: read this round anyway, counted as if they will be; the next
    round passes over one that was not live or shares our domain). Empty once enough are known."""
    known = pending = 0
    out: list[str] = []
    for node in order:
        if known + pending >= want:
            break
        rec = records.get(node)
        if rec is None or node in excluded:
            continue
        if node in reading:
            pending += 1
        elif not is_live(rec, now):
            continue
        elif is_listed_only(rec):
            out.append(node)
            pending += 1
        elif other_domain(domain, rec.failure_domain):
            known += 1
    return out
