"""Retention: which checkpoints to keep, and a two-phase, audited deletion of the others.

Rules (a union: a checkpoint is kept if any rule keeps it), applied to the
committed checkpoints of each directory of checkpoints (`run7/step_*` and
`run8/step_*` are two series):

* `retention_keep_last` N: the N highest steps;
* `retention_keep_every_steps` K: steps that are multiples of K;
* `retention_keep_every_seconds` T: the oldest, then each first one committed
  at least T after the last one kept (by first commit time);
* protected checkpoints, always.

Never deleted, whatever the rules: the newest committed checkpoint of a
series, a checkpoint not committed (no manifest: being written, or written
without ckptfs), one with local work on this node (open, dirty, draining),
one with a multipart upload in progress or an object newer than its
manifest (another node writing into it), one committed less than
`retention_min_age` ago, one restored with `ckptfs retention restore`, and any
checkpoint unless a newer committed one of its series passed verify (shallow
at least, of its current manifest generation): `apply` runs a shallow verify
of the newest committed checkpoint first when none is recorded, and deletes
nothing older than it if it is not whole. With every keep rule off (the
default), nothing is deleted.

Deletion is two-phase. `apply` first marks a checkpoint *expiring*
(`<checkpoint>/.ckptfs-retention.json`, `{"state": "expiring", ...}`, written
with If-None-Match); it stays readable and `ckptfs retention restore` takes it
back (the mark becomes `{"state": "restored"}`: retention keeps it from then
on). A later `apply`, once `retention_grace` has passed and the rules still
let it go, deletes every object under the checkpoint's prefix (files, dir
markers, ckptfs's own objects), the mark and the directory key last, so an interrupted deletion is
finished by the next run. Each step (expire, restore, delete, and undoing an
expiry when a rule keeps it again) is one audit event.

`plan` is pure (entries as the catalogue describes them in, decisions out);
`apply` and `restore` act on the bucket through `store.py`.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from ..peering import node_name_of
from ..config import Config
from ..objects import NO_OBJECT, PRECONDITION, StoreError, json_document
from . import audit, place
from .catalogue import LOCAL_STATES
from .lease import Lease, kept
from .manifest import MOVED, PROTECTED, RETENTION, LifecycleError, is_own, now_iso, read_json
from ..patterns import Checkpoint, Patterns
from .verify import verify
from .context import Context

log = logging.getLogger(__name__)

LEASE_NAME = "retention"
DELETES_AT_ONCE = 16


@dataclass
class Decision:
    path: str
    step: int
    state: str
    action: str  # keep | delete
    reason: str
    rules: list[str] = field(default_factory=list)  # keep rules that keep it (last, every-steps, every-seconds, protected)
    phase: str = ""  # for delete: expire (mark it now) | wait (expiring, grace not over) | remove (grace over: delete now)
    delete_after: float | None = None
    needs_verify: str | None = None  # the newer checkpoint whose shallow verify apply runs first
    done: str = ""  # what apply did
    file: bool = False  # a checkpoint saved as one file (patterns.py)

    @property
    def ck(self) -> Checkpoint:
        return Checkpoint(self.path, self.step, self.file)

    def to_json(self) -> dict[str, Any]:
        out = {"path": self.path, "step": self.step, "state": self.state, "action": self.action, "reason": self.reason,
               "rules": self.rules}
        if self.action == "delete":
            out["phase"] = self.phase
            out["delete_after"] = self.delete_after
            out["delete_after_iso"] = now_iso(self.delete_after) if self.delete_after else None
        if self.done:
            out["done"] = self.done
        return out


def policy_enabled(cfg: Config) -> bool:
    return bool(cfg.retention_keep_last or cfg.retention_keep_every_steps or cfg.retention_keep_every_seconds)


def _series(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def series_scope(patterns: Patterns, path: str) -> str:
    """What to plan over for `path`: a checkpoint (or a path inside one) is judged within its whole series."""
    ck = patterns.checkpoint_of(path)
    return path if ck is None else _series(ck.path)


def _verified(e: dict[str, Any]) -> bool:
    v = e.get("last_verify")
    return bool(v) and v.get("outcome") == "whole" and not v.get("stale") and v.get("generation") == e.get("generation")


def _mark(e: dict[str, Any]) -> dict[str, Any]:
    return e.get("retention") or {}


def keep_rules(committed: list[dict[str, Any]], keep_last: int, every_steps: int, every_seconds: float) -> dict[str, list[str]]:
    """The keep rules that keep each committed checkpoint of one series (sorted by step): path -> rules, [] for none.

    The primary's retention (`retention_keep_*`) and a replica's own (`[replica.NAME] keep_*`) both use it."""
    rules: dict[str, list[str]] = {e["path"]: [] for e in committed}
    if keep_last:
        for e in committed[-keep_last:]:
            rules[e["path"]].append(f"last {keep_last}")
    if every_steps:
        for e in committed:
            if e["step"] % every_steps == 0:
                rules[e["path"]].append(f"every {every_steps} steps")
    if every_seconds:
        last_kept: float | None = None
        for e in sorted(committed, key=lambda e: (e.get("first_committed_at") or e.get("committed_at") or 0, e["step"])):
            t = float(e.get("first_committed_at") or e.get("committed_at") or 0)
            if last_kept is None or t - last_kept >= every_seconds:
                rules[e["path"]].append(f"one per {every_seconds:g} s")
                last_kept = t
    return rules


def plan(entries: list[dict[str, Any]], cfg: Config, now: float | None = None) -> list[Decision]:
    """What the policy keeps and lets go, from the catalogue's entries; changes nothing."""
    now = time.time() if now is None else now
    out: list[Decision] = []
    series: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        series.setdefault(_series(e["path"]), []).append(e)
    for _, group in sorted(series.items()):
        committed = sorted((e for e in group if e.get("committed")), key=lambda e: (e["step"], e["path"]))
        rules: dict[str, list[str]] = {e["path"]: [] for e in group}
        for p, by in keep_rules(committed, cfg.retention_keep_last, cfg.retention_keep_every_steps,
                                cfg.retention_keep_every_seconds).items():
            rules[p] += by
        for e in group:
            if e.get("protected"):
                rules[e["path"]].append("protected")
        newest = committed[-1] if committed else None
        for e in sorted(group, key=lambda e: (e["step"], e["path"])):
            d = Decision(e["path"], e["step"], e["state"], "keep", "", rules[e["path"]], file=e.get("kind") == "file")
            out.append(d)
            mark = _mark(e)
            if e.get("protected"):
                d.reason = "protected" + (f": {e['protection'].get('reason')}" if e.get("protection") else "")
            elif e["state"] in LOCAL_STATES and e.get("committed"):
                d.reason = f"being changed on this node ({e['state']})"
            elif not e.get("committed"):
                d.reason = "not committed (no manifest: being written, or written without ckptfs)"
            elif e is newest:
                d.reason = "newest committed checkpoint" + (f" (also: {', '.join(d.rules)})" if d.rules else "")
            elif d.rules:
                d.reason = "kept by " + ", ".join(d.rules)
            elif not policy_enabled(cfg):
                d.reason = "no retention policy (every retention_keep_* rule is off)"
            elif mark.get("state") == "restored":
                d.reason = f"restored by {mark.get('who', {}).get('user', '?')} at {mark.get('at_iso', '?')}"
            elif e.get("committed_at") and now - float(e["committed_at"]) < cfg.retention_min_age:
                d.reason = f"committed less than retention_min_age ({cfg.retention_min_age:g} s) ago"
            else:
                d.action = "delete"
                newer = [c for c in committed if c["step"] > e["step"] and c is not e]
                if not any(_verified(c) for c in newer):
                    assert newest is not None
                    d.needs_verify = newest["path"]
                if mark.get("state") == "expiring":
                    d.delete_after = float(mark.get("delete_after", 0))
                    if now >= d.delete_after:
                        d.phase, d.reason = "remove", "not kept by any rule; expiring and the grace period is over: deleted now"
                    else:
                        d.phase, d.reason = "wait", f"not kept by any rule; expiring, deleted after {now_iso(d.delete_after)}"
                else:
                    d.phase = "expire"
                    d.delete_after = now + cfg.retention_grace
                    d.reason = (f"not kept by any rule; becomes expiring now, deleted after the grace period "
                                f"({cfg.retention_grace:g} s)")
                if d.needs_verify:
                    d.reason += f", once {d.needs_verify} passes a shallow verify (apply runs it first)"
    return out


