"""What training code asks of ckptfs, as Python functions: `import ckptfs` (docs/training.md).

A job writes its checkpoints into the mount like into any directory; these functions ask the
mount's daemon, through its control socket (gateway/client.py), what the job cannot see from the
files: whether a checkpoint is durable in the bucket and committed, which committed checkpoint is
the newest (the one to resume from: the newest *directory* may be half-written), and they attach
the job's metadata to a checkpoint's manifest. Each works from any process on the node that may
use the socket (the user who mounted it, or root). A failure is a `CkptfsError` whose message is
the one line `ckptfs` prints for it.

Every function blocks; its `*_async` twin runs it in a worker thread of the running event loop,
asyncio or trio (found with sniffio), and leaves that thread behind if the caller is cancelled
(the daemon finishes a commit it started either way).
"""

from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, TypeVar

import sniffio

from ckptfs.client import CkptfsError, file_state, locate, locate_above, one_reply, requester, until_done, until_durable
from ckptfs.objects import finite
from ckptfs.peering import FLUSH_LEVELS

T = TypeVar("T")

# a file's state (its upload), or a checkpoint directory's (docs/lifecycle.md)
State = Literal["dirty", "uploading", "replicated", "durable", "archived", "restoring",
                "writing", "draining", "committed", "protected", "expiring"]
Level = Literal["durable", "replicated"]  # what wait_durable waits for (FLUSH_LEVELS)


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint as the bucket and this node know it (an entry of `ckptfs checkpoints --json`)."""

    path: Path  # the checkpoint's directory on this node
    step: int
    state: str  # writing, draining, replicated, committed, protected or expiring
    committed: bool  # a manifest describes it
    protected: bool
    metadata: dict[str, Any] = field(default_factory=dict)  # what the job gave when it committed it
    info: dict[str, Any] = field(default_factory=dict, repr=False)  # the whole entry (files, bytes, protection, ...)


@dataclass(frozen=True)
class Commit:
    """What committing a checkpoint wrote (the answer `ckptfs checkpoint commit` prints)."""

    path: Path
    step: int
    generation: int  # of its manifest
    written: bool  # False: already committed with this content and metadata
    changed: bool  # its files changed since its first manifest
    files: int
    bytes: int


# ------------------------------------------------------------------ the calls
def state(path: str | os.PathLike[str]) -> State:
    """A file's upload state (dirty, uploading, replicated with durability = peer, durable; archived or restoring if
    its class needs a restore), or a checkpoint directory's (writing, draining, replicated, committed, protected, expiring)."""
    path = _path(path, "state")
    root, rel = locate(path)
    if not os.path.isdir(path):
        return file_state(path)  # type: ignore[return-value]
    for entry in one_reply(root, {"cmd": "checkpoints", "path": rel})["checkpoints"]:
        if entry["path"] == rel:
            return entry["state"]  # type: ignore[no-any-return]
        if rel.startswith(entry["path"] + "/"):
            raise CkptfsError(f"{path} is inside checkpoint {root / entry['path']}: give the checkpoint's directory, or a file")
    raise CkptfsError(f"{path} is a directory but not a checkpoint (no directory on its path matches checkpoint_patterns): "
                      "give a checkpoint directory, or a file")


def wait_durable(path: str | os.PathLike[str], timeout: float | None = None, level: Level = "durable") -> None:
    """Block until every file under `path` written on this node is durable in the bucket (`ckptfs flush`).

    With `level="replicated"` (a mount with durability = peer), until each is durable or on `peer_replicas` other
    nodes' disks (`ckptfs flush --level replicated`): safe from the loss of this node, usually long before the bucket
    has it. TimedOut (a CkptfsError) after `timeout` seconds, saying how much is not durable (replicated) yet.
    """
    if level not in FLUSH_LEVELS:  # before anything is sent
        raise CkptfsError(f"wait_durable: level {level!r}: give \"durable\" (in the bucket) or \"replicated\" "
                          "(on peers' disks too, with durability = peer)")
    path = _path(path, "wait_durable")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise CkptfsError(f"wait_durable: timeout {timeout!r}: give a number of seconds greater than 0, or None to wait as long as it takes")
    root, rel = locate(path)
    until_durable(root, rel, timeout, path, level=level)


def commit(path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None) -> Commit:
    """Commit the checkpoint directory `path` now, with `metadata` in its manifest (`ckptfs checkpoint commit`).

    Waits until its files are durable, then writes the manifest; other nodes see the metadata in
    `ckptfs checkpoints --json`. Metadata must be a dict of JSON values (dicts, lists, strings, numbers, booleans,
    None); a float that is not finite (a diverged loss: NaN, inf) is stored as null, since JSON has none.
    """
    metadata = _json_object(metadata)  # before anything is sent
    path = _path(path, "commit")
    root, rel = locate(path)
    msg = until_done(root, {"cmd": "checkpoint_commit", "path": rel, "metadata": metadata}, "commit")
    return Commit(path=root / msg["path"], step=msg["step"], generation=msg["generation"], written=msg["written"],
                  changed=msg["changed"], files=msg["files"], bytes=msg["bytes"])


def checkpoints(run_dir: str | os.PathLike[str]) -> list[Checkpoint]:
    """The checkpoints at or below `run_dir`, as the bucket holds them plus those this node is writing."""
    root, rel = locate(_path(run_dir, "checkpoints"))
    return _checkpoints(root, rel)


