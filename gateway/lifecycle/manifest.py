"""The manifest: what a committed checkpoint holds, written into it last, as one object.

Key: `<checkpoint>/.ckptfs-manifest.json`. Every name beginning `.ckptfs` is
ckptfs's own: the mount hides it and refuses to create it, so it cannot
collide with a file of the job. Other objects of the same family sit next to
it: `.ckptfs-verify.json` (the last verify's result),
`.ckptfs-protected.json` (present while the checkpoint is protected) and
`.ckptfs-retention.json` (retention's mark: expiring, or restored) and
`.ckptfs-moved.json` (the mover's record: where a checkpoint moved to, lifecycle/coldmove.py).

The first manifest is written with `If-None-Match: *`: of two nodes committing
the same checkpoint, one write wins and the other reads the winner's. A
checkpoint whose files change after its manifest gets the next *generation*,
written with `If-Match` on the ETag of the one it replaces (so two nodes never
both replace it), and is marked `changed` from then on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..objects import Listing, NO_OBJECT, PRECONDITION, StoreError, json_document
from ..storeapi import LifecycleStore, read_json  # noqa: F401 - read_json: the lifecycle's modules take it from here
from ..namespace.keys import is_reserved

FORMAT = "ckptfs-manifest/1"
# what manifests said from commit cf68337 until issue 35: the move record's name had taken FORMAT's place
MISLABELLED_FORMAT = "ckptfs-moved/1"
MANIFEST = ".ckptfs-manifest.json"
VERIFY = ".ckptfs-verify.json"
PROTECTED = ".ckptfs-protected.json"
RETENTION = ".ckptfs-retention.json"  # retention's mark: expiring (deleted after the grace period) or restored
MOVED = ".ckptfs-moved.json"  # the mover's record: moving, moved (to a cold target), restoring, restored (coldmove.py)
OWN_OBJECTS = (MANIFEST, VERIFY, PROTECTED, RETENTION, MOVED)
COMMIT_ATTEMPTS = 5


class LifecycleError(Exception):
    """A lifecycle command cannot be done; the message is one line naming the problem and the fix."""


def leaf_errors(group: BaseExceptionGroup) -> list[BaseException]:  # type: ignore[type-arg]
    """Every exception in a nursery's (possibly nested) exception group."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(group)
    return leaves


def first_store_error(group: BaseExceptionGroup) -> StoreError | None:  # type: ignore[type-arg]
    """The first StoreError in a nursery's exception group, if every exception in it is one (else None)."""
    leaves = leaf_errors(group)
    if leaves and all(isinstance(e, StoreError) for e in leaves):
        return leaves[0]  # type: ignore[return-value]
    return None


def is_own(rel: str) -> bool:
    """True if `rel` (relative to a checkpoint) is one of ckptfs's objects, not a file of the checkpoint."""
    return any(is_reserved(part) for part in rel.split("/"))


@dataclass
class FileEntry:
    path: str  # relative to the checkpoint directory
    key: str
    size: int
    etag: str
    xxh3: str | None
    mtime: float = 0.0


def files_of(listing: Listing, base_key: str) -> list[FileEntry]:
    """The checkpoint's files in a recursive listing of its prefix (`base_key` ends in '/')."""
    out = []
    for o in listing.objects:
        if o.name.endswith("/") or is_own(o.name):
            continue  # directory markers and our own objects
        out.append(FileEntry(o.name, base_key + o.name, o.size, o.etag, None, o.mtime))
    return sorted(out, key=lambda f: f.path)


def signature(files: list[FileEntry] | list[dict[str, Any]]) -> set[tuple[str, int, str]]:
    """What makes two lists of files the same checkpoint content: names, sizes, ETags."""
    return {(f["path"], f["size"], f["etag"]) if isinstance(f, dict) else (f.path, f.size, f.etag) for f in files}