# --------------------------------------------------------------------- acting
async def apply(lc: Context, path: str, who: dict[str, Any], lease: Lease | None = None,
                only: str | None = None) -> list[Decision]:
    """Carry out the plan for the checkpoints under `path` (or only checkpoint `only` of them): expire, delete after
    the grace period, undo expiries kept again."""
    entries = await lc.scan(path)
    decisions = [d for d in plan(entries, lc.cfg) if only is None or d.path == only]
    # verify newer first: the newest committed checkpoint of a series, when nothing newer passed verify yet
    by_path = {e["path"]: e for e in entries}
    for target in sorted({d.needs_verify for d in decisions if d.needs_verify and d.action == "delete" and d.phase != "wait"}):
        e = by_path[target]
        ck = Checkpoint(target, e["step"], e.get("kind") == "file")
        manifest = await lc.catalogue.manifest(ck)
        if manifest is None:
            continue
        moved = e.get("moved") or {}
        if moved.get("state") == "moved":  # its files are on the cold target (coldmove.py): verified there
            result = await lc.mover.verify(ck, False, _no_progress, str(moved.get("target") or ""))
        else:
            result = await verify(lc, ck, manifest, False, _no_progress)
        e["last_verify"] = result
        if result["outcome"] != "whole":
            log.warning("retention: %s is not whole (shallow verify): nothing older in its directory is deleted", target)
    decisions = [d for d in plan(entries, lc.cfg) if only is None or d.path == only]
    for d in decisions:
        e = by_path[d.path]
        if lease is not None and not lease.valid():
            raise LifecycleError("retention stopped: this node no longer holds the retention lease")
        try:
            if d.action == "keep":
                if _mark(e).get("state") == "expiring" and e.get("committed"):
                    await _unexpire(lc, d, e, who)
            elif d.phase == "wait":
                pass
            elif d.needs_verify:
                d.action, d.reason = "keep", f"no newer committed checkpoint passed verify ({d.needs_verify} is not whole)"
                if _mark(e).get("state") == "expiring":
                    d.done = "left expiring"
            elif d.phase == "expire":
                await _expire(lc, d, e, who)
            elif d.phase == "remove":
                await _remove(lc, d, e, who, lease)
        except StoreError as err:
            d.done = f"failed: {err}"
            log.warning("retention: %s: %s", d.path, err)
    lc.retention_stats["last_run"] = time.time()
    return decisions


