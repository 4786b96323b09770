"""Where a checkpoint's objects are: its files, and ckptfs's own objects (manifest, markers) next to them.

A directory checkpoint `run/step_100` holds its files under `run/step_100/` and
its own objects inside it (`run/step_100/.ckptfs-manifest.json`, ...). A file
checkpoint `run/checkpoints/epoch=0-step=100.ckpt` shares its directory with
other checkpoints, so its own objects are siblings named after it:
`run/checkpoints/.ckptfs-manifest.epoch=0-step=100.ckpt.json` (and
`.ckptfs-protected.<file>.json`, ...). They stay flat, not in a directory of
their own, so that one listing of the directory shows a file checkpoint with
its markers (a mount learns of protection from the listings it makes anyway),
a plain S3 tool copying or deleting the directory takes them along, and the
mount hides them like every `.ckptfs` name.

`listing` gives either kind in one shape: the checkpoint's files named
relative to `files_base`, its own objects under their bare names
(`.ckptfs-manifest.json`), so the jobs treat both kinds alike.
"""

from __future__ import annotations

from ..objects import Listing, RemoteObject
from ..patterns import Checkpoint
from ..storeapi import LifecycleStore
from . import codec
from .manifest import OWN_OBJECTS

JSON = ".json"


def own_name(ck: Checkpoint, name: str) -> str:
    """The name, relative to `files_base`, of ckptfs's object `name` (one of OWN_OBJECTS) for `ck`."""
    if not ck.file:
        return name
    stem = name[: -len(JSON)] if name.endswith(JSON) else name
    return f"{stem}.{ck.name}{JSON}"


def files_prefix(ck: Checkpoint) -> str:
    """Mount-relative prefix the checkpoint's file names are relative to ('' or ending in '/')."""
    if not ck.file:
        return ck.path + "/"
    return ck.parent + "/" if ck.parent else ""


def files_base(prefix: str, ck: Checkpoint) -> str:
    """The key prefix of the checkpoint's files in a bucket whose mount prefix is `prefix`."""
    return prefix + files_prefix(ck)


def own_key(prefix: str, ck: Checkpoint, name: str) -> str:
    """The key of ckptfs's object `name` for `ck` in a bucket whose mount prefix is `prefix`."""
    return files_base(prefix, ck) + own_name(ck, name)


def own_path(ck: Checkpoint, name: str) -> str:
    """The mount-relative path of ckptfs's object `name` for `ck`."""
    return files_prefix(ck) + own_name(ck, name)


def file_owner(name: str) -> tuple[str, str] | None:
    """(own object, file name) if `name` is ckptfs's object for a file checkpoint in the same directory."""
    for own in OWN_OBJECTS:
        stem = own[: -len(JSON)] + "."
        if name.startswith(stem) and name.endswith(JSON) and len(name) > len(stem) + len(JSON):
            return own, name[len(stem): -len(JSON)]
    return None


def pick(listing: Listing, ck: Checkpoint) -> Listing:
    """The objects of file checkpoint `ck` in a one-level listing of its directory, own objects under bare names."""
    objects: list[RemoteObject] = []
    for o in listing.objects:
        if o.name in (ck.name, ck.name + codec.SUFFIX):  # the file, or its compressed copy on a cold target
            objects.append(o)
            continue
        owner = file_owner(o.name)
        if owner is not None and owner[1] == ck.name:
            objects.append(RemoteObject(owner[0], o.size, o.etag, o.mtime, o.storage_class))
    return Listing([], objects, False)


def listing(store: LifecycleStore, prefix: str, ck: Checkpoint) -> Listing:
    """Every object of `ck` (recursive for a directory), in the shape the module docstring says. Blocking."""
    return listing_at(store, files_base(prefix, ck), ck)


def listing_at(store: LifecycleStore, base: str, ck: Checkpoint) -> Listing:
    """`listing`, given the key prefix of the checkpoint's files (`files_base`). Blocking."""
    if not ck.file:
        return store.list(base, recursive=True)
    return pick(store.list(base), ck)


def top(store: LifecycleStore, prefix: str, ck: Checkpoint) -> Listing:
    """The checkpoint's top level (one listing with delimiter): where its own objects are. Blocking."""
    listing = store.list(files_base(prefix, ck))
    return pick(listing, ck) if ck.file else listing
