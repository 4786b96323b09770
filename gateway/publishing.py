"""Which of two writers' objects a key should hold: the one rule the drain's uploads, a takeover and reconcile share.

Why one place: a takeover that uploads a dead node's replica, and a node back from a takeover that reconciles its
journal, each ask "is the object at this key one my file may replace, or did another node write it since?". Asked
with clocks (the store's `LastModified` against a file's mtime, at one-second resolution) the answer is wrong for a
file overwritten with an older mtime (`cp -p`, `rsync -a`, `os.utime`) or rewritten within the second of its last
upload: the stale object stays and the checkpoint commits over it. So every object ckptfs writes carries its
provenance in its user metadata (`provenance_meta`): the node whose file it is, that node's journal, the file's
inode there and its version. A key's object is then judged by what the writer knows, never by time:

* nothing there: write, `If-None-Match: *` (nothing should be there when the write lands);
* the same bytes (size and xxh3-128): durable already, nothing to send;
* the object the owner last saw at that key (its ETag, sent with the replica entry), or one with the owner's own
  provenance (its journal) at an older version of the same file, or of another of its files: replaceable,
  `If-Match` on the ETag judged;
* anything else (another node's provenance, or an object without provenance the owner never saw): another node's
  write, a conflict: left as it is.

The condition goes with the write (`Verdict.if_match` / `if_none_match`): a store that changed the key after the
judgement answers 412 and the write is dropped as a conflict, never retried blindly (the store is the fence).

One fallback: an object without provenance that the owner never saw (written by another tool, or by a release
before provenance) says nothing of its writer; for it alone the old rule answers (its LastModified against the
file's last change), so an upgrade never leaves behind an acknowledged file the previous release would have
uploaded. Every object ckptfs writes now carries provenance, so between ckptfs nodes no clock is compared.
"""

from __future__ import annotations

import logging
import math
import uuid
from typing import Callable
from dataclasses import dataclass

from .objects import NO_OBJECT, OTHER, PRECONDITION, ObjectInfo, StoreError
from .storeapi import LifecycleStore
from .upload import XXH3_META

log = logging.getLogger(__name__)

# user metadata keys (x-amz-meta-...): lower case, as S3 returns them
NODE_META = "ckptfs-node"  # the node whose file the object is (a taker writes the dead owner's name here)
JOURNAL_META = "ckptfs-journal"  # that node's journal id: an inode number means something only within one journal
INO_META = "ckptfs-ino"
VERSION_META = "ckptfs-version"
BY_META = "ckptfs-by"  # the node that sent the request (the owner itself, or the node that took it over)

WRITE, DURABLE, CONFLICT = "write", "durable", "conflict"


@dataclass(frozen=True)
class Provenance:
    """Whose file an object is: the node, its journal, the file's inode and version there."""

    node: str
    journal: str
    ino: int
    version: int

    def meta(self, by: str | None = None) -> dict[str, str]:
        """The user metadata that carries it (beside XXH3_META)."""
        return {NODE_META: self.node, JOURNAL_META: self.journal, INO_META: str(self.ino), VERSION_META: str(self.version),
                BY_META: by or self.node}

    def same_writer(self, other: "Provenance") -> bool:
        return (self.node, self.journal) == (other.node, other.journal)


def provenance_of(metadata: dict[str, str]) -> Provenance | None:
    """The provenance an object's metadata carries; None for an object written without it (another tool, an older
    release) or with a malformed one."""
    try:
        return Provenance(metadata[NODE_META], metadata.get(JOURNAL_META, ""), int(metadata[INO_META]),
                          int(metadata[VERSION_META]))
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Verdict:
    """What to do with a key: WRITE (under the condition given), DURABLE (the bytes are there), CONFLICT (another
    node's write: left alone)."""

    action: str
    if_match: str | None = None  # write only while the key's object has this ETag
    if_none_match: bool = False  # write only while the key holds nothing
    why: str = ""


def judge(mine: Provenance, size: int, xxh3: str | None, info: ObjectInfo | None, seen: str | None,
          legacy_mtime: float | None = None) -> Verdict:
    """May the file `mine` (`size` bytes with `xxh3`) replace what the key holds (`info`, None: nothing)?

    `seen`: the ETag of the object the owner last saw at this key ("" when it saw none, None when it did not say: an
    owner of an older release). `legacy_mtime`: the file's last change, compared with LastModified only for an object
    without provenance that the owner never saw (the module's docstring)."""
    if info is None:
        return Verdict(WRITE, if_none_match=True, why="nothing at the key")
    if xxh3 and info.size == size and info.metadata.get(XXH3_META) == xxh3:
        return Verdict(DURABLE, why="the same bytes are there")
    if seen and info.etag == seen:
        return Verdict(WRITE, if_match=info.etag, why="the object the owner last saw there")
    theirs = provenance_of(info.metadata)
    if theirs is not None and theirs.same_writer(mine):
        if theirs.ino != mine.ino or theirs.version < mine.version:
            return Verdict(WRITE, if_match=info.etag, why=f"the owner's own older write (ino {theirs.ino} version {theirs.version})")
        return Verdict(CONFLICT, why=f"the owner's own file at version {theirs.version}, not older than {mine.version}")
    if theirs is None and not seen and legacy_mtime is not None:
        if info.modified >= math.floor(legacy_mtime):  # LastModified has whole seconds: the same second counts as after
            return Verdict(CONFLICT, why="written after the owner's last change (an owner without provenance: by time)")
        return Verdict(WRITE, if_match=info.etag, why="older than the owner's last change (an owner without provenance: by time)")
    who = f"node {theirs.node}" if theirs is not None else "a writer without provenance"
    return Verdict(CONFLICT, why=f"written by {who}, not the object the owner last saw")