async def _no_progress(_: dict[str, Any]) -> None:
    return None


async def _busy(lc: Context, d: Decision) -> str | None:
    """Why `d.path` must not be touched now (uploads in progress, local work), or None."""
    if lc.tracker.local_state(d.path):
        return f"being changed on this node ({lc.tracker.local_state(d.path)})"
    if await lc.io(lc.store.list_uploads, lc.keys.of(d.path) if d.file else place.files_base(lc.keys.prefix, d.ck)):
        return "a multipart upload into it is in progress (another node is writing it)"
    return None


async def _expire(lc: Context, d: Decision, e: dict[str, Any], who: dict[str, Any]) -> None:
    busy = await _busy(lc, d)
    if busy:
        d.action, d.reason = "keep", busy
        return
    now = time.time()
    mark = {"state": "expiring", "since": now, "since_iso": now_iso(now), "delete_after": d.delete_after,
            "delete_after_iso": now_iso(d.delete_after or now), "node": node_name_of(lc.cfg), "who": who, "generation": e.get("generation"),
            "reason": d.reason}
    key = place.own_key(lc.keys.prefix, d.ck, RETENTION)
    body = json_document(mark)
    try:
        # If-None-Match: of two nodes applying at once (no lease: two commands), one marks it
        await lc.io(lambda: lc.store.put_bytes(key, body, if_none_match=not _mark(e)))
    except StoreError as err:
        if err.kind != PRECONDITION:
            raise
        d.action, d.reason, d.done = "keep", "another node marked it meanwhile", "skipped"
        return
    lc.retention_stats["expired"] += 1
    await audit.record(lc, "expire", d.path, who, d.reason, step=d.step, delete_after=d.delete_after,
                       delete_after_iso=mark["delete_after_iso"])
    d.done = "expiring"
    log.info("retention: %s is expiring, deleted after %s", d.path, mark["delete_after_iso"])