def _checkpoints(root: Path, rel: str) -> list[Checkpoint]:
    entries = one_reply(root, {"cmd": "checkpoints", "path": rel})["checkpoints"]
    return [Checkpoint(path=root / e["path"], step=e["step"], state=e["state"], committed=bool(e.get("committed")),
                       protected=bool(e.get("protected")), metadata=dict(e.get("metadata") or {}), info=e) for e in entries]


def latest(run_dir: str | os.PathLike[str], committed: bool = True) -> Checkpoint | None:
    """The checkpoint to resume from: the newest (highest step) under `run_dir` that is committed, or None.

    Committed means a manifest describes it and this node has no unfinished work in it: a newer
    directory that is half-written, still draining or was never committed is skipped. With
    `committed=False`, the newest checkpoint whatever its state (what the trainers pick by name).
    A `run_dir` that does not exist yet (in a mount) has none.
    """
    root, rel = locate_above(_path(run_dir, "latest"))
    if not (root / rel).exists():
        return None
    found = [c for c in _checkpoints(root, rel) if not committed or (c.committed and c.state in ("committed", "protected"))]
    return max(found, key=lambda c: (c.step, str(c.path)), default=None)


def protect(path: str | os.PathLike[str], reason: str) -> str:
    """Protect a committed checkpoint (`ckptfs protect`): no ckptfs mount changes or deletes it. Returns the daemon's message."""
    return _audited("protect", path, reason)


def unprotect(path: str | os.PathLike[str], reason: str) -> str:
    """Lift a checkpoint's protection (`ckptfs unprotect`). Returns the daemon's message."""
    return _audited("unprotect", path, reason)


def _audited(cmd: str, path: str | os.PathLike[str], reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise CkptfsError(f"{cmd} needs a non-empty reason: it goes to the audit log ({cmd}(path, \"why\"))")
    root, rel = locate(_path(path, cmd))
    return one_reply(root, {"cmd": cmd, "path": rel, "who": requester(), "reason": reason}, timeout=None)["message"]  # type: ignore[no-any-return]


def _path(path: Any, call: str) -> str:
    """`path` as a string, or a CkptfsError in the API's words (os.fspath's TypeError names no call)."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise CkptfsError(f"{call}: the path must be a str or a pathlib.Path, not {type(path).__name__}") from None


def _json_object(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """`metadata` as a JSON object, or a CkptfsError naming what is not JSON (before anything is sent)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise CkptfsError(f"commit: metadata must be a dict (a JSON object, e.g. {{\"loss\": 0.25}}), not {type(metadata).__name__}")
    doc = finite(dict(metadata))
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CkptfsError(f"commit: metadata must be JSON (dicts, lists, strings, numbers, booleans, None): {e}") from None
    if not all(isinstance(k, str) for k in doc):
        raise CkptfsError("commit: metadata keys must be strings")
    return doc  # type: ignore[no-any-return]


# ------------------------------------------------------------------ async twins
async def state_async(path: str | os.PathLike[str]) -> State:
    """`state` without blocking the event loop (asyncio or trio)."""
    return await _in_thread(state, path)


async def wait_durable_async(path: str | os.PathLike[str], timeout: float | None = None, level: Level = "durable") -> None:
    """`wait_durable` without blocking the event loop (asyncio or trio)."""
    await _in_thread(wait_durable, path, timeout, level)


async def commit_async(path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None) -> Commit:
    """`commit` without blocking the event loop (asyncio or trio)."""
    return await _in_thread(commit, path, metadata)


async def checkpoints_async(run_dir: str | os.PathLike[str]) -> list[Checkpoint]:
    """`checkpoints` without blocking the event loop (asyncio or trio)."""
    return await _in_thread(checkpoints, run_dir)


async def latest_async(run_dir: str | os.PathLike[str], committed: bool = True) -> Checkpoint | None:
    """`latest` without blocking the event loop (asyncio or trio)."""
    return await _in_thread(latest, run_dir, committed)


async def protect_async(path: str | os.PathLike[str], reason: str) -> str:
    """`protect` without blocking the event loop (asyncio or trio)."""
    return await _in_thread(protect, path, reason)


async def unprotect_async(path: str | os.PathLike[str], reason: str) -> str:
    """`unprotect` without blocking the event loop (asyncio or trio)."""
    return await _in_thread(unprotect, path, reason)


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run the blocking `fn(*args)` in a thread of the running library; abandon it if the caller is cancelled.

    trio and asyncio are only ever imported here, once their loop is running (already loaded):
    `import ckptfs` must not load either.
    """
    library = sniffio.current_async_library()
    call = functools.partial(fn, *args)
    if library == "trio":
        import trio

        return await trio.to_thread.run_sync(call, abandon_on_cancel=True)
    if library == "asyncio":
        import asyncio

        # a daemon thread of its own, not the loop's executor: asyncio.run() waits for the executor's
        # threads at its end, and a cancelled wait_durable's thread may block for a long time
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.done():
                return  # the caller was cancelled
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def run() -> None:
            try:
                result, error = call(), None
            except BaseException as e:  # handed to the awaiting task
                result, error = None, e
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

        threading.Thread(target=run, name=f"ckptfs-{fn.__name__}", daemon=True).start()
        return await future
    raise CkptfsError(f"ckptfs's async functions run under asyncio or trio, not {library}")