def after_refusal(mine: Provenance, size: int, xxh3: str, info: ObjectInfo | None) -> Verdict:
    """The owner's own drain, whose write conditional on the object it last saw was refused (412): the key changed
    since. Between nodes the last writer wins (docs/semantics.md): another node's object, or one without provenance,
    is replaced, under a condition on the ETag judged now. Never this file's own version at or past `mine`: a taker of
    this node wrote it from a replica, and this node is the stale one (issue 42, case 7: a late retry of v1)."""
    if info is None:
        return Verdict(WRITE, if_none_match=True, why="nothing at the key now")
    if xxh3 and info.size == size and info.metadata.get(XXH3_META) == xxh3:
        return Verdict(DURABLE, why="the same bytes are there")
    theirs = provenance_of(info.metadata)
    if theirs is not None and theirs.same_writer(mine) and theirs.ino == mine.ino and theirs.version >= mine.version:
        return Verdict(CONFLICT, why=f"this file's own version {theirs.version} is there (a takeover wrote it), not older "
                                     f"than {mine.version}")
    who = "this node's older write" if theirs is not None and theirs.same_writer(mine) else (
        f"node {theirs.node}'s write" if theirs is not None else "a write without provenance")
    return Verdict(WRITE, if_match=info.etag, why=f"{who}: the last writer wins")


def written_by(node: str, journal: str, info: ObjectInfo) -> bool | None:
    """Whether the object is one of this node's (its own drain's, or a taker's on its behalf): True or False by its
    provenance; None when it carries none (nothing says who wrote it)."""
    theirs = provenance_of(info.metadata)
    if theirs is None:
        return None
    return (theirs.node, theirs.journal) == (node, journal)


def own_stale_version(node: str, journal: str, info: ObjectInfo, lives_at_key: Callable[[int], bool]) -> bool:
    """After a conditional delete was refused (the key holds another object than the one deleted): True when that
    object is a version of one of the node's own files (by provenance: its drain's, or a takeover's on its behalf,
    which the node's journal never saw the ETag of) whose inode no longer has a file at that key
    (`lives_at_key(ino)` False). The delete is meant for it too. Another node's object, one without provenance, or
    one of a file of the node that is at that key now (a file created again where one was removed) stays."""
    theirs = provenance_of(info.metadata)
    return theirs is not None and (theirs.node, theirs.journal) == (node, journal) and not lives_at_key(theirs.ino)


def delete_own_stale_version(store: LifecycleStore, key: str, node: str, journal: str,
                             lives_at_key: Callable[[int], bool]) -> bool:
    """After a conditional delete was refused, or for a delete queued OWN_OBJECT_ONLY: the object at `key`, if it is
    a version of `node`'s own file no longer there (`own_stale_version`), deleted If-Match its ETag. Blocking (a
    worker thread). True when the key is done with (deleted, or nothing there); False when what is there stays."""
    try:
        info = store.head_object(key)
    except StoreError as e:
        if e.kind == NO_OBJECT:
            return True
        raise
    if not own_stale_version(node, journal, info, lives_at_key):
        return False
    try:
        store.delete_if_match(key, info.etag)
    except StoreError as e:
        if e.kind == NO_OBJECT:
            return True
        if e.kind == PRECONDITION:
            return False  # changed again: judged by whoever wrote it
        raise
    log.info("deleted %s: it held another version of %s's own file (uploaded for it by a takeover), not the one "
             "its journal knew", key, node)
    return True


def store_refuses_stale_writes(store: LifecycleStore, key_of_probe: str) -> bool:
    """Whether the store honours `If-None-Match: *` (and so fences a stale write with 412), asked once at mount: a probe
    object written twice with the condition (the second must be refused), then deleted. Blocking; StoreError when
    the store cannot be asked (the caller says it could not tell)."""
    key = f"{key_of_probe}{uuid.uuid4().hex}"
    store.put_bytes(key, b"{}", if_none_match=True)
    try:
        store.put_bytes(key, b"{}", if_none_match=True)
        return False
    except StoreError as e:
        if e.kind != PRECONDITION:
            raise
        return True
    finally:
        try:
            store.delete(key)
        except StoreError as e:
            if e.kind != NO_OBJECT:
                raise


def store_refuses_stale_deletes(store: LifecycleStore, key_of_probe: str) -> bool:
    """Whether the store honours `If-Match` on DeleteObject (SeaweedFS does; not every store that fences writes does):
    a probe object deleted with another ETag must stay (412), then is deleted with its own. Blocking; StoreError when
    the store cannot be asked."""
    key = f"{key_of_probe}{uuid.uuid4().hex}"
    etag = store.put_bytes(key, b"{}")
    try:
        store.delete_if_match(key, "0" * 32 if etag != "0" * 32 else "1" * 32)
    except StoreError as e:
        if e.kind == PRECONDITION:
            store.delete_if_match(key, etag)
            return True
        if e.kind not in (NO_OBJECT, OTHER):  # a store that refuses the header itself (400, 501) does not support it
            raise
    try:
        store.delete(key)
    except StoreError as e:
        if e.kind != NO_OBJECT:
            raise
    return False
