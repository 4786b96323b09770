"""The catalogue: which checkpoints the bucket holds, in which state. It lives in the bucket.

There is no index object to keep in step: a checkpoint is a directory (or a
file) whose name matches `checkpoint_patterns`, and what is known about it is
in the objects ckptfs keeps inside it, or next to a file (manifest,
protection, last verify: place.py). Any node
mounting the bucket therefore sees the same catalogue: `find` walks the bucket
(one delimited listing per directory level, not descending into checkpoints),
`describe` lists one checkpoint's top level and reads those objects
(manifests are cached by ETag).

The catalogue also remembers which checkpoints are protected, from every
listing of a checkpoint directory the mount makes (`learn_listing`), from
`describe` and from the protect commands; the guard asks it (`protected`)
without touching the network.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Awaitable, Callable

from ..namespace.keys import is_reserved
from ..patterns import Checkpoint, Patterns
from ..storageclass import class_label
from ..objects import Listing
from ..storeapi import LifecycleStore
from .manifest import MANIFEST, MOVED, PROTECTED, RETENTION, VERIFY, Manifest, files_of, label, read_json, read_manifest, stored_bytes
from .context import Context
from . import place

log = logging.getLogger(__name__)

MAX_DEPTH = 8  # directory levels walked looking for checkpoints (run/.../step)
# local work on this node (tracker.py): a file open for writing; closed files not yet durable; all of those replicated to
# peers (durability = peer: safe from the loss of this node, not yet in the bucket)
LOCAL_STATES = ("writing", "draining", "replicated")
STATES = (*LOCAL_STATES, "committed", "protected", "expiring")


class Catalogue:
    def __init__(self, lc: Context) -> None:
        self.lc = lc
        self.protected: dict[str, dict[str, Any]] = {}  # checkpoint path -> what its protection object says
        self._manifests: dict[str, Manifest] = {}  # manifest key -> last one read (by ETag)

    def _in_the_mount(self, path: str, files: int, size: int) -> tuple[int, int]:
        """(files, bytes) of the checkpoint at `path` as this mount sees it (written here and not yet in the bucket
        included: the listing alone said `0 files, 0 B` while they drained); the listing's if the path is gone."""
        row = self.lc.ns.journal.resolve(path)
        if row is None:
            return files, size
        rows = [row] if not row.is_dir else [r for r in self.lc.ns.journal.descendants(row.ino) if r.kind == "file"]
        return len(rows), sum(self.lc.ns.files.size_of(r) for r in rows)

    # ------------------------------------------------------ protection knowledge
    def learn_listing(self, path: str, listing: Listing) -> None:
        """A listing of directory `path` was merged into the mount: note whether it is a protected checkpoint, and
        which file checkpoints in it are."""
        ck = self.lc.patterns.checkpoint_of(path, is_dir=True)
        if ck is not None and ck.path == path:
            self._learn(path, any(o.name == PROTECTED for o in listing.objects))
        if ck is not None:
            return  # inside a directory checkpoint: no file there is a checkpoint of its own
        parents = [p for p in path.split("/") if p]
        marked = {owner[1] for o in listing.objects if (owner := place.file_owner(o.name)) and owner[0] == PROTECTED}
        for o in listing.objects:
            if self.lc.patterns.file_step(parents, o.name) is not None:
                self._learn(f"{path}/{o.name}" if path else o.name, o.name in marked)

    def _learn(self, path: str, on: bool) -> None:
        if on and path not in self.protected:
            self.protected[path] = {"reason": "?", "learned_from": "listing"}
            log.info("checkpoint %s is protected (seen in the bucket)", path)
        elif not on and path in self.protected:
            del self.protected[path]
            log.info("checkpoint %s is no longer protected (seen in the bucket)", path)

    def set_protected(self, path: str, info: dict[str, Any] | None) -> None:
        if info is None:
            self.protected.pop(path, None)
        else:
            self.protected[path] = info

    def protected_at(self, path: str, subtree: bool) -> str | None:
        """The protected checkpoint that `path` is or is inside (or, with `subtree`, contains); None if none."""
        for ck in self.protected:
            if path == ck or path.startswith(ck + "/") or (subtree and (not path or ck.startswith(path + "/"))):
                return ck
        return None

    # ------------------------------------------------------------------ walking
    async def find(self, path: str) -> list[Checkpoint]:
        """Checkpoints at, inside or below mount-relative `path`: the bucket's and this node's."""
        lc = self.lc
        found: dict[str, Checkpoint] = {}
        ck = lc.patterns.checkpoint_of(path)
        if ck is not None:
            found[ck.path] = ck  # `path` is a checkpoint or inside one
        else:
            found.update(await walk(lc.store, lc.keys.prefix, lc.patterns, lc.io, path))
        for local in lc.tracker.local_checkpoints():
            if (ck is not None and local.path == ck.path) or (ck is None and _under(path, local.path)):
                found.setdefault(local.path, local)
        return sorted(found.values(), key=lambda c: (c.path.rsplit("/", 1)[0] if "/" in c.path else "", c.step, c.path))

    # --------------------------------------------------------------- describing
    async def manifest(self, ck: Checkpoint) -> Manifest | None:
        lc = self.lc
        return await lc.io(read_manifest, lc.store, place.own_key(lc.keys.prefix, ck, MANIFEST))

    async def _json(self, key: str) -> dict[str, Any] | None:
        doc, _ = await self.lc.io(read_json, self.lc.store, key)
        return doc or None  # missing, or not a JSON object

    async def describe(self, ck: Checkpoint) -> dict[str, Any]:
        """One checkpoint as `ckptfs checkpoints --json` shows it."""
        lc = self.lc
        base = place.files_base(lc.keys.prefix, ck)
        top = await lc.io(place.listing, lc.store, lc.keys.prefix, ck)  # recursive: storage classes of every object
        own = {o.name: o for o in top.objects if o.name in (MANIFEST, PROTECTED, VERIFY, RETENTION, MOVED)}
        classes: dict[str, int] = {}
        for o in top.objects:
            classes[o.storage_class] = classes.get(o.storage_class, 0) + o.size
        manifest = None
        own_key = functools.partial(place.own_key, lc.keys.prefix, ck)
        if MANIFEST in own:
            key = own_key(MANIFEST)
            cached = self._manifests.get(key)
            if cached is not None and cached.etag == own[MANIFEST].etag:
                manifest = cached
            else:
                manifest = await lc.io(read_manifest, lc.store, key)
                if manifest is not None:
                    self._manifests[key] = manifest
        protection = await self._json(own_key(PROTECTED)) if PROTECTED in own else None
        verified = await self._json(own_key(VERIFY)) if VERIFY in own else None
        retention = await self._json(own_key(RETENTION)) if RETENTION in own else None
        moved = await self._json(own_key(MOVED)) if MOVED in own else None  # coldmove.py's record
        self.set_protected(ck.path, protection)
        now = time.time()
        if manifest is not None:
            files, size, since = len(manifest.files), manifest.bytes, manifest.committed_at
        else:
            entries = files_of(top, base)
            files, size = len(entries), sum(f.size for f in entries)
            since = max((f.mtime for f in entries), default=0.0)
        local = lc.tracker.local_state(ck.path)
        if local and manifest is None:  # its files are here, not all in the bucket yet: count them as the mount sees them
            files, size = self._in_the_mount(ck.path, files, size)
        if local:
            state = local
        elif retention is not None and retention.get("state") == "expiring" and protection is None:
            state = "expiring"  # retention let it go: deleted after the grace period unless restored
        elif manifest is not None:
            state = "protected" if protection is not None else "committed"
        else:
            state = "writing"  # not committed: still being written, not quiet yet, or written without ckptfs
        hot_files = len(files_of(top, base))
        where = label(moved)
        stored = size
        if where is not None and moved and moved.get("state") != "moving":
            stored = stored_bytes(moved)
            classes[where] = stored  # its files are on the cold target, not here (compressed: cold_compression)
        if verified is not None and manifest is not None and verified.get("generation") != manifest.generation:
            verified = {**verified, "stale": True}  # verified an earlier generation of the manifest
        return {
            "path": ck.path,
            "step": ck.step,
            "kind": "file" if ck.file else "directory",
            "state": state,
            "files": files,
            "bytes": size,
            "original_bytes": size,  # its files' bytes
            "stored_bytes": stored,  # what they take where they are: less on a compressed cold target
            "protected": protection is not None,
            "protection": protection,
            "committed": manifest is not None,
            "committed_at": manifest.committed_at if manifest else None,
            "first_committed_at": manifest.first_committed_at if manifest else None,
            "generation": manifest.generation if manifest else 0,
            "changed": manifest.changed if manifest else False,
            "node": manifest.node if manifest else None,
            "metadata": manifest.metadata if manifest else {},
            "age_seconds": round(now - since, 1) if since else None,
            "last_verify": verified,
            "storage_class": where or class_label(classes),
            "storage_classes": classes,  # bytes per class, ckptfs's own objects included
            "retention": retention,
            "moved": moved,  # the move record (state moving | moved | restoring | restored, target, ...) or None
            "location": (moved or {}).get("target") if where else None,
            "hot_files": hot_files,  # files of it in this bucket
        }


