"""Storage tiers: object tags on checkpoints, the bucket lifecycle rules built on them, restores of archived objects.

* Tags. The objects of a committed checkpoint (its files and its manifest) carry
  `ckptfs-state` (committed | protected | expiring), `ckptfs-protected` (true | false) and
  `ckptfs-step`, set when the manifest is written and on protect / unprotect (`tag`). Other
  tags on the objects are kept (read, merged, written back). Retention sets `expiring` the
  same way.
* Rules. `plan` builds the bucket lifecycle rules those tags make possible, scoped to the
  mount's prefix and named `ckptfs:<prefix>:...`; it compares them with what the bucket has,
  and `apply` writes the result, keeping every rule ckptfs did not write (other prefixes'
  ckptfs rules included). Bucket lifecycle ages count from each object's creation, as S3 does.
* Restores. `restore` asks the store to restore every archived object at or under a path
  (RestoreObject) and reports, on each poll, how many are restored.

Stores that refuse a rule (SeaweedFS answers transitions with 501) get one line naming it; with
`tier_move_target` the daemon moves old checkpoints to that cold target itself (coldmove.py), and
`restore` of a moved checkpoint copies it back from there.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Awaitable, Callable

import trio

from ..storageclass import ARCHIVE_CLASSES, AWS_MIN_DAYS, ONGOING, may_need_restore, parse_transitions  # noqa: F401 (ARCHIVE_CLASSES: for callers of tiers)
from ..namespace.keys import is_reserved
from ..objects import StoreError
from .manifest import MANIFEST, LifecycleError, Manifest
from ..patterns import Checkpoint
from .context import Context

log = logging.getLogger(__name__)

TAG_STATE, TAG_PROTECTED, TAG_STEP = "ckptfs-state", "ckptfs-protected", "ckptfs-step"
TAGS_AT_ONCE = 8
RESTORE_POLL = 30.0
COMMANDS = ("lifecycle_plan", "lifecycle_apply", "restore")


# ------------------------------------------------------------------------ tags
def checkpoint_tags(state: str, protected: bool, step: int) -> dict[str, str]:
    return {TAG_STATE: state, TAG_PROTECTED: "true" if protected else "false", TAG_STEP: str(step)}


async def tag(lc: Context, ck: Checkpoint, manifest: Manifest, state: str, protected: bool) -> int:
    """Set ckptfs's tags on the checkpoint's objects (its files and manifest); returns how many failed.

    A failure is logged, never raised: tags drive bucket lifecycle rules, which catch up at the next change.
    """
    if not lc.cfg.checkpoint_tags:
        return 0
    want = checkpoint_tags(state, protected, ck.step)
    keys = [f["key"] for f in manifest.files] + [lc.keys.of(f"{ck.path}/{MANIFEST}")]
    failed: list[str] = []
    limit = trio.CapacityLimiter(TAGS_AT_ONCE)

    async def one(key: str) -> None:
        async with limit:
            try:
                have = await lc.io(lc.store.get_tags, key)
                if {k: have.get(k) for k in want} != want:
                    await lc.io(lc.store.put_tags, key, {**have, **want})
            except StoreError as e:
                failed.append(f"{key}: {e}")

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)
    if failed:
        lc.tag_errors_total += len(failed)
        log.warning("could not tag %d of %d objects of %s as %s (first: %s): lifecycle rules may skip them until the next change",
                    len(failed), len(keys), ck.path, state, failed[0])
    return len(failed)


# ----------------------------------------------------------------------- rules
def rule_prefix(prefix: str) -> str:
    """The ID prefix of the rules ckptfs writes for a mount prefix."""
    return f"ckptfs:{prefix.strip('/') or '/'}:"


def desired_rules(cfg: Any) -> list[dict[str, Any]]:
    """The bucket lifecycle rules ckptfs wants for this mount's prefix."""
    prefix = cfg.key_prefix
    rid = rule_prefix(cfg.prefix)
    rules: list[dict[str, Any]] = []
    transitions = parse_transitions(cfg.tier_transitions)
    if transitions:
        rules.append({
            "ID": f"{rid}tiers",
            "Status": "Enabled",
            "Filter": {"And": {"Prefix": prefix, "Tags": [{"Key": TAG_STATE, "Value": "committed"},
                                                          {"Key": TAG_PROTECTED, "Value": "false"}]}},
            "Transitions": [{"Days": d, "StorageClass": c} for d, c in transitions],
        })
    if cfg.tier_expiring_delete_days:
        rules.append({
            "ID": f"{rid}expiring",
            "Status": "Enabled",
            "Filter": {"And": {"Prefix": prefix, "Tags": [{"Key": TAG_STATE, "Value": "expiring"}]}},
            "Expiration": {"Days": cfg.tier_expiring_delete_days},
        })
    if cfg.tier_noncurrent_delete_days:
        # prefix only: S3 refuses ExpiredObjectDeleteMarker in a rule filtered by tags
        rules.append({
            "ID": f"{rid}noncurrent",
            "Status": "Enabled",
            "Filter": {"Prefix": prefix},
            "NoncurrentVersionExpiration": {"NoncurrentDays": cfg.tier_noncurrent_delete_days},
            "Expiration": {"ExpiredObjectDeleteMarker": True},
        })
    return rules


