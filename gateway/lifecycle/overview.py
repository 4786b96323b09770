"""What the catalogue page (ui/) shows: the catalogue with each checkpoint's cost and retention verdict.

The page asks the daemon for `{"cmd": "catalogue", "path": ...}` over the control socket (or,
served by the daemon itself, through the same dispatch). The entries are those of
`ckptfs checkpoints --json` (`Lifecycle.scan`, one code path); beside each one the page needs
what other commands compute from the same entries: the monthly storage cost (`usage.cost`, the
model of `ckptfs usage`), the retention plan's verdict (`retention.plan`, what
`ckptfs retention plan` prints) and the bucket's drill record (`drill.read_record`). One walk
of the bucket answers all of it. With `"files": true` and a checkpoint's path, the answer is its
manifest's file list instead (names, sizes, xxh3, ETags): the page's third level, one read of one
object. Nothing here changes the bucket.
"""

from __future__ import annotations

from typing import Any

from ..storageclass import parse_prices
from . import drill, retention
from .context import Context
from .manifest import LifecycleError
from .usage import cost

FILE_FIELDS = ("path", "size", "xxh3", "etag")  # what the page shows of a manifest's file


async def overview(lc: Context, path: str, with_files: bool = False) -> dict[str, Any]:
    """The `catalogue` command's answer for mount-relative `path`."""
    if with_files:
        return await files(lc, path)
    scope = retention.series_scope(lc.patterns, path)
    entries = [dict(e) for e in await lc.scan(scope)]  # the whole series: retention judges a checkpoint within it
    # (copies: scan keeps the mount-wide list for the metrics, which need none of what is added below)
    decisions = {d.path: d.to_json() for d in retention.plan(entries, lc.cfg)}
    if scope != path:
        entries = [e for e in entries if e["path"] == path or e["path"].startswith(path + "/")]
    prices = parse_prices(lc.cfg.storage_prices)
    for e in entries:
        e["monthly_cost"] = round(cost(prices, e.get("storage_classes") or {}), 6)
        e["retention_plan"] = decisions.get(e["path"])
    return {
        "path": path,
        "checkpoints": entries,
        "retention_policy": retention.policy_enabled(lc.cfg),
        "prices": prices,
        "drills": await drill.read_record(lc),
    }


async def files(lc: Context, path: str) -> dict[str, Any]:
    """A committed checkpoint's files, as its manifest lists them (none before it is committed)."""
    ck = lc.patterns.checkpoint_of(path)
    if ck is None or ck.path != path:
        raise LifecycleError(f"{path or '/'} is not a checkpoint directory (checkpoint_patterns): give the checkpoint's path")
    manifest = await lc.catalogue.manifest(ck)
    return {"path": path, "committed": manifest is not None,
            "files": [{k: f.get(k) for k in FILE_FIELDS} for f in (manifest.files if manifest else [])]}
