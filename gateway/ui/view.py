"""What a page shows, from the daemon's `catalogue` answer: runs, a filtered, sorted page of
checkpoints, one checkpoint's tables and the commands a user would paste next. Pure functions:
no I/O, so 10,000 checkpoints under a run cost one pass over a list per page, whatever the bucket."""

from __future__ import annotations

import calendar
import json
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..sizes import fmt_bytes
from ..storageclass import fmt_money

STATES = ("writing", "draining", "replicated", "committed", "protected", "expiring")
SORT_KEYS = ("step", "path", "state", "bytes", "files", "committed", "cost", "verified")
PER_PAGE = 50
MAX_PER_PAGE = 500
HIDDEN = "(hidden)"
# a value under such a key is never shown, wherever a job or a record put it (metadata, move records)
SECRET_KEY = re.compile(r"secret|password|passwd|token|credential|access.?key|private.?key|sse.?c|customer.?key", re.I)


def run_of(path: str) -> str:
    """The run a checkpoint belongs to: the directory holding it (`/` at the mount's top)."""
    return path.rsplit("/", 1)[0] if "/" in path else "/"


def redact(value: Any) -> Any:
    """`value` with whatever sits under a secret-looking key replaced: the page shows no credential."""
    if isinstance(value, Mapping):
        return {k: HIDDEN if SECRET_KEY.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def to_int(value: str | None) -> int | None:
    try:
        return int(str(value).strip()) if value not in (None, "") else None
    except ValueError:
        return None


@dataclass
class Query:
    """A checkpoints page's filters, order and page, from its query string (bad values are ignored)."""

    run: str | None = None
    states: list[str] = field(default_factory=list)
    step_min: int | None = None
    step_max: int | None = None
    protected: str = ""  # "" | yes | no
    tier: str = ""
    text: str = ""
    sort: str = "step"
    desc: bool = True
    page: int = 1
    per: int = PER_PAGE

    @classmethod
    def parse(cls, args: Mapping[str, list[str]]) -> "Query":
        one = lambda k: (args.get(k) or [""])[-1]  # noqa: E731
        sort = one("sort")
        return cls(
            run=one("run") or None,
            states=[s for s in args.get("state", []) if s in STATES],
            step_min=to_int(one("step_min")), step_max=to_int(one("step_max")),
            protected=one("protected") if one("protected") in ("yes", "no") else "",
            tier=one("tier"), text=one("q").strip(),
            sort=sort if sort in SORT_KEYS else "step", desc=one("order") != "asc",
            page=max(1, to_int(one("page")) or 1), per=min(MAX_PER_PAGE, max(1, to_int(one("per")) or PER_PAGE)),
        )

    def matches(self, e: Mapping[str, Any]) -> bool:
        if self.run is not None and run_of(e["path"]) != self.run:
            return False
        if self.states and e["state"] not in self.states:
            return False
        if self.step_min is not None and e["step"] < self.step_min:
            return False
        if self.step_max is not None and e["step"] > self.step_max:
            return False
        if self.protected and bool(e.get("protected")) != (self.protected == "yes"):
            return False
        if self.tier and e.get("storage_class") != self.tier:
            return False
        return not self.text or self.text.lower() in e["path"].lower()


def _sort_key(name: str) -> Any:
    verified = lambda e: (e.get("last_verify") or {}).get("at") or 0.0  # noqa: E731
    return {
        "step": lambda e: (e["step"], e["path"]), "path": lambda e: e["path"], "state": lambda e: (e["state"], e["step"]),
        "bytes": lambda e: e.get("bytes") or 0, "files": lambda e: e.get("files") or 0,
        "committed": lambda e: e.get("committed_at") or 0.0, "cost": lambda e: e.get("monthly_cost") or 0.0,
        "verified": verified,
    }[name]


@dataclass
class Page:
    rows: list[dict[str, Any]]
    total: int  # checkpoints that pass the filters
    page: int
    pages: int
    tiers: list[str]  # the storage classes present, for the tier filter


def select(entries: list[dict[str, Any]], q: Query) -> Page:
    """The checkpoints that pass `q`'s filters, sorted, and the page of them `q` asks for."""
    tiers = sorted({str(e.get("storage_class")) for e in entries if e.get("storage_class")})
    hits = sorted((e for e in entries if q.matches(e)), key=_sort_key(q.sort), reverse=q.desc)
    pages = max(1, -(-len(hits) // q.per))
    page = min(q.page, pages)
    return Page(hits[(page - 1) * q.per: page * q.per], len(hits), page, pages, tiers)


def runs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run: how many checkpoints in which state, their bytes and monthly cost, the newest step."""
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        r = out.setdefault(run_of(e["path"]), {"run": run_of(e["path"]), "checkpoints": 0, "bytes": 0, "monthly_cost": 0.0,
                                                "states": {}, "latest_step": None, "latest_commit": None})
        r["checkpoints"] += 1
        r["bytes"] += e.get("bytes") or 0
        r["monthly_cost"] += e.get("monthly_cost") or 0.0
        r["states"][e["state"]] = r["states"].get(e["state"], 0) + 1
        if r["latest_step"] is None or e["step"] > r["latest_step"]:
            r["latest_step"] = e["step"]
        if e.get("committed_at") and (r["latest_commit"] or 0) < e["committed_at"]:
            r["latest_commit"] = e["committed_at"]
    return sorted(out.values(), key=lambda r: r["run"])


def verdict(e: Mapping[str, Any], policy: bool) -> str:
    """The retention plan's word on a checkpoint, as `ckptfs retention plan` would say it."""
    d = e.get("retention_plan")
    if e["state"] == "expiring":
        return f"expiring: deleted after {(e.get('retention') or {}).get('delete_after_iso', '?')}"
    if not policy:
        return "kept: no retention rule is set"
    if not d:
        return "-"
    if d["action"] == "keep":
        return f"kept by {', '.join(d.get('rules') or []) or d.get('reason', '?')}"
    when = d.get("delete_after_iso")
    return f"to expire ({d.get('reason', '')})" + (f", deleted after {when}" if when else "")


def next_commands(mount: str, e: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(what it does, the command) a user would paste next for this checkpoint."""
    here = shlex.quote(f"{mount.rstrip('/')}/{e['path']}")
    out = [("read it into the local cache", f"ckptfs warmup {here}"),
           ("restore it into a scratch directory and verify it", f"ckptfs drill {here}"),
           ("check it against its manifest, reading every byte", f"ckptfs verify --deep {here}")]
    if e.get("protected"):
        out.append(("lift its protection", f"ckptfs unprotect {here} --reason '...'"))
    elif e.get("committed"):
        out.append(("keep it: no mount may change or delete it", f"ckptfs protect {here} --reason '...'"))
    if e["state"] == "expiring":
        out.append(("keep it after all", f"ckptfs retention restore {here}"))
    if (e.get("moved") or {}).get("state") == "moved":
        out.append(("bring it back from the cold target", f"ckptfs restore {here}"))
    return out


def metadata_rows(metadata: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """The manifest's metadata as (key, value) rows, nested objects as dotted keys, secrets hidden."""
    rows: list[tuple[str, str]] = []
    for k, v in sorted(redact(metadata).items()):
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            rows += metadata_rows(v, key + ".")
        else:
            rows.append((key, v if isinstance(v, str) else json.dumps(v, sort_keys=True)))
    return rows


def _seconds(record: Mapping[str, Any]) -> float:
    """When a record happened, as epoch seconds: its `at`, or its `at_iso` (`2026-11-27T12:35:05.360255Z`)."""
    at = record.get("at")
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return float(at)
    iso = str(record.get("at_iso") or "")
    try:
        whole, _, frac = iso.rstrip("Z").partition(".")
        return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + (float(f"0.{frac}") if frac.isdigit() else 0.0)
    except ValueError:
        return 0.0


def history(e: Mapping[str, Any], drills: Mapping[str, Any], events: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """A checkpoint's history, oldest first as `ckptfs audit` prints it: (when, what) for its last verify, the
    bucket's drill records that name it, and its audit events. One list sorted by time, shown in one format
    (`when`): three sources recorded time in two formats, and a table grouped by source read out of order."""
    out: list[tuple[float, str]] = []
    verified = e.get("last_verify")
    if verified:
        out.append((_seconds(verified), f"verify{' (deep)' if verified.get('deep') else ''}: {verified.get('outcome', '?')}"))
    for kind, d in sorted(drills.items()):
        if isinstance(d, Mapping):
            extra = f", verify {d['verify']}" if d.get("verify") else ""
            out.append((_seconds(d), f"drill ({kind.replace('_', ' ')}): {d.get('outcome', '?')}{extra}"))
    for ev in events:
        who = (ev.get("who") or {}).get("user") or "?"
        out.append((_seconds(ev), f"{ev.get('action', '?')} by {who} on {ev.get('node', '?')}: {ev.get('reason', '')}"))
    return sorted(out, key=lambda row: row[0])


def when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if ts else "-"


FILTERS = {"fmt_bytes": lambda n: fmt_bytes(n or 0), "when": when, "money": fmt_money}