def _expires_noncurrent(rule: dict[str, Any], prefix: str) -> bool:
    """Whether an enabled rule deletes noncurrent versions of every key under `prefix`."""
    if rule.get("Status") != "Enabled" or not rule.get("NoncurrentVersionExpiration"):
        return False
    f = rule.get("Filter") or {}
    if "And" in f or "Tag" in f:
        return False
    rule_prefix_ = f.get("Prefix", rule.get("Prefix", "")) or ""
    return prefix.startswith(rule_prefix_)


def _norm(rule: dict[str, Any]) -> dict[str, Any]:
    """A rule as stores echo it back, for comparing: tags in order, no empty fields."""
    r = {k: v for k, v in rule.items() if v not in (None, {}, [])}
    f = r.get("Filter", {}).get("And")
    if f and "Tags" in f:
        r["Filter"] = {"And": {**f, "Tags": sorted(f["Tags"], key=lambda t: t["Key"])}}
    return r


def plan(cfg: Any, current: list[dict[str, Any]], versioning: str = "") -> dict[str, Any]:
    """What `apply` would set: the whole configuration, and its difference from `current`.

    `versioning` is the bucket's versioning status: on a versioned bucket without a rule expiring
    noncurrent versions, what retention deletes stays stored (and billed), which the plan says."""
    mine = rule_prefix(cfg.prefix)
    want = {r["ID"]: r for r in desired_rules(cfg)}
    have = {r.get("ID", ""): r for r in current}
    add = [i for i in want if i not in have]
    change = [i for i in want if i in have and _norm(want[i]) != _norm(have[i])]
    same = [i for i in want if i in have and i not in change]
    remove = [i for i in have if i.startswith(mine) and i not in want]
    keep = [i for i in have if not i.startswith(mine)]
    rules = [have[i] for i in keep] + list(want.values())
    warnings = []
    for r in want.values():
        for t in r.get("Transitions", []):
            low = AWS_MIN_DAYS.get(t["StorageClass"])
            if low and t["Days"] < low:
                warnings.append(f"AWS S3 refuses transitions to {t['StorageClass']} before {low} days "
                                f"(tier_transitions has {t['Days']}); other stores may accept it")
    if versioning in ("Enabled", "Suspended") and not any(_expires_noncurrent(r, cfg.key_prefix) for r in rules):
        warnings.append(f"the bucket is versioned ({versioning}): deleted and overwritten objects stay stored as noncurrent "
                        "versions and are billed; set tier_noncurrent_delete_days to expire them")
    return {"prefix": cfg.key_prefix, "versioning": versioning, "rules": rules, "add": add, "change": change, "unchanged": same, "remove": remove,
            "keep": keep, "changes": bool(add or change or remove), "warnings": warnings}


async def apply(lc: Context) -> dict[str, Any]:
    current = await lc.io(lc.store.lifecycle_rules)
    p = plan(lc.cfg, current, await versioning_status(lc))
    if not p["changes"]:
        return {**p, "applied": False}
    try:
        await lc.io(lc.store.set_lifecycle_rules, p["rules"])
    except StoreError as e:
        if "501" in str(e) or "does not implement" in str(e):
            parts = sorted({"transitions (storage classes)" if "Transitions" in r else "expiration" for r in p["rules"]})
            if lc.cfg.tier_move_target and lc.cfg.tier_transitions:
                raise LifecycleError(f"bucket {lc.store.bucket!r} does not support lifecycle {' and '.join(parts)} (501 Not Implemented): "
                                     f"nothing was changed; the daemon moves checkpoints committed more than {lc.cfg.tier_move_after:g} s ago "
                                     f"to cold target {lc.cfg.tier_move_target} itself (tier_move_target): drop tier_transitions for this store "
                                     "(docs/lifecycle.md, Moving to a cold target)") from None
            raise LifecycleError(f"bucket {lc.store.bucket!r} does not support lifecycle {' and '.join(parts)} (501 Not Implemented): "
                                 "nothing was changed; drop tier_transitions for this store, or set tier_move_target to have the daemon "
                                 "move old checkpoints to a cold target itself (see docs/lifecycle.md, Tiers)") from None
        raise
    log.info("bucket lifecycle rules set: added %s, changed %s, removed %s, kept %d others",
             p["add"] or "-", p["change"] or "-", p["remove"] or "-", len(p["keep"]))
    return {**p, "applied": True}


