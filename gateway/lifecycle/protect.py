"""Golden (protected) checkpoints: refused by every mount, held by the store where it can.

Protection is the object `<checkpoint>/.ckptfs-protected.json` (reason, who,
node, time, the legal holds placed). Every mount learns it from its listings
of the checkpoint directory (so another node's mount knows within
`metadata_ttl`), and `Guard` refuses changes at, inside or (for rename and
rmdir) above a protected checkpoint with EPERM, without a network request.

On a bucket created with S3 Object Lock, protect also puts a legal hold on
the exact version of every file of the manifest and of the manifest itself,
then reads each back; unprotect releases those versions. On a bucket without
Object Lock no hold is placed (stores either refuse it or accept it without
enforcing it) and the command says that protection holds only through ckptfs.
"""

from __future__ import annotations

import errno
import logging
import time
from typing import Any

import trio

from ..journal import Journal
from ..namespace.keys import is_reserved
from ..peering import node_name_of
from ..objects import NO_OBJECT, StoreError, json_document
from . import audit, place, tiers
from .manifest import MANIFEST, PROTECTED, LifecycleError, Manifest, now_iso, read_json
from ..patterns import Checkpoint
from .catalogue import Catalogue
from .context import Context

log = logging.getLogger(__name__)


class Guard:
    """The guard (fs.Guard) fs.py's changing operations call: EPERM for ckptfs's own names and protected checkpoints.

    Synchronous and local: it asks the catalogue's knowledge (kept fresh by the
    mount's own listings), never the network.
    """

    def __init__(self, journal: Journal, catalogue: Catalogue) -> None:
        self.journal, self.catalogue = journal, catalogue
        self.refused_total = 0

    def _refuse(self, path: str, subtree: bool) -> None:
        ck = self.catalogue.protected_at(path, subtree)
        if ck is not None:
            self.refused_total += 1
            log.info("refused a change to %s: checkpoint %s is protected (ckptfs unprotect %s --reason ...)", path or "/", ck, ck)
            raise OSError(errno.EPERM, f"checkpoint {ck} is protected")

    def check_entry(self, parent: int, name: str, subtree: bool = False) -> None:
        """Before creating, removing or renaming `name` in directory `parent` (`subtree`: it may be a directory moving or going)."""
        if is_reserved(name):
            raise OSError(errno.EPERM, f"{name}: names beginning with .ckptfs are reserved for ckptfs")
        if not self.catalogue.protected:
            return
        base = self.journal.path_of(parent)
        if base is not None:
            self._refuse(f"{base}/{name}" if base else name, subtree)

    def check_inode(self, ino: int) -> None:
        """Before changing the bytes or attributes of inode `ino`."""
        if not self.catalogue.protected:
            return
        path = self.journal.path_of(ino)
        if path is not None:
            self._refuse(path, False)


def _files_to_hold(lc: Context, ck: Checkpoint, manifest: Manifest) -> list[tuple[str, str]]:
    """(key, ETag) of every object that gets a legal hold: the manifest's files and the manifest itself."""
    return [(f["key"], f["etag"]) for f in manifest.files] + [(place.own_key(lc.keys.prefix, ck, MANIFEST), manifest.etag)]


async def protect(lc: Context, ck: Checkpoint, reason: str, who: dict[str, Any]) -> dict[str, Any]:
    marker = place.own_key(lc.keys.prefix, ck, PROTECTED)
    manifest = await lc.catalogue.manifest(ck)
    if manifest is None:
        raise LifecycleError(f"{ck.path} is not committed (no manifest yet): wait for it, or run `ckptfs checkpoint commit {ck.path}` first")
    state = lc.tracker.local_state(ck.path)
    if state is not None:
        raise LifecycleError(f"{ck.path} is being changed on this node ({state}): let the job finish (`ckptfs flush {ck.path}` waits for it) and try again")
    existing = await _protection(lc, marker)
    if existing is not None:
        lc.catalogue.set_protected(ck.path, existing)
        return {"path": ck.path, "changed": False, "protection": existing,
                "message": f"{ck.path} is already protected (since {existing.get('at_iso')}, reason: {existing.get('reason')}); nothing changed"}
    now = time.time()
    info: dict[str, Any] = {"reason": reason, "who": who, "node": node_name_of(lc.cfg), "at": now, "at_iso": now_iso(now),
                            "generation": manifest.generation, "object_lock": False, "held": []}
    # first the ckptfs protection (every mount refuses changes from here on), then the store's holds
    await lc.io(lc.store.put_bytes, marker, json_document(info))
    lc.catalogue.set_protected(ck.path, info)
    lock = await lc.io(lc.store.object_lock_enabled)
    if lock:
        held = await _holds(lc, _files_to_hold(lc, ck, manifest), on=True)
        info.update(object_lock=True, held=held)
        await lc.io(lc.store.put_bytes, marker, json_document(info))
        lc.catalogue.set_protected(ck.path, info)
        message = (f"{ck.path} is protected: every ckptfs mount refuses changes, and {len(held)} objects are under an "
                   "S3 legal hold (confirmed by reading each back)")
    else:
        message = (f"{ck.path} is protected through ckptfs only: bucket {lc.store.bucket!r} has no S3 Object Lock, so plain S3 "
                   "tools can still delete or overwrite its objects (create the bucket with Object Lock for legal holds)")
    await tiers.tag(lc, ck, manifest, "protected", True)
    await audit.record(lc, "protect", ck.path, who, reason, step=ck.step, generation=manifest.generation,
                       object_lock=lock, held=len(info["held"]))
    log.info("%s (reason: %s)", message, reason)
    return {"path": ck.path, "changed": True, "protection": info, "message": message}


