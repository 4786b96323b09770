"""What the bucket holds under a mount and what it costs: `ckptfs usage`, and the storage metrics.

`usage` lists every object under a path once (recursive listing: sizes and storage classes)
and the catalogue (checkpoints and their states), and sums bytes and objects per checkpoint,
per run (the directory holding the checkpoints), per state and per storage class. Objects
outside checkpoints (other files, ckptfs's audit log) count under the state `none`. A checkpoint moved to
a cold target (coldmove.py) counts its manifest's files under the class `moved:NAME`, with the bytes they
take there (`bytes`, `stored_bytes`: compressed, cold_compression) and before (`original_bytes`); each
checkpoint and that class say both, and what compression saved. The
monthly cost estimate multiplies the bytes of each class by `storage_prices` (per GiB-month,
examples by default, not quotes); it leaves out requests, retrievals, minimum storage durations
and minimum object sizes. On a versioned bucket the noncurrent versions under the path (what deletes
and overwrites left behind, billed all the same) are counted apart (`noncurrent`) and their cost is
in the estimate.

The metrics (`UsageCollector`) come from the catalogue walk the lifecycle already makes every
`SCAN_SECONDS` (checkpoint objects only; the scrape makes no request). Every metric is in docs/metrics.md.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .catalogue import STATES
from .manifest import stored_bytes
from ..storageclass import class_label, parse_prices
from .tiers import versioning_status
from .context import Context

GiB = float(1 << 30)
NONE = "none"  # objects outside any checkpoint


def price_of(prices: dict[str, float], storage_class: str) -> float:
    return prices.get(storage_class, prices.get("STANDARD", 0.0))


def cost(prices: dict[str, float], by_class_bytes: dict[str, int]) -> float:
    return sum(size / GiB * price_of(prices, cls) for cls, size in by_class_bytes.items())


def _add(d: dict[str, dict[str, Any]], key: str, size: int, n: int = 1) -> dict[str, Any]:
    e = d.setdefault(key, {"bytes": 0, "objects": 0})
    e["bytes"] += size
    e["objects"] += n
    return e


def _add_stored(d: dict[str, dict[str, Any]], key: str, size: int, n: int = 1, original: int | None = None) -> dict[str, Any]:
    """_add, and what those bytes are before compression (`original`, default the same) and what compression saved."""
    e = _add(d, key, size, n)
    e["stored_bytes"] = e.get("stored_bytes", 0) + size
    e["original_bytes"] = e.get("original_bytes", 0) + (size if original is None else original)
    e["saved_bytes"] = e["original_bytes"] - e["stored_bytes"]
    return e


def _checkpoint(per_ck: dict[str, dict[str, Any]], entry: dict[str, Any]) -> dict[str, Any]:
    return per_ck.setdefault(entry["path"], {"path": entry["path"], "step": entry["step"], "state": entry["state"], "bytes": 0,
                                             "objects": 0, "stored_bytes": 0, "original_bytes": 0, "by_class": {}})


def summarize(path: str, objects: list[tuple[str, int, str]], checkpoints: list[dict[str, Any]], patterns: Any,
              prices: dict[str, float]) -> dict[str, Any]:
    """`objects`: (mount-relative path, size, storage class); `checkpoints`: catalogue entries (describe)."""
    cks = {e["path"]: e for e in checkpoints}
    per_ck: dict[str, dict[str, Any]] = {}
    by_run: dict[str, dict[str, Any]] = {}
    by_state: dict[str, dict[str, Any]] = {s: {"bytes": 0, "objects": 0} for s in (*STATES, NONE)}
    by_class: dict[str, dict[str, Any]] = {}
    total = count = saved = 0
    for rel, size, cls in objects:
        total += size
        count += 1
        _add_stored(by_class, cls, size)
        ck = patterns.checkpoint_of(rel)
        entry = cks.get(ck.path) if ck is not None else None
        if entry is None:
            _add(by_state, NONE, size)
            continue
        _add(by_state, entry["state"], size)
        run = entry["path"].rsplit("/", 1)[0] if "/" in entry["path"] else "/"
        r = _add(by_run, run, size)
        r.setdefault("checkpoints", set()).add(entry["path"])
        c = _checkpoint(per_ck, entry)
        c["bytes"] += size
        c["stored_bytes"] += size
        c["original_bytes"] += size
        c["objects"] += 1
        c["by_class"][cls] = c["by_class"].get(cls, 0) + size
    for entry in checkpoints:  # moved to a cold target (coldmove.py): its files count there, under the class moved:NAME
        rec = entry.get("moved") or {}
        if rec.get("state") != "moved":
            continue
        # billed: what the cold target stores (compressed: cold_compression); saved: what compression took off its files
        cls, size, n, original = f"moved:{rec.get('target')}", stored_bytes(rec), int(rec.get("files") or 0), int(rec.get("bytes") or 0)
        total += size
        count += n
        saved += original - size
        _add_stored(by_class, cls, size, n, original)
        _add(by_state, entry["state"], size, n)
        run = entry["path"].rsplit("/", 1)[0] if "/" in entry["path"] else "/"
        _add(by_run, run, size, n).setdefault("checkpoints", set()).add(entry["path"])
        c = _checkpoint(per_ck, entry)
        c["bytes"] += size
        c["stored_bytes"] += size
        c["original_bytes"] += original
        c["objects"] += n
        c["by_class"][cls] = c["by_class"].get(cls, 0) + size
    for c in per_ck.values():
        c["saved_bytes"] = c["original_bytes"] - c["stored_bytes"]
        c["storage_class"] = class_label(c["by_class"])
        c["monthly_cost"] = round(cost(prices, c["by_class"]), 4)
    for run, r in by_run.items():
        r["checkpoints"] = len(r["checkpoints"])
        r["monthly_cost"] = round(sum(c["monthly_cost"] for c in per_ck.values()
                                      if (c["path"].rsplit("/", 1)[0] if "/" in c["path"] else "/") == run), 4)
    for cls, e in by_class.items():
        e["price_per_gib_month"] = price_of(prices, cls)
        e["monthly_cost"] = round(e["bytes"] / GiB * e["price_per_gib_month"], 4)
    return {
        "path": path or "/",
        "bytes": total,
        "saved_bytes": saved,
        "objects": count,
        "by_checkpoint": sorted(per_ck.values(), key=lambda c: (c["path"].rsplit("/", 1)[0] if "/" in c["path"] else "", c["step"], c["path"])),
        "by_run": dict(sorted(by_run.items())),
        "by_state": by_state,
        "by_class": dict(sorted(by_class.items())),
        "monthly_cost_estimate": round(sum(e["monthly_cost"] for e in by_class.values()), 4),
        "prices_note": "storage only, from storage_prices (per GiB-month; the defaults are examples, not quotes)",
    }


def add_noncurrent(summary: dict[str, Any], versioning: str, nc: Any, prices: dict[str, float]) -> dict[str, Any]:
    """Count what a versioned bucket still stores besides the current objects: it is billed like them."""
    monthly = round(cost(prices, nc.by_class), 4)
    summary["versioning"] = versioning
    summary["noncurrent"] = {"objects": nc.objects, "bytes": nc.bytes, "delete_markers": nc.delete_markers,
                             "by_class": dict(sorted(nc.by_class.items())), "monthly_cost": monthly}
    summary["monthly_cost_estimate"] = round(summary["monthly_cost_estimate"] + monthly, 4)
    return summary


async def usage(lc: Context, path: str) -> dict[str, Any]:
    base = lc.keys.of(path + "/" if path else "")
    listing = await lc.io(lambda: lc.store.list(base, recursive=True))
    rel0 = f"{path}/" if path else ""
    objects = [(rel0 + o.name, o.size, o.storage_class) for o in listing.objects]
    checkpoints = await lc.scan(path)
    prices = parse_prices(lc.cfg.storage_prices)
    summary = summarize(path, objects, checkpoints, lc.patterns, prices)
    versioning = await versioning_status(lc)
    if versioning:
        summary = add_noncurrent(summary, versioning, await lc.io(lc.store.noncurrent, base), prices)
    return summary


class UsageCollector(Collector):
    """Storage and cost metrics from the last catalogue walk (checkpoint objects)."""

    def __init__(self, lc: Context) -> None:
        self.lc = lc
        self.prices = parse_prices(lc.cfg.storage_prices)

    def collect(self):  # type: ignore[no-untyped-def]
        entries = getattr(self.lc, "entries", [])
        # STANDARD in every state always has a series (0 until seen), so dashboards and alerts have one to read
        size: dict[tuple[str, str], int] = {("STANDARD", state): 0 for state in STATES}
        by_class: dict[str, int] = {"STANDARD": 0}
        for e in entries:
            for cls, n in (e.get("storage_classes") or {}).items():
                size[(cls, e["state"])] = size.get((cls, e["state"]), 0) + n
                by_class[cls] = by_class.get(cls, 0) + n
        g = GaugeMetricFamily("ckptfs_storage_bytes", "Bytes of checkpoint objects in the bucket under the mount, by storage class and "
                              "checkpoint state (from the last catalogue walk).", labels=["storage_class", "state"])
        for (cls, state), n in sorted(size.items()):
            g.add_metric([cls, state], float(n))
        yield g
        saved: dict[tuple[str, str], int] = {}
        for e in entries:
            if (e.get("moved") or {}).get("state") == "moved":
                key = (e["storage_class"], e["state"])
                saved[key] = saved.get(key, 0) + int(e.get("original_bytes", 0)) - int(e.get("stored_bytes", 0))
        g = GaugeMetricFamily("ckptfs_storage_saved_bytes", "Bytes that compression on the cold target (cold_compression) saves: "
                              "the moved checkpoints' files less what they take there, by storage class and state.",
                              labels=["storage_class", "state"])
        for (cls, state), n in sorted(saved.items()):
            g.add_metric([cls, state], float(n))
        yield g
        g = GaugeMetricFamily("ckptfs_storage_monthly_cost_estimate", "Estimated monthly storage cost of those bytes, by storage "
                              "class, from storage_prices (examples by default, not quotes).", labels=["storage_class"])
        for cls, n in sorted(by_class.items()):
            g.add_metric([cls], n / GiB * price_of(self.prices, cls))
        yield g
        c = CounterMetricFamily("ckptfs_checkpoint_tag_errors", "Checkpoint objects ckptfs could not tag (lifecycle rules may skip them).")
        c.add_metric([], float(self.lc.tag_errors_total))
        yield c