# -------------------------------------------------------------------- restores
async def restore(lc: Context, rel: str, wait: bool, send: Callable[[Any], Awaitable[None]]) -> dict[str, Any]:
    """Restore every archived object at or under mount-relative `rel`; progress lines until done (or once unless `wait`)."""
    mover = getattr(lc, "mover", None)
    ck = lc.patterns.checkpoint_of(rel) if rel and mover is not None else None
    if ck is not None:  # a checkpoint moved to a cold target (coldmove.py) is copied back from there
        moved = await mover.restore(ck, send)
        if moved is not None:
            return moved
    listing_prefix = lc.keys.of(rel)
    single = await _is_object(lc, listing_prefix) if rel else False
    if single:
        objects = [(listing_prefix, None)]
    else:
        base = lc.keys.of(rel + "/") if rel else lc.keys.of("")
        listing = await lc.io(lambda: lc.store.list(base, recursive=True))
        objects = [(base + o.name, o.storage_class) for o in listing.objects if not o.name.endswith("/")]
    if not objects:
        raise LifecycleError(f"{rel or '/'}: no objects in the bucket to restore")
    # the user's files, as `ls` shows them: not the manifest, markers and other objects ckptfs keeps beside them
    files = sum(1 for key, _ in objects if not any(is_reserved(part) for part in lc.keys.path(key).split("/")))
    states: dict[str, str] = {}
    requested = 0
    for key, cls in objects:
        if cls is not None and not may_need_restore(cls):
            continue
        st = await lc.io(lc.store.archive_state, key)
        lc.ns.archive.observed(key, st)  # what opens and user.ckptfs.state say (archived | restoring)
        if not st.archived:
            continue
        state = st.restore
        if state == "":
            if await lc.io(lc.store.restore, key, lc.cfg.restore_days, lc.cfg.restore_tier):
                requested += 1
            state = ONGOING
            lc.ns.archive.observed(key, dataclasses.replace(st, restore=ONGOING))
        states[key] = state
    while True:
        done = sum(1 for s in states.values() if s == "restored")
        progress = {"objects": len(objects), "files": files, "archived": len(states), "requested": requested, "restored": done,
                    "ongoing": len(states) - done}
        if done == len(states) or not wait:
            return progress
        await send({"ok": True, **progress})
        await trio.sleep(RESTORE_POLL)
        for key, state in list(states.items()):
            if state != "restored":
                st = await lc.io(lc.store.archive_state, key)
                lc.ns.archive.observed(key, st)
                states[key] = st.restore or ONGOING


async def versioning_status(lc: Context) -> str:
    """The bucket's versioning status, or "" when the store will not say (a warning is all it feeds)."""
    try:
        return await lc.io(lc.store.versioning)
    except StoreError as e:
        log.debug("GetBucketVersioning: %s", e)
        return ""


async def _is_object(lc: Context, key: str) -> bool:
    try:
        await lc.io(lc.store.storage_state, key)
    except StoreError:
        return False
    return True


async def handle(lc: Context, cmd: str, path: str, request: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> None:
    """The control-socket commands of this module (called by Lifecycle.handle, which turns errors into one line)."""
    if cmd == "lifecycle_plan":
        current = await lc.io(lc.store.lifecycle_rules)
        await send({"ok": True, "bucket": lc.store.bucket, "current": current, **plan(lc.cfg, current, await versioning_status(lc))})
    elif cmd == "lifecycle_apply":
        await send({"ok": True, "bucket": lc.store.bucket, **await apply(lc)})
    elif cmd == "restore":
        if path and await lc.remote.resolve(path) is None:
            raise LifecycleError(f"{path}: no such file or directory in the mount")
        result = await restore(lc, path, bool(request.get("wait")), send)
        await send({"ok": True, "done": True, "path": path, **result})