@dataclass
class Manifest:
    path: str
    step: int
    files: list[dict[str, Any]]
    generation: int = 1
    changed: bool = False
    committed_at: float = 0.0
    first_committed_at: float = 0.0
    newest_file_at: float = 0.0
    node: str = ""
    how: str = "quiet"
    metadata: dict[str, Any] = field(default_factory=dict)
    etag: str = ""  # of the manifest object itself (not stored in it)

    @property
    def bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files)

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT, "path": self.path, "step": self.step, "generation": self.generation,
            "changed": self.changed, "committed_at": self.committed_at, "first_committed_at": self.first_committed_at,
            "newest_file_at": self.newest_file_at, "node": self.node, "how": self.how, "metadata": self.metadata,
            "file_count": len(self.files), "bytes": self.bytes, "files": self.files,
        }
        return json_document(doc, indent=1)

    @classmethod
    def from_json(cls, body: bytes, etag: str = "") -> "Manifest":
        try:
            doc = json.loads(body)
            if doc.get("format") not in (FORMAT, MISLABELLED_FORMAT):
                raise ValueError(f"format {doc.get('format')!r}")
            return cls(path=doc["path"], step=int(doc["step"]), files=list(doc["files"]), generation=int(doc["generation"]),
                       changed=bool(doc.get("changed")), committed_at=float(doc["committed_at"]),
                       first_committed_at=float(doc.get("first_committed_at", doc["committed_at"])),
                       newest_file_at=float(doc.get("newest_file_at", 0)), node=str(doc.get("node", "")),
                       how=str(doc.get("how", "")), metadata=dict(doc.get("metadata") or {}), etag=etag)
        except (ValueError, KeyError, TypeError) as e:
            raise LifecycleError(f"the manifest is not one ckptfs can read ({e}): remove it with an S3 tool and commit again") from None


def read_manifest(store: LifecycleStore, key: str) -> Manifest | None:
    """The manifest at `key`, or None if there is none. Blocking (run in a thread)."""
    try:
        body, etag = store.get_bytes(key)
    except StoreError as e:
        if e.kind == NO_OBJECT:
            return None
        raise
    return Manifest.from_json(body, etag)


def write_manifest(store: LifecycleStore, key: str, build: Callable[[Manifest | None], Manifest | None]) -> tuple[Manifest, bool]:
    """Write the manifest `build(existing)` returns, conditionally; (manifest now in the bucket, written by us).

    `build` returns None to keep the existing manifest as it is. A conditional
    write that loses (another node wrote meanwhile) reads the winner and asks
    `build` again. Blocking (run in a thread).
    """
    for _ in range(COMMIT_ATTEMPTS):
        existing = read_manifest(store, key)
        new = build(existing)
        if new is None:
            assert existing is not None
            return existing, False
        try:
            if existing is None:
                new.etag = store.put_bytes(key, new.to_json(), if_none_match=True)
            else:
                new.etag = store.put_bytes(key, new.to_json(), if_match=existing.etag)
            return new, True
        except StoreError as e:
            if e.kind != PRECONDITION:
                raise
            # another node wrote it first: look at theirs
    raise LifecycleError(f"{key}: other nodes kept rewriting the manifest ({COMMIT_ATTEMPTS} attempts): try again")


def next_manifest(existing: Manifest | None, path: str, step: int, files: list[FileEntry], how: str,
                  metadata: dict[str, Any] | None, now: float | None = None, *, node: str) -> Manifest | None:
    """The manifest to write given the one in the bucket (None: keep it); `node`: the committing node's name
    (peering.node_name_of)."""
    now = time.time() if now is None else now
    entries = [{"path": f.path, "key": f.key, "size": f.size, "etag": f.etag, "xxh3": f.xxh3} for f in files]
    newest = max((f.mtime for f in files), default=0.0)
    if existing is None:
        return Manifest(path, step, entries, 1, False, now, now, newest, node, how, dict(metadata or {}))
    same = signature(existing.files) == signature(files)
    merged = {**existing.metadata, **(metadata or {})}
    if same and merged == existing.metadata:
        return None  # already describes this content: nothing to write
    return Manifest(path, step, entries if not same else existing.files, existing.generation + 1, existing.changed or not same,
                    now, existing.first_committed_at, newest if not same else existing.newest_file_at, node, how, merged)


def now_iso(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


# ------------------------------------------------ the move record (coldmove.py writes it; the catalogue, the
# tracker and the replicator read it)
MOVED_FORMAT = "ckptfs-moved/1"
MOVING, MOVED_STATE, RESTORING, RESTORED = "moving", "moved", "restoring", "restored"


def moved_away(body: bytes) -> bool:
    """Whether a move record (the object's body) says the checkpoint's files are, or are going, elsewhere."""
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("state") in (MOVING, MOVED_STATE, RESTORING)


def stored_bytes(record: dict[str, Any]) -> int:
    """What a moved checkpoint's files take on its cold target (compressed, or as they are: a record of an older
    version says only `bytes`)."""
    return int(record.get("stored_bytes", record.get("bytes")) or 0)


def label(record: dict[str, Any] | None) -> str | None:
    """The storage-class label of a checkpoint with a move record (None: as its objects say)."""
    if not record or record.get("state") not in (MOVING, MOVED_STATE, RESTORING):
        return None
    return f"{record['state']}:{record.get('target', '?')}"