async def _unexpire(lc: Context, d: Decision, e: dict[str, Any], who: dict[str, Any]) -> None:
    """A rule keeps an expiring checkpoint again (a policy change, protection): lift the mark."""
    await lc.io(lc.store.delete, place.own_key(lc.keys.prefix, d.ck, RETENTION))
    await audit.record(lc, "unexpire", d.path, who, d.reason, step=d.step)
    d.done = "no longer expiring"


async def _remove(lc: Context, d: Decision, e: dict[str, Any], who: dict[str, Any], lease: Lease | None) -> None:
    busy = await _busy(lc, d)
    if busy:
        d.action, d.reason, d.done = "keep", busy + "; deleted on a later run", "postponed"
        return
    base = place.files_base(lc.keys.prefix, d.ck)
    own_key = functools.partial(place.own_key, lc.keys.prefix, d.ck)
    listing = await lc.io(place.listing, lc.store, lc.keys.prefix, d.ck)
    names = {o.name: o for o in listing.objects}
    if PROTECTED in names:
        d.action, d.reason, d.done = "keep", "protected meanwhile", "skipped"
        return
    try:  # read the mark again: restored meanwhile (from another node) means kept
        mark = (await lc.io(read_json, lc.store, own_key(RETENTION)))[0] or {}
    except StoreError:
        mark = {}
    if mark.get("state") != "expiring":
        d.action, d.reason, d.done = "keep", "no longer expiring (restored meanwhile)", "skipped"
        return
    moved = None
    if MOVED in names:  # moved to a cold target (coldmove.py): the cold copy goes first
        moved, _ = await lc.mover.record(d.path)
        if moved and moved.get("state") in ("moving", "restoring"):
            d.action, d.reason, d.done = "keep", f"being {moved['state'].replace('ing', 'ed')} (cold target {moved.get('target')}); deleted on a later run", "postponed"
            return
    since = float(mark.get("since", 0))
    written = [o.name for o in listing.objects if not is_own(o.name) and not o.name.endswith("/") and o.mtime > since]
    if written:
        # written into while expiring: someone uses it; let it be committed again and judged afresh
        await lc.io(lc.store.delete, own_key(RETENTION))
        await audit.record(lc, "unexpire", d.path, who, f"written to while expiring ({written[0]})", step=d.step)
        d.action, d.reason, d.done = "keep", f"written to while expiring ({written[0]}): no longer expiring", "no longer expiring"
        return
    if lease is not None and not lease.valid():
        raise LifecycleError("retention stopped: this node no longer holds the retention lease")
    # the checkpoint's files first, then ckptfs's own objects, the retention mark last: an interrupted
    # deletion leaves the mark, and the next run finishes it
    files = [base + o.name for o in listing.objects if not is_own(o.name) and not o.name.endswith("/")]
    own = [own_key(o.name) for o in listing.objects if is_own(o.name) and o.name != RETENTION]
    size = sum(o.size for o in listing.objects if not is_own(o.name))
    cold = 0
    if moved and moved.get("state") == "moved":
        try:
            cold = await lc.mover.delete_cold(d.path, moved)
        except LifecycleError as err:
            d.action, d.reason, d.done = "keep", str(err), f"failed: {err}"
            return
        size += int(moved.get("bytes") or 0)
    for batch in (files, own):
        await _delete_all(lc, batch)
    # directory keys last, deepest first, even when no marker object was listed: stores that keep
    # directories of their own (SeaweedFS's filer) go on listing an emptied prefix until its `dir/`
    # key is deleted, and on S3 deleting a key that does not exist is a no-op
    dirs = {"/".join(o.name.split("/")[:i]) + "/" for o in listing.objects for i in range(1, o.name.count("/") + 1)}
    for sub in sorted(dirs, key=lambda k: -k.count("/")):
        await lc.io(lc.store.delete, base + sub)
    await lc.io(lc.store.delete, own_key(RETENTION))
    if not d.file:
        await lc.io(lc.store.delete, base)  # the directory's own key (a file checkpoint's directory stays)
    lc.retention_stats["deleted"] += 1
    lc.retention_stats["deleted_bytes"] += size
    await audit.record(lc, "delete", d.path, who, "retention: not kept by any rule, grace period over", step=d.step,
                       files=len(files), bytes=size, expiring_since=mark.get("since_iso"),
                       **({"cold_target": moved.get("target"), "cold_objects": cold} if cold else {}))
    d.done = "deleted"
    log.info("retention: deleted %s (%d objects, %d bytes)", d.path, len(files) + len(own) + 1, size)


