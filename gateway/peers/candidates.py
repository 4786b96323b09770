"""What a refresh reads in full: the records it needs, and the first candidates this node may send to (issue 44).

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

from typing import Awaitable, Callable, Iterable, Mapping

import trio

from ..objects import StoreError
from .records import NodeRecord, is_listed_only, is_live, other_domain, rendezvous_score

SPARES = 2  # candidates known beyond peer_replicas: a channel that fails moves on without waiting for a refresh
PARALLEL_GETS = 16  # records read at once by a refresh
CANDIDATE_ROUNDS = 4  # batches of candidates a refresh reads at most (the next refresh goes on)
READ_ERRORS_TOLERATED = 3  # failed GETs after which a refresh stops asking (the store is failing, not one request)

Read = Callable[[str], Awaitable["NodeRecord | None"]]


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


async def read_into(read: Read, last: Mapping[str, NodeRecord], seen: dict[str, NodeRecord], assumed: set[str],
                    changed: list[str], order_of: Callable[[Iterable[str]], list[str]], domain: str, want: int,
                    excluded: set[str], now: float) -> list[StoreError]:
    """Read `changed` and the candidates `to_read` names into `seen` (the refresh's new view; `last`: the one before),
    round after round until `want` are known (a candidate read may share our domain or be down: the next one is read
    then). A record read is no longer `assumed`; one that could not be read keeps its last view; one gone leaves
    `seen`. The errors met (the refresh raises the first)."""
    reading = list(changed)
    for _ in range(CANDIDATE_ROUNDS):
        batch = reading + to_read(order_of(seen), seen, domain, now, want, excluded, set(reading))
        if not batch:
            return []
        got, errors = await read_records(read, batch)
        assumed.difference_update(got)  # read in full now
        for node in batch:
            if node in got:
                rec = got[node]
                if rec is not None and rec.node == node:
                    seen[node] = rec
                else:
                    seen.pop(node, None)
            elif node not in seen and (old := last.get(node)) is not None:
                seen[node] = old  # not read (an error): its last view
        if errors:
            return errors
        reading = []
    return []


async def read_records(read: Read, nodes: list[str],
                       limit: int = PARALLEL_GETS) -> tuple[dict[str, NodeRecord | None], list[StoreError]]:
    """Each of `nodes`' records (`read`), at most `limit` GETs at once: a refresh that found many records changed
    takes a few round trips, not one per record (999 records at 20 ms each would outlast the ttl/3 between refreshes).
    (the records read, the errors met): one failed GET in a thousand does not lose the other 999."""
    out: dict[str, NodeRecord | None] = {}
    gets = trio.CapacityLimiter(limit)
    errors: list[StoreError] = []

    async def one(node: str) -> None:
        async with gets:
            if len(errors) >= READ_ERRORS_TOLERATED:
                return  # a failing store: no more requests into it (what was not read keeps its last view)
            try:
                out[node] = await read(node)
            except StoreError as e:
                errors.append(e)

    async with trio.open_nursery() as nursery:
        for node in nodes:
            nursery.start_soon(one, node)
    return out, errors
