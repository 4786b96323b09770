"""Committing checkpoints: notice when one written here is done, and write its manifest.

The namespace says which files are not durable yet (dirty, uploading), which
are open for writing and which deletions are queued; the checkpoint each
belongs to is *writing* (a file open for writing) or *draining* (closed, not
yet durable) on this node, or *replicated* (with durability = peer: every such
file is on peers' disks too, so the loss of this node loses none of it; the
daemon hands in `replicated`, the peers' answer per inode, so the lifecycle
never imports the peers package). A checkpoint that had local work becomes *active*;
once it has had none for `checkpoint_quiet_seconds`, and the bucket agrees
(no multipart upload in progress under it, no object newer than the quiet
period: other nodes may be writing shards of the same step), the manifest is
written.

Nothing of this is saved on the side: after a restart (an unmount, a SIGKILL, a
reboot) the checkpoints left to commit are derived from the journal, which
knows every file a close on this node left to upload (`Journal.written_here`),
and from the bucket, which says whether a manifest already describes them. A
state file written at the right moment would miss exactly the checkpoint that
became durable just before the stop, and would remember checkpoints the
bucket no longer holds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import trio

from ..journal import ROOT_INODE
from ..namespace.backlog import name_matcher
from ..peering import node_name_of
from ..objects import StoreError, finite
from .manifest import MANIFEST, MOVED, FileEntry, LifecycleError, Manifest, files_of, label, next_manifest, signature, write_manifest
from . import place, tiers
from ..patterns import Checkpoint
from .context import Context

log = logging.getLogger(__name__)

LEGACY_STATE_FILE = "lifecycle-active.json"  # what versions before issue 35 kept; removed at start
RETRY_SECONDS = 10.0
RECOVER_PAGE = 2000  # journal rows read at a time while deriving the work left by the last run
RECOVERED_PER_TICK = 32  # checkpoints derived at start that one tick checks against the bucket
WORK_RANK = {"replicated": 0, "draining": 1, "writing": 2}  # a checkpoint shows the busiest of its files' states


@dataclass
class Active:
    step: int
    last_work: float  # wall time local work was last seen under it
    next_check: float = 0.0
    file: bool = False  # a checkpoint saved as one file (patterns.py)
    recovered: bool = False  # derived from the journal at start: it may have been committed before the stop
    # files put in the bucket here for another node (a takeover of a dead peer): the bucket, not this node's
    # journal, says whether the checkpoint is there
    elsewhere: bool = False
    # keys a takeover here put in the bucket (or found there) for the dead owner: its writes ended with it, so they do
    # not hold the commit back as another node's recent writes would
    taken_over_keys: frozenset[str] = frozenset()


class Tracker:
    def __init__(self, lc: Context, cache_dir: str) -> None:
        self.lc = lc
        self.active: dict[str, Active] = {}
        self.work: dict[str, str] = {}  # checkpoint path -> writing | draining | replicated, as of the last tick
        # durability = peer: whether a file (by inode) not yet durable is on peer_replicas peers' disks (Peers.is_replicated,
        # wired by the daemon); None: no peers, a file is durable or single-copy
        self.replicated: Callable[[int], bool] | None = None
        self.commits_total = 0
        self.commit_errors_total = 0
        # checkpoints a takeover waits on (commit_taken_over): set once each is committed or needs no commit
        self.commits_awaited: dict[str, trio.Event] = {}
        try:
            (Path(cache_dir) / LEGACY_STATE_FILE).unlink(missing_ok=True)
        except OSError as e:
            log.info("cannot remove %s (no longer used): %s", Path(cache_dir) / LEGACY_STATE_FILE, e)

    # ---------------------------------------------------------------- restart
    async def recover(self) -> None:
        """Make active every checkpoint this node wrote a file into, as the journal says: what the last run
        left uncommitted (files durable just before the stop, or still draining) is among them.

        Each is then judged like any other once quiet: one with a manifest that already describes its files
        costs a listing and a read of the manifest, and is dropped; one the bucket no longer holds is dropped
        without a trace. Quiet is counted from the newest close of its files on this node."""
        lc = self.lc
        j = lc.ns.journal
        dirs: dict[int, str | None] = {}
        found: dict[str, Active] = {}
        after = 0
        while rows := j.written_here(after, RECOVER_PAGE):
            for _, parent, name, closed_at in rows:
                if parent not in dirs:
                    dirs[parent] = j.path_of(parent)
                where = dirs[parent]
                if where is None:
                    continue
                ck = lc.patterns.checkpoint_of(f"{where}/{name}".lstrip("/"), False)
                if ck is None:
                    continue
                a = found.setdefault(ck.path, Active(ck.step, closed_at, file=ck.file, recovered=True))
                a.last_work = max(a.last_work, closed_at)
            after = rows[-1][0]
            await trio.sleep(0)  # a journal of millions of files: let requests in between pages
        for path, a in found.items():
            self.active.setdefault(path, a)
        if found:
            log.info("%d checkpoints hold files written on this node: each is committed once quiet unless its manifest "
                     "already describes it", len(found))

    # ------------------------------------------------------------- local work
    def scan(self) -> dict[str, str]:
        """Checkpoints with local work now: path -> 'writing' (open for writing), 'draining', or 'replicated' (every
        file of it not yet durable is on peers' disks; queued deletions count as draining)."""
        lc = self.lc
        j = lc.ns.journal
        files = lc.ns.files
        out: dict[str, str] = {}
        paths: dict[int, str | None] = {}

        def path_of(ino: int) -> str | None:
            if ino not in paths:
                paths[ino] = j.path_of(ino)
            return paths[ino]

        def note(path: str | None, is_dir: bool, state: str) -> None:
            if path is None:
                return
            ck = lc.patterns.checkpoint_of(path, is_dir)
            if ck is not None and WORK_RANK[state] > WORK_RANK.get(out.get(ck.path, ""), -1):
                out[ck.path] = state
                if ck.path not in self.active:
                    self.active[ck.path] = Active(ck.step, time.time(), file=ck.file)

        # the namespace's in-memory backlog and delete queue: a path lookup per directory, not per file waiting
        replicated = self.replicated
        for e in lc.ns.backlog.entries():
            parent = path_of(e.parent)
            live = files.live.get(e.ino)
            note(None if parent is None else f"{parent}/{e.name}".lstrip("/"), False,
                 "writing" if live is not None and live.writers else
                 "replicated" if replicated is not None and replicated(e.ino) else "draining")
        for ino, live in files.live.items():
            if live.writers:
                note(path_of(ino), False, "writing")
        for _, key, _ in lc.ns.deletes:
            note(lc.keys.path(key).rstrip("/"), key.endswith("/"), "draining")
        return out

    def settled(self, key: str) -> None:
        """An upload (or deletion) finished: its checkpoint is active even if no tick saw its work.

        A small checkpoint can be written and drained between two ticks; without this the
        tracker would never commit it.
        """
        ck = self.lc.patterns.checkpoint_of(self.lc.keys.path(key).rstrip("/"), key.endswith("/"))
        if ck is not None and ck.path not in self.active:
            self.active[ck.path] = Active(ck.step, time.time(), file=ck.file)

    def taken_over(self, paths: list[str], keys: frozenset[str] | None = None) -> None:
        """A dead node's checkpoints under these mount-relative paths (checkpoints or files in them) are this node's
        to commit, as if their writer had finished: once quiet (a holder that noted them, Sweep.on_checkpoints), or,
        with `keys` (what a takeover here put in the bucket for it: commit_taken_over), once the bucket is quiet but
        for those keys. A manifest that lacks the new files gets a new generation; one that already describes them
        is left alone."""
        now = time.time()
        last_work = now - self.lc.cfg.checkpoint_quiet_seconds if keys is not None else now
        for path in paths:
            ck = self.lc.patterns.checkpoint_of(path, None)
            if ck is None:
                continue
            a = self.active.get(ck.path)
            if a is None:
                a = self.active[ck.path] = Active(ck.step, last_work, file=ck.file, elsewhere=True)
            else:
                a.last_work, a.elsewhere, a.recovered = max(a.last_work, last_work) if keys is not None else now, True, False
            a.taken_over_keys = a.taken_over_keys | (keys or frozenset())

    async def commit_taken_over(self, paths: list[str], keys: frozenset[str]) -> None:
        """`taken_over`, then return once each of those checkpoints is committed, or found to need no commit (removed,
        moved, a file still under a temporary name). A takeover is done only after this (peers/takeover.py): a taker
        lost between its uploads and these commits leaves them to the next holder, not to nobody. Commit errors are
        retried here as any commit's; the caller bounds the wait."""
        self.taken_over(paths, keys)
        if not self.lc.patterns.enabled:
            return
        waits = []
        for path in paths:
            ck = self.lc.patterns.checkpoint_of(path, None)
            if ck is not None and ck.path in self.active:
                waits.append(self.commits_awaited.setdefault(ck.path, trio.Event()))
        for event in waits:
            await event.wait()

    def _settle(self, path: str) -> None:
        self.active.pop(path, None)
        event = self.commits_awaited.pop(path, None)
        if event is not None:
            event.set()

    def local_state(self, path: str) -> str | None:
        return self.work.get(path)

    def local_checkpoints(self) -> list[Checkpoint]:
        """Checkpoints with work on this node now (writing, draining, replicated), which the bucket may not show yet. One that
        waits only for quiet is in the bucket (the catalogue's walk finds it); one that is neither is not listed:
        a checkpoint with no file open and nothing to upload is never shown as being written here."""
        return [Checkpoint(p, a.step, a.file) for p, a in self.active.items() if p in self.work]

    # -------------------------------------------------------------------- loop
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self.lc.patterns.enabled:
            return
        await self.recover()
        quiet = self.lc.cfg.checkpoint_quiet_seconds
        tick = min(5.0, max(0.25, quiet / 4))
        while True:
            await self.tick()
            await trio.sleep(tick)

    def refresh(self) -> None:
        """Learn which checkpoints have local work now rather than at the next tick (up to 5 s away): a request
        right after a commit (`checkpoints`, `protect`, `ckptfs.latest`) must not see that checkpoint as draining."""
        self.work = self.scan()
        now = time.time()
        for path in self.work:
            a = self.active[path]
            a.last_work = now
            a.recovered = False  # work seen in this run: judged as any checkpoint being written

    async def tick(self) -> None:
        self.refresh()
        now = time.time()
        quiet = self.lc.cfg.checkpoint_quiet_seconds
        recovered_checks = 0
        # what this run wrote first; the checkpoints derived at start a few per tick, so that a node whose journal
        # names thousands of them (each a listing and a manifest read) does not hold up the commit of a new one
        for path, a in sorted(self.active.items(), key=lambda item: item[1].recovered):
            if path in self.work or now - a.last_work < quiet or now < a.next_check:
                continue
            if a.recovered:
                recovered_checks += 1
                if recovered_checks > RECOVERED_PER_TICK:
                    break
            try:
                done = await self._try_commit(path, a, now, quiet)
            except (StoreError, LifecycleError) as e:
                self.commit_errors_total += 1
                log.warning("checkpoint %s: commit failed, will retry: %s", path, e)
                a.next_check = now + RETRY_SECONDS
                continue
            if done:
                self._settle(path)

    async def _try_commit(self, path: str, a: Active, now: float, quiet: float) -> bool:
        """Commit `path` if the bucket is quiet too; True when nothing is left to do for it."""
        lc = self.lc
        ck = Checkpoint(path, a.step, a.file)
        row = lc.ns.journal.resolve(path)
        if not a.elsewhere and (row is None or row.is_dir == ck.file):
            if ck.file:
                await self._forget_file(ck)
            return True  # removed or moved away: nothing to commit
        base = place.files_base(lc.keys.prefix, ck)
        uploads = await lc.io(lc.store.list_uploads, base if not ck.file else lc.keys.of(path))
        # an upload open at a key a takeover here then wrote whole is one of its failed attempts whose abort failed too
        # (a store answering 503s: campaign seed 307462893, episode 5), not another node at work: it held the commit
        # until a later mount aborted it as stale
        if any(key not in a.taken_over_keys for key, _, _ in uploads):
            a.last_work = now  # another node is still uploading into it
            return False
        listing = await lc.io(place.listing, lc.store, lc.keys.prefix, ck)
        if await self._moved_away(path, listing):
            if a.recovered:
                return True  # moved after its commit, before the restart: nothing written here since
            log.warning("checkpoint %s was moved to its cold target: files written into it are not committed; bring it back "
                        "first with `ckptfs restore %s`", path, path)
            return True
        files = files_of(listing, base)
        if not files:
            return True  # nothing in it (yet, or any more): committed when files arrive
        if a.elsewhere and (temporary := temporary_names(files, lc.cfg.temporary_dir_patterns)):
            # a lost node's checkpoint is committed only complete: a file still under a temporary name (DCP's
            # `.metadata.tmp`, a shard in `step.tmp/`) means its writer never finished the save, or its rename never
            # reached the bucket; its own tracker would have waited for the rename. A later takeover that puts the
            # final names there hands it over again.
            log.error("checkpoint %s (its node was lost) is not committed: %s still under a temporary name in the bucket",
                      path, ", ".join(temporary[:5]))
            return True
        if a.recovered and any(o.name == MANIFEST for o in listing.objects):
            manifest = await lc.catalogue.manifest(ck)
            if manifest is not None and signature(manifest.files) == signature(files):
                return True  # committed before the restart, unchanged since
        newest = max((f.mtime for f in files if f.key not in a.taken_over_keys), default=0.0)
        if now - newest < quiet:
            a.last_work = newest  # written in the bucket lately (another node): wait for quiet
            return False
        await self.commit(ck, files, "quiet", None)
        return True

    async def _forget_file(self, ck: Checkpoint) -> None:
        """A file checkpoint removed (or renamed) through the mount: its own objects, siblings of the file in the
        bucket, go too once the file's object is gone; a directory's leave with it (Lifecycle._own_objects)."""
        lc = self.lc
        listing = await lc.io(place.listing, lc.store, lc.keys.prefix, ck)
        if any(o.name == ck.name for o in listing.objects):
            return  # its object is still there (a delete queued, or written by another node): keep its manifest
        for o in listing.objects:
            await lc.io(lc.store.delete, place.own_key(lc.keys.prefix, ck, o.name))

    async def commit(self, ck: Checkpoint, files: list[FileEntry] | None, how: str, metadata: dict[str, Any] | None) -> tuple[Manifest, bool]:
        """Write `ck`'s manifest (from `files`, or a fresh listing); (manifest in the bucket, written by this call).

        A metadata value that is not a finite number (a diverged loss: NaN) is stored as null: JSON has no NaN, and
        NaN != NaN would make every later commit with the same metadata look like new metadata."""
        lc = self.lc
        base = place.files_base(lc.keys.prefix, ck)
        if files is None:
            listing = await lc.io(place.listing, lc.store, lc.keys.prefix, ck)
            if await self._moved_away(ck.path, listing):
                raise LifecycleError(f"{ck.path} was moved to its cold target (`ckptfs checkpoints` shows where): "
                                     f"bring it back with `ckptfs restore {ck.path}` before committing it again")
            files = files_of(listing, base)
        if not files:
            raise LifecycleError(f"{ck.path} holds no files in the bucket: nothing to commit (is it written and flushed?)")
        await self._checksums(ck.path, files)
        manifest, wrote = await lc.io(
            write_manifest, lc.store, place.own_key(lc.keys.prefix, ck, MANIFEST),
            lambda existing: next_manifest(existing, ck.path, ck.step, files, how, finite(metadata), node=node_name_of(lc.cfg)),
        )
        self._settle(ck.path)
        if wrote:
            self.commits_total += 1
            change = " (changed since its last manifest)" if manifest.changed and manifest.generation > 1 else ""
            log.info("checkpoint %s committed: manifest generation %d, %d files, %d bytes%s",
                     ck.path, manifest.generation, len(manifest.files), manifest.bytes, change)
            await tiers.tag(lc, ck, manifest, "committed", False)
            for hook in lc.on_commit:
                hook(ck.path)
        return manifest, wrote

    async def _moved_away(self, path: str, listing: Any) -> bool:
        """Whether the checkpoint's files are (going) on its cold target (lifecycle/coldmove.py): never committed from here then."""
        if not any(o.name == MOVED for o in listing.objects):
            return False
        record, _ = await self.lc.mover.record(path)
        return label(record) is not None

    async def _checksums(self, path: str, files: list[FileEntry]) -> None:
        """Each file's xxh3-128: from the journal when this node uploaded those bytes, else from the object's metadata."""
        lc = self.lc
        j = lc.ns.journal
        todo = []
        for f in files:
            row = j.resolve(f.key[len(lc.keys.prefix):])
            if row is not None and row.ino != ROOT_INODE and row.etag == f.etag and row.xxh3:
                f.xxh3 = row.xxh3
            else:
                todo.append(f)

        async def head(f: FileEntry) -> None:
            info = await lc.io(lc.store.head_object, f.key)
            if info.etag == f.etag:
                f.xxh3 = info.metadata.get("xxh3")

        async with trio.open_nursery() as nursery:
            for f in todo:
                nursery.start_soon(head, f)


def temporary_names(files: list[FileEntry], patterns: list[str]) -> list[str]:
    """The checkpoint's files with a temporary name: the name, or a directory on its path, matches
    `temporary_dir_patterns` (which cover `*.tmp`, `.tmp*`, `tmp-*` and Orbax's temporary directories)."""
    matcher = name_matcher(patterns)
    return [f.path for f in files if any(matcher.fullmatch(part) for part in f.path.split("/"))]