async def _delete_all(lc: Context, keys: list[str]) -> None:
    limit = trio.CapacityLimiter(DELETES_AT_ONCE)

    async def one(key: str) -> None:
        async with limit:
            try:
                await lc.io(lc.store.delete, key)
            except StoreError as e:
                if e.kind != NO_OBJECT:
                    raise

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)


async def restore(lc: Context, ck: Checkpoint, who: dict[str, Any], reason: str) -> dict[str, Any]:
    """Take an expiring checkpoint back: it is kept by retention from now on (reason `restored`)."""
    key = place.own_key(lc.keys.prefix, ck, RETENTION)
    found, etag = await lc.io(read_json, lc.store, key)
    mark = found or {}
    if mark.get("state") != "expiring":
        return {"path": ck.path, "changed": False, "message": f"{ck.path} is not expiring; nothing changed"}
    now = time.time()
    new = {"state": "restored", "at": now, "at_iso": now_iso(now), "who": who, "node": node_name_of(lc.cfg), "reason": reason,
           "expiring_since": mark.get("since_iso")}
    try:
        await lc.io(lambda: lc.store.put_bytes(key, json_document(new), if_match=etag))
    except StoreError as e:
        if e.kind != PRECONDITION:
            raise
        raise LifecycleError(f"{ck.path}: retention changed it meanwhile (deleted or re-marked): run `ckptfs checkpoints` and try again") from None
    await audit.record(lc, "restore", ck.path, who, reason or "ckptfs retention restore", step=ck.step,
                       expiring_since=mark.get("since_iso"))
    return {"path": ck.path, "changed": True,
            "message": f"{ck.path} restored: no longer expiring, and retention keeps it from now on (reason: restored)"}


# ------------------------------------------------------------------- schedule
def lease_ttl(cfg: Config) -> float:
    """The lease outlives two intervals, so the holder keeps it from run to run; a dead holder's passes after it."""
    return max(2 * cfg.retention_interval, 30.0)


async def apply_leased(lc: Context, path: str, who: dict[str, Any], only: str | None = None) -> list[Decision]:
    """`apply` holding the retention lease (the node's scheduled one, or one taken for this run), so nodes never race."""
    lease = lc.retention_lease
    temporary = lease is None
    if lease is None:
        lease = Lease.for_mount(lc.store, lc.keys.of, LEASE_NAME, lease_ttl(lc.cfg), node=node_name_of(lc.cfg))
    async with lc.retention_lock:
        if not await lc.io(lease.acquire):
            holder = await lc.io(lease.holder)
            where = holder.describe() if holder else "another node"
            raise LifecycleError(f"retention is being run by {where}, which holds the retention lease: "
                                 "run it there, or try again once that node stops renewing it")
        decisions: list[Decision] | None = None
        try:
            async with kept(lease, lc.io):
                decisions = await apply(lc, path, who, lease, only)
        finally:
            if temporary:
                with trio.CancelScope(shield=True):
                    try:
                        await lc.io(lease.release)
                    except StoreError as e:
                        log.info("retention: could not release the lease (%s); it expires by itself", e)
    if decisions is None:
        raise LifecycleError("retention stopped: this node lost the retention lease during the run")
    return decisions


async def schedule(lc: Context, lease: Lease) -> None:
    """Every `retention_interval`: if this node holds (or can take) the lease, apply retention to the whole mount."""
    who = {"user": "retention schedule", "uid": None}
    while True:
        await trio.sleep(lc.cfg.retention_interval)
        try:
            async with lc.retention_lock:
                held = await lc.io(lease.acquire)
        except StoreError as e:
            log.warning("retention: cannot reach the lease (%s); will try again", e)
            continue
        lc.retention_stats["lease_held"] = held
        if not held:
            continue
        try:
            decisions = await apply_leased(lc, "", who)
            acted = [d for d in decisions if d.done]
            if acted:
                log.info("retention run: %s", run_summary(decisions))
        except (StoreError, LifecycleError) as e:
            lc.retention_stats["errors"] += 1
            log.warning("retention run failed, will retry: %s", e)


def run_summary(decisions: list[Decision]) -> str:
    counts: dict[str, int] = {}
    for d in decisions:
        k = d.done or (d.action if d.action == "keep" else f"delete ({d.phase})")
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))

