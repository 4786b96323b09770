"""The audit log: one object per event under `.ckptfs/audit/` (below the mount's prefix).

One object per event, written with `If-None-Match: *` under a name made of
the time, the node and a random part, so events from many nodes never
overwrite each other and a plain S3 listing reads them in time order:
`.ckptfs/audit/2026/11/23/20261123T150919.123456Z-node1-3f2a9c1b.json`.
The directory is ckptfs's own (hidden from the mount).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..objects import json_document
from ..peering import node_name_of
from .manifest import now_iso
from .context import Context

AUDIT_DIR = ".ckptfs/audit/"


async def record(lc: Context, action: str, path: str, who: dict[str, Any], reason: str, **details: Any) -> dict[str, Any]:
    now = time.time()
    event = {"action": action, "path": path, "reason": reason, "who": who, "node": node_name_of(lc.cfg), "at": now, "at_iso": now_iso(now),
             **details}
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int((now % 1) * 1e6):06d}Z"
    day = time.strftime("%Y/%m/%d", time.gmtime(now))
    key = lc.keys.of(f"{AUDIT_DIR}{day}/{stamp}-{node_name_of(lc.cfg)}-{uuid.uuid4().hex[:8]}.json")
    await lc.io(lambda: lc.store.put_bytes(key, json_document(event), if_none_match=True))
    return event


async def read(lc: Context, path: str = "") -> list[dict[str, Any]]:
    """Every audit event (about checkpoints at or under `path`), oldest first."""
    prefix = lc.keys.of(AUDIT_DIR)
    listing = await lc.io(lambda: lc.store.list(prefix, recursive=True))
    events = []
    for o in sorted(listing.objects, key=lambda o: o.name.rsplit("/", 1)[-1]):
        body, _ = await lc.io(lc.store.get_bytes, prefix + o.name)
        try:
            event = json.loads(body)
        except ValueError:
            continue
        p = str(event.get("path", ""))
        if not path or p == path or p.startswith(path + "/"):
            events.append(event)
    return events
