"""How many owners one node takes replicas from: the load bound that spreads replicas over unequal failure domains.

Why: rendezvous hashing gives every owner the same odds at each candidate, so with unequal failure domains (racks
of 10, 10 and 2 nodes) a node of the small rack is a candidate for every owner of the others and piles up their
replicas: with peer_replicas = 1 its nodes held 3x the mean by the names alone, and 14x with racks of 20 and 2
(bench/peers_spread.py). Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam) caps each node
at a factor of the mean and sends the overflow down the owners' own orders. The mean needs no global knowledge here:
each owner has R holders, so a node takes R owners on average wherever every node writes; the cap is
`LOAD_FACTOR` x R. An owner that finds every candidate at its cap asks again insisting, and is taken (where the
domains cannot hold the cap, as a lone node in its own rack facing twenty owners, the spread is what rendezvous
gives, never a single-copy write). An owner a node already holds replicas of, or that already sends to it, is
always taken: a reconnect never moves anyone.
"""

from __future__ import annotations

import math
from typing import Collection

LOAD_FACTOR = 2.0  # a node takes at most this many times the mean number of owners (R) before redirecting new ones


def owner_cap(replicas: int) -> int:
    """The owners a node takes before it redirects new ones: LOAD_FACTOR x R, at least 1."""
    return max(1, math.ceil(LOAD_FACTOR * replicas))


def redirect(owner: str, connected: Collection[str], held: Collection[str], replicas: int, insist: bool,
             understood: bool) -> str | None:
    """Why `owner`, asking to send replicas, is sent to its next candidate (None: taken). `connected`: the owners
    that send to this node now; `held`: those it holds replicas of; `understood`: the owner knows a redirect (an
    owner of an earlier release is always taken)."""
    if insist or not understood or owner in held:
        return None
    others = [o for o in connected if o != owner]
    cap = owner_cap(replicas)
    if len(others) < cap:
        return None
    return (f"this node takes replicas from {len(others)} owners already (at most {cap}: {LOAD_FACTOR:g} x "
            "peer_replicas): send to your next candidate first")