async def unprotect(lc: Context, ck: Checkpoint, reason: str, who: dict[str, Any]) -> dict[str, Any]:
    marker = place.own_key(lc.keys.prefix, ck, PROTECTED)
    existing = await _protection(lc, marker)
    if existing is None:
        lc.catalogue.set_protected(ck.path, None)
        return {"path": ck.path, "changed": False, "message": f"{ck.path} is not protected; nothing changed"}
    released = 0
    if existing.get("held"):
        held = [(h["key"], h["version_id"]) for h in existing["held"]]
        await _release(lc, held)
        released = len(held)
    await lc.io(lc.store.delete, marker)
    lc.catalogue.set_protected(ck.path, None)
    manifest = await lc.catalogue.manifest(ck)
    if manifest is not None:
        await tiers.tag(lc, ck, manifest, "committed", False)
    await audit.record(lc, "unprotect", ck.path, who, reason, step=ck.step, released=released,
                       protected_since=existing.get("at_iso"), protected_reason=existing.get("reason"))
    note = f"; {released} legal holds released" if released else ""
    return {"path": ck.path, "changed": True, "message": f"{ck.path} is no longer protected{note}"}


async def _protection(lc: Context, marker: str) -> dict[str, Any] | None:
    info, _ = await lc.io(read_json, lc.store, marker)
    return info  # type: ignore[no-any-return]


async def _holds(lc: Context, objects: list[tuple[str, str]], on: bool) -> list[dict[str, str]]:
    """Put a legal hold on each (key, ETag), on the version with that ETag, and read it back."""
    held: list[dict[str, str]] = []
    problems: list[str] = []

    async def one(key: str, etag: str) -> None:
        try:
            info = await lc.io(lc.store.head_object, key)
            if info.etag != etag:
                problems.append(f"{key} changed since the manifest (run ckptfs verify)")
                return
            await lc.io(lc.store.set_legal_hold, key, on, info.version_id)
            if not await lc.io(lc.store.legal_hold, key, info.version_id):
                problems.append(f"{key}: the store accepted the legal hold but does not report it")
                return
            held.append({"key": key, "version_id": info.version_id or ""})
        except StoreError as e:
            problems.append(f"{key}: {e}")

    async with trio.open_nursery() as nursery:
        for key, etag in objects:
            nursery.start_soon(one, key, etag)
    if problems:
        raise LifecycleError(f"protected through ckptfs, but {len(problems)} of {len(objects)} legal holds did not take "
                             f"(first: {problems[0]}): fix it and run protect again after unprotect")
    return sorted(held, key=lambda h: h["key"])


async def _release(lc: Context, held: list[tuple[str, str]]) -> None:
    problems: list[str] = []

    async def one(key: str, version_id: str) -> None:
        try:
            await lc.io(lc.store.set_legal_hold, key, False, version_id or None)
            if await lc.io(lc.store.legal_hold, key, version_id or None):
                problems.append(f"{key}: the legal hold is still reported after releasing it")
        except StoreError as e:
            if e.kind != NO_OBJECT:
                problems.append(f"{key}: {e}")

    async with trio.open_nursery() as nursery:
        for key, version_id in held:
            nursery.start_soon(one, key, version_id)
    if problems:
        raise LifecycleError(f"{len(problems)} of {len(held)} legal holds could not be released (first: {problems[0]}): "
                             "the checkpoint stays protected; fix it and run unprotect again")
