"""A node that leaves the cluster: by itself at a clean unmount, or removed by an operator (docs/peers.md).

Why a state of its own: a node that stops renewing its record looks dead, so every other node lists it `down`,
`ckptfs_peer_up` says 0 for it, `CkptfsPeerDown` fires, and a holder of its replicas claims it and takes it over,
for a node that was unmounted on purpose with everything in the bucket. Its record saying `left` (records.LEFT)
tells them there is nothing to take over: nobody claims it (`records.is_dead`), the holders drop its replicas (the
sweep), the others list it `left` and count it in no alert, and the sweep deletes the record after
`peer_record_expiry` like a finished takeover's. The node mounted again writes its record live over it.

A node leaves only with nothing undrained (no dirty file, no pending delete or marker): its holders' copies are
then only stale. Otherwise it lets its lease run out as a crash would, and a holder takes it over if it does not
come back, the only safe answer while the bucket lacks what the peers hold.

`remove_node` is the operator's command for a node that will not come back (`ckptfs remove-node`): its record
says `left` now rather than `taken_over` for `peer_record_expiry`. It refuses a live node, and one whose takeover
has not finished (its holders may have files the bucket lacks), unless forced.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from .records import LEFT, LIVE, TAKEN_OVER, is_live

log = logging.getLogger(__name__)


class RemoveRefused(Exception):
    """`remove_node` would lose what only the node's peers hold, or the node is live: one line saying why."""


async def leave(m: Any) -> bool:  # m: membership.Membership (it is below this module's callers, not above)
    """This node's record `left`, If-Match on what it last wrote; the renewals stop. False (nothing written) if the
    node is fenced, waiting for a predecessor, or its record changed under it: it then expires as a crash would."""
    async with m._own_lock:
        own = m._own
        if own is None or m._fenced or own.state != LIVE or own.incarnation != m.incarnation:
            return False
        now = m.clock()
        written = await m._write(replace(own, state=LEFT, expires_at=now, renewed_at=now, etag=None), own.etag)
        if written is None:
            return False
        m._own = None  # renew() writes nothing more: this incarnation is gone from the cluster
        m._valid_until = 0.0
        m._notify()
    log.info("node %s left the cluster (record %s says left): nobody takes it over; mounted again, it rejoins",
             m.me, m.key_of(f".ckptfs/nodes/{m.me}.json"))
    return True


async def remove_node(m: Any, node: str, force: bool) -> str:
    """`node`'s record written `left` (If-Match), so that it is listed as such, alerts on it stop and the sweep
    deletes the record after peer_record_expiry. What was done, in one line; RemoveRefused if it may not be."""
    if node == m.me:
        raise RemoveRefused(f"{node} is this node: unmount it instead (`ckptfs unmount` leaves the cluster)")
    rec = await m._read(node)
    if rec is None:
        raise RemoveRefused(f"no node {node} in the node records (`ckptfs status` lists the nodes)")
    now = m.clock()
    if rec.state == LEFT:
        return f"node {node} already left the cluster"
    if is_live(rec, now):
        raise RemoveRefused(f"node {node} is live (it renewed its record): unmount it there (`ckptfs unmount` leaves the "
                            "cluster), or stop its daemon and wait peer_lease_ttl")
    unfinished = not (rec.state == TAKEN_OVER and rec.takeover_done)
    if unfinished and not force:
        what = (f"its takeover by {rec.taken_over_by} has not finished" if rec.state == TAKEN_OVER
                else "nobody has taken it over yet")
        raise RemoveRefused(f"node {node} is down and {what}: its peers may hold files the bucket lacks. Wait for the "
                            "takeover (its state becomes taken_over), or give --force to give those files up")
    written = await m._write(replace(rec, state=LEFT, renewed_at=now, etag=None), rec.etag)
    if written is None:
        raise RemoveRefused(f"node {node}'s record changed while it was judged (a claim, or the node came back): run it again")
    m._records[node] = written
    log.warning("node %s removed from the cluster by an operator%s", node, " (forced: its unfinished takeover is given up)"
                if unfinished else "")
    return f"node {node} removed: its record says left; the sweep deletes it after peer_record_expiry"