async def walk(store: LifecycleStore, prefix: str, patterns: Patterns, io: Callable[..., Awaitable[Any]], path: str = "",
               depth: int = 0) -> dict[str, Checkpoint]:
    """The checkpoints in the bucket under key prefix `prefix` at or below directory `path`, by path.

    One listing (with delimiter) per directory, down to MAX_DEPTH levels; a directory whose name
    matches checkpoint_patterns is a checkpoint and is not entered, and a file matching a `file:`
    pattern is a checkpoint too. The primary's catalogue and the replicator (on each target) walk
    with it."""
    found: dict[str, Checkpoint] = {}
    listing = await io(store.list, prefix + (path + "/" if path else ""))
    parents = [p for p in path.split("/") if p]
    for o in listing.objects:
        step = patterns.file_step(parents, o.name)
        if step is not None and "/" not in o.name:
            child = f"{path}/{o.name}" if path else o.name
            found[child] = Checkpoint(child, step, file=True)
    for name in listing.dirs:
        if not name or is_reserved(name):
            continue
        child = f"{path}/{name}" if path else name
        step = patterns.step(name)
        if step is not None:
            found[child] = Checkpoint(child, step)
        elif depth + 1 < MAX_DEPTH:
            found.update(await walk(store, prefix, patterns, io, child, depth + 1))
    return found


def _under(path: str, other: str) -> bool:
    return not path or other == path or other.startswith(path + "/")
