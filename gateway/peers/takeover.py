"""Taking over a dead node: what it acknowledged and the bucket lacks is uploaded from its replicas here, as it would have.

A node holding replicas of a node whose lease ran out claims it (one conditional write of its record:
exactly one holder wins), then finishes its work in the owner's order: renamed durable files copied
inside the store, files uploaded, deletes applied, commit markers last, so a reader of the bucket sees the
checkpoint commit as if its writer had finished. The checkpoints it had work in are committed (`commit`: the
lifecycle tracker, once quiet). Only then does the record say `takeover_done` and the replicas go: a taker lost
before the commits leaves them, with the takeover, to the next holder. The `on_taken_over` hooks (a counter)
hear which checkpoints had work.

Never worse than doing nothing:
* a replica whose bytes do not have the xxh3 its owner sealed it with is not uploaded (counted, logged);
  an entry never sealed was never acknowledged, and is not uploaded either;
* a HEAD before each upload, judged by publishing.py's one rule: an object with the entry's xxh3 is durable
  already (skipped: a takeover interrupted and run again, here or by another holder, sends nothing twice); the
  object the owner last saw at the key, or one of its own older versions, is replaced; anything else was written
  by another node, and is never replaced (a conflict, counted). Never by clocks: a file given an older mtime
  (`cp -p`) or rewritten within a second of its last upload is still newer than its last upload;
* every write is conditional on what was judged (`If-Match` on that ETag, `If-None-Match: *` on nothing): an
  object that changed in between answers 412, a conflict, dropped and never retried (the store is the fence);
* each object uploaded carries the owner's provenance (node, journal, inode, version; publishing.py), as the
  owner's own drain would have written it, so the owner's reconcile and later takeovers judge it the same way;
* a commit marker whose directory holds a file that could not be made durable is held back: a checkpoint
  is never marked complete over a missing shard.
A failed request leaves the takeover unfinished (`takeover_done` false): it runs again, here or elsewhere.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

import trio

from .. import threads
from ..config import Config
from ..journal import OWN_OBJECT_ONLY
from ..namespace.keys import Keys
from ..objects import NO_OBJECT, PRECONDITION, ObjectInfo, StoreError
from ..publishing import CONFLICT, DURABLE, Provenance, Verdict, delete_own_stale_version, judge, provenance_of
from ..sizes import part_size_for, small_objects_in_flight
from ..upload import XXH3_META, Abandoned, head_or_none, file_digests, put_multipart, put_whole

from .membership import Membership
from .records import LIVE, may_claim
from .replicas import ReplicaDelete, ReplicaEntry, ReplicaStore

log = logging.getLogger(__name__)

RETRIED = (StoreError, OSError, Abandoned)  # a takeover that meets one is not done: the next round goes on with it
COMMIT_MARGIN_SECONDS = 60.0  # past checkpoint_quiet_seconds, what a takeover waits for its checkpoints' commits
MIN_LOOK_SECONDS = 0.2  # between rounds at least: an owner whose lease just ran out is claimed once, not spun on
MARGIN_SECONDS = 0.05  # after an expiry: is_dead wants expires_at <= now
HASHING_THREADS = 2  # replicas checked at once: each a sequential read of its file, on a node with its own work to do


class TakeoverStore(Protocol):
    """What a takeover asks of the object store (store.Store has it all)."""

    def head_object(self, key: str) -> ObjectInfo: ...

    def put_object(self, key: str, fd: int, size: int, crc32: str, metadata: dict[str, str], *, if_match: str | None = None,
                   if_none_match: bool = False) -> str: ...

    def put_object_body(self, key: str, body: bytes, crc32: str, metadata: dict[str, str], *, if_match: str | None = None,
                        if_none_match: bool = False) -> str: ...

    def create_multipart(self, key: str, metadata: dict[str, str]) -> str: ...

    def upload_part(self, key: str, upload_id: str, number: int, fd: int, offset: int, length: int, crc32: str) -> str: ...

    def complete(self, key: str, upload_id: str, parts: list[tuple[int, str, str]], *, if_match: str | None = None,
                 if_none_match: bool = False) -> str: ...

    def abort(self, key: str, upload_id: str) -> None: ...

    def copy(self, src: str, dst: str, size: int, part_size: int, multipart_threshold: int, *, if_match: str | None = None,
             if_none_match: bool = False) -> str: ...

    def delete(self, key: str) -> None: ...


@dataclass
class TakeoverReport:
    """What one takeover did, by entry."""

    owner: str
    uploaded: list[str] = field(default_factory=list)  # keys
    uploaded_bytes: int = 0
    copied: list[str] = field(default_factory=list)
    already_durable: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # an object another node wrote since: left alone
    corrupt: list[str] = field(default_factory=list)  # replica bytes without the sealed xxh3: not uploaded
    unsealed: list[str] = field(default_factory=list)  # never acknowledged: not uploaded
    lost: list[str] = field(default_factory=list)  # a renamed durable file whose source object is gone, no bytes here
    deleted: list[str] = field(default_factory=list)
    deletes_held: list[str] = field(default_factory=list)  # a rename's old key: the file is not durable under its new one
    deletes_kept: list[str] = field(default_factory=list)  # another object than the one the owner deleted is there now
    markers: list[str] = field(default_factory=list)  # commit markers uploaded (also in `uploaded`)
    markers_held: list[str] = field(default_factory=list)  # a file under their directory is not in the bucket
    checkpoints: list[str] = field(default_factory=list)  # mount-relative paths handed to `on_taken_over`
    noted: list[str] = field(default_factory=list)  # checkpoints whose files were all durable before the loss (committed too)


def seconds_to_expiry(membership: Membership, nodes: list[str]) -> float | None:
    """Seconds until the first of `nodes`' leases runs out by the records last read (None: none is live). A
    takeover looks then rather than at its next round: `claim` reads the record again, so a lease renewed since
    the last read costs one GET, never a wrong claim."""
    expiries = [rec.expires_at for n in nodes if (rec := membership.record_of(n)) is not None and rec.state == LIVE]
    return min(expiries) - membership.clock() if expiries else None


@dataclass
class _Checked:
    xxh3: str
    crcs: list[str]
    part_size: int


class Takeover:
    def __init__(self, cfg: Config, store: TakeoverStore, replicas: ReplicaStore, membership: Membership, keys: Keys) -> None:
        self.cfg, self.store, self.replicas, self.membership, self.keys = cfg, store, replicas, membership, keys
        self.on_taken_over: list[Callable[[list[str]], None]] = []
        # commits the checkpoints a takeover had work in, returning once they are committed (the daemon: the lifecycle
        # tracker's commit_taken_over); awaited before `takeover_done`, so a taker lost before the commits leaves the
        # takeover, commits included, to the next holder
        self.commit: Callable[[list[str], frozenset[str]], Awaitable[None]] | None = None
        # whether the store refuses a stale conditional delete (the peers' probe): deletes then carry the owner's ETag
        self.conditional_deletes: Callable[[], bool] = lambda: False
        self.parts = trio.CapacityLimiter(cfg.max_parts_in_flight)
        self.files = trio.CapacityLimiter(small_objects_in_flight(cfg.max_parts_in_flight))
        self.hashing = trio.CapacityLimiter(HASHING_THREADS)
        self.claimed: set[str] = set()  # won, not finished (a failed request): finished on the next round
        self._left_to_others: dict[str, str | None] = {}  # owner -> the ETag of its record that lists other holders
        self.takeovers_total = 0
        self.uploaded_files_total = 0
        self.uploaded_bytes_total = 0
        self.conflicts_total = 0
        self.corrupt_total = 0
        self.failures_total = 0
        self.last_error = ""

    # ------------------------------------------------------------------ the loop
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Look for dead owners this node holds replicas of every third of the lease TTL, and take each over."""
        task_status.started()
        while True:
            await self.round()
            await trio.sleep(self.next_look())

    def next_look(self) -> float:
        """Seconds to the next round: a third of the lease TTL, or sooner when a held owner's lease runs out before
        that (the node-lost time is the TTL plus this wait plus the uploads)."""
        wait = self.cfg.peer_lease_ttl / 3
        expiry = seconds_to_expiry(self.membership, self.replicas.owners())
        if expiry is not None and expiry > 0:  # one that ran out already and was not taken (another node won, or
            wait = min(wait, expiry + MARGIN_SECONDS)  # this one's own lease is not valid) waits for the next round
        return max(MIN_LOOK_SECONDS, wait)

    async def round(self) -> list[TakeoverReport]:
        """One look: every held owner that is dead (or claimed here and unfinished) taken over; the reports of those done."""
        dead_now = set(self.membership.dead())
        done = []
        for owner in self.replicas.owners():
            if owner not in dead_now and owner not in self.claimed or owner not in self.claimed and self._not_listed(owner):
                continue
            try:
                try:
                    report = await self.take_over(owner)
                except BaseExceptionGroup as group:  # from the parallel checks and uploads
                    _, other = group.split(RETRIED)
                    if other is not None:
                        raise
                    raise first(group) from None
            except RETRIED as e:
                self.failures_total += 1
                self.last_error = f"takeover of {owner}: {e}"
                log.warning("takeover of %s not finished, tried again in %.0fs: %s", owner, self.cfg.peer_lease_ttl / 3, e)
                continue
            if report is not None:
                done.append(report)
        return done

    def _not_listed(self, owner: str) -> str | None:
        """Why this node may not claim `owner` by its record as last read (None: it may): the record lists other
        holders (holders.py), whose copies are newer than the ones here. Logged once per record."""
        rec = self.membership.record_of(owner)
        if rec is None or may_claim(rec, self.membership.me):
            return None
        why = f"its record lists the holders {', '.join(rec.holders or [])}, not this node"
        if self._left_to_others.get(owner) != rec.etag:
            self._left_to_others[owner] = rec.etag
            log.info("node %s: %s: the replicas here are older than theirs, left to them", owner, why)
        return why

    async def take_over(self, owner: str) -> TakeoverReport | None:
        """Claim `owner` (unless claimed here already) and finish its work; None if another node won the claim."""
        if owner not in self.claimed:
            if not await self.membership.claim(owner):
                # the winner uploads; ours stay until its takeover is done (the sweep drops them then), in case
                # it dies before: a takeover can be taken over
                if self._not_listed(owner) is None:
                    log.info("node %s is dead and taken over by another holder of its replicas", owner)
                return None
            self.claimed.add(owner)
            log.warning("node %s is dead: taking it over (%d files, %d deletes held here)", owner,
                        len(self.replicas.entries(owner)), len(self.replicas.deletes(owner)))
        journal = self.claimed_journal(owner)
        report = await self.finish(owner)
        await self._commit(owner, report)
        self.claimed.discard(owner)
        if not await self.membership.mark_takeover_done(owner):
            # this node lost the claim meanwhile (paused past its own lease, and another holder took the takeover
            # over): that holder finishes; what was uploaded here it finds in the bucket
            log.warning("takeover of %s: this node no longer holds the claim; the node that does finishes it", owner)
            return None
        self.replicas.drop_owner(owner, journal, self.kept_incarnation(owner))  # what the claimed incarnation's journal sent
        self.takeovers_total += 1
        log.warning("takeover of %s done: %d files uploaded (%d bytes), %d copied, %d already durable, %d deletes, %d markers; "
                    "%d conflicts, %d corrupt, %d never acknowledged, %d markers held back", owner, len(report.uploaded),
                    report.uploaded_bytes, len(report.copied), len(report.already_durable), len(report.deleted),
                    len(report.markers), len(report.conflicts), len(report.corrupt), len(report.unsealed), len(report.markers_held))
        for hook in self.on_taken_over:
            try:
                hook(report.checkpoints)
            except Exception:  # noqa: BLE001 - a hook's bug must not undo a finished takeover
                log.exception("a hook on the takeover of %s failed", owner)
        return report

    async def _commit(self, owner: str, report: TakeoverReport) -> None:
        """The checkpoints the takeover had work in, committed before it is done: at once, unless other nodes wrote
        into them lately (what the takeover put there does not count: the owner's writes ended with it). Bounded by
        quiet and a margin for a retried commit; past that the takeover is marked done anyway and the commits stay
        with this node's tracker (a takeover held open for ever would keep the owner's name unusable)."""
        if self.commit is None or not report.checkpoints:
            return
        with trio.move_on_after(self.cfg.checkpoint_quiet_seconds + COMMIT_MARGIN_SECONDS) as waited:
            await self.commit(report.checkpoints, frozenset(report.uploaded + report.copied + report.already_durable))
        if waited.cancelled_caught:
            log.error("takeover of %s: its checkpoints are not all committed after %.0fs (%s); marked done anyway, this "
                      "node's tracker goes on committing them", owner, self.cfg.checkpoint_quiet_seconds + COMMIT_MARGIN_SECONDS,
                      ", ".join(report.checkpoints[:5]))

    def claimed_journal(self, owner: str) -> str | None:
        """The journal id of the incarnation claimed (its record as written by the claim): a takeover takes and drops
        what that journal's incarnations sent, never a successor's under the same name (None: a record of an earlier
        release, every entry)."""
        rec = self.membership.record_of(owner)
        return rec.journal_id or None if rec is not None else None

    def kept_incarnation(self, owner: str) -> str | None:
        """An incarnation of `owner` admitted by the listener that is not the claimed one (one that rejoined since):
        its replicas are not the takeover's to drop."""
        rec = self.membership.record_of(owner)
        admitted = self.membership.admitted.get(owner)
        return admitted if rec is not None and admitted != rec.incarnation else None

    # ---------------------------------------------------------------- the work
    async def finish(self, owner: str) -> TakeoverReport:
        """The owner's work, in its order: copies, uploads, deletes, markers. Raises on a failed request (run again)."""
        report = TakeoverReport(owner)
        latest: dict[str, ReplicaEntry] = {}
        journal = self.claimed_journal(owner)
        held = self.replicas.entries(owner, journal)
        for e in held:  # by seq: a later entry for a key supersedes an earlier one
            latest[e.key] = e
        entries = sorted(latest.values(), key=lambda e: e.seq)
        checked: dict[int, _Checked] = {}
        durable: set[str] = set()  # keys whose file is in the bucket now
        # each file uploads as soon as its own replica is checked (not after every check): the checks read replicas
        # while the copies and the first uploads are under way, which is most of a takeover's time
        async with trio.open_nursery() as nursery:
            checks: dict[int, trio.Event] = {}
            for e in entries:
                if not e.sealed:
                    report.unsealed.append(e.key)
                    log.info("takeover of %s: %s was never acknowledged (not sealed): not uploaded", owner, e.key)
                elif not e.copy_from:
                    checks[e.ino] = trio.Event()
                    nursery.start_soon(self._check, e, checked, report, checks[e.ino])
            # the copies first, in the owner's order: an object renamed away and a new file uploaded at its old key
            # must be copied before that upload replaces its source
            for e in entries:
                if e.sealed and e.copy_from:
                    await self._copy(e, report, durable)
            for e in entries:
                if e.ino in checks and not e.marker:
                    nursery.start_soon(self._publish_checked, e, checks[e.ino], checked, report, durable)
        by_ino, keys_held = {e.ino: e for e in held}, {e.key for e in held}
        for d in sorted(self.replicas.deletes(owner, journal), key=lambda d: d.seq):
            await self._delete(d, report, by_ino, keys_held, durable)
        missing = report.corrupt + report.unsealed + report.lost
        for e in entries:
            if e.marker and e.ino in checked:
                folder = e.key.rpartition("/")[0] + "/"
                if any(k.startswith(folder) for k in missing):
                    report.markers_held.append(e.key)
                    log.error("takeover of %s: commit marker %s held back: a file under its directory could not be made "
                              "durable (%s)", owner, e.key, ", ".join(k for k in missing if k.startswith(folder)))
                    continue
                await self._publish(e, checked[e.ino], report, durable)
                if e.key in report.uploaded:
                    report.markers.append(e.key)
        # the checkpoints to commit: not one with a file that could not be made durable (it is not complete, and never
        # will be from here: its writer's own tracker would not have committed it either)
        lost = {e.key: e for e in entries if e.key in set(missing)}
        incomplete = {e.checkpoint for e in lost.values() if e.checkpoint} | {e.key.rpartition("/")[0] for e in lost.values()}
        touched = [e for e in entries if e.key in durable]
        # and the checkpoints whose files were all durable before the owner was lost, not yet committed by it (their
        # replicas forgotten, noted here: ReplicaStore.forget): the owner's tracker state went with it, nothing else
        # would ever commit them. Committed as the owner would have, once quiet (the tracker; a manifest that already
        # describes the files is left as it is), never one with a file that could not be made durable.
        report.noted = [p for p in self.replicas.checkpoints(owner) if p not in incomplete and self.keys.of(p) not in incomplete]
        report.checkpoints = sorted({e.checkpoint or self.keys.path(e.key) for e in touched
                                     if e.checkpoint not in incomplete and e.key.rpartition("/")[0] not in incomplete}
                                    | {self.keys.path(d) for d in report.deleted if d.rpartition("/")[0] not in incomplete}
                                    | set(report.noted))
        if lost:
            log.error("takeover of %s: not committed, as files in them could not be made durable: %s", owner,
                      ", ".join(sorted({e.checkpoint or self.keys.path(e.key.rpartition("/")[0]) for e in lost.values()})))
        return report

    async def _check(self, e: ReplicaEntry, checked: dict[int, _Checked], report: TakeoverReport, done: trio.Event) -> None:
        """The replica's xxh3-128 against the one it was sealed with, and its parts' CRC32s in the same read; `done`
        is set however it ends (a file that failed its check is not in `checked`)."""
        try:
            await self._check_now(e, checked, report)
        finally:
            done.set()

    async def _check_now(self, e: ReplicaEntry, checked: dict[int, _Checked], report: TakeoverReport) -> None:
        part_size = part_size_for(e.size, self.cfg.part_size) if e.size >= self.cfg.multipart_threshold else max(e.size, 1)

        def digest() -> tuple[str, list[str]]:
            fd = os.open(e.path, os.O_RDONLY)
            try:
                return file_digests(fd, e.size, part_size)
            finally:
                os.close(fd)

        try:
            async with self.hashing:
                xxh3, crcs = await trio.to_thread.run_sync(digest)
        except (OSError, Abandoned) as err:
            xxh3, crcs = f"unreadable: {err}", []
        if xxh3 != e.xxh3:
            self.corrupt_total += 1
            report.corrupt.append(e.key)
            log.error("takeover of %s: the replica of %s does not have the xxh3 it was sealed with (%s, not %s): not uploaded",
                      e.owner, e.key, xxh3, e.xxh3)
            return
        checked[e.ino] = _Checked(xxh3, crcs, part_size)

    async def _head(self, key: str) -> ObjectInfo | None:
        await self.membership.admit()  # this node's own fence: a taker paused past its lease sends nothing more
        return await head_or_none(self.store, key)

    def _verdict(self, e: ReplicaEntry, info: ObjectInfo | None, report: TakeoverReport, durable: set[str]) -> Verdict | None:
        """publishing.judge's verdict on writing `e` over `info` (its condition with it); None (counted in `report`) when
        the bucket has it already, or has another node's write."""
        v = judge(provenance(e), e.size, e.xxh3, info, e.seen, legacy_mtime=e.mtime)
        if v.action == DURABLE:
            report.already_durable.append(e.key)
            durable.add(e.key)
            return None
        if v.action == CONFLICT:
            self._conflict(e, report, durable, v.why)
            return None
        return v

    def _conflict(self, e: ReplicaEntry, report: TakeoverReport, durable: set[str], why: str) -> None:
        self.conflicts_total += 1
        report.conflicts.append(e.key)
        durable.add(e.key)  # the key holds a newer file: later deletes of it must not remove that
        log.warning("takeover of %s: %s holds another node's write (%s): left as it is, not replaced by the replica",
                    e.owner, e.key, why)

    async def _copy(self, e: ReplicaEntry, report: TakeoverReport, durable: set[str]) -> None:
        """A durable file renamed by its owner: its object copied inside the store to the new key."""
        assert e.copy_from is not None
        v = self._verdict(e, await self._head(e.key), report, durable)
        if v is None:
            return
        await self.membership.admit()  # this node's own fence: a taker paused past its lease sends nothing more
        try:
            async with self.parts:  # conditional on what was judged, as an upload is: the store is the fence
                await threads.call(functools.partial(self.store.copy, e.copy_from, e.key, e.size,
                                                     part_size_for(e.size, self.cfg.part_size), self.cfg.copy_multipart_threshold,
                                                     if_match=v.if_match, if_none_match=v.if_none_match))
        except StoreError as err:
            if err.kind == PRECONDITION or err.kind == NO_OBJECT and v.if_match is not None and await self._head(e.copy_from):
                self._conflict(e, report, durable, f"it changed after it was judged: {err}")
                return
            if err.kind != NO_OBJECT:
                raise
            self.corrupt_total += 1
            report.lost.append(e.key)
            log.error("takeover of %s: %s was renamed from %s, which is no longer in the bucket: it cannot be made durable",
                      e.owner, e.key, e.copy_from)
            return
        report.copied.append(e.key)
        durable.add(e.key)

    async def _publish_checked(self, e: ReplicaEntry, check: trio.Event, checked: dict[int, _Checked],
                               report: TakeoverReport, durable: set[str]) -> None:
        await check.wait()
        c = checked.get(e.ino)
        if c is None:
            return  # corrupt or unreadable: counted by the check, never uploaded
        async with self.files:
            await self._publish(e, c, report, durable)

    async def _publish(self, e: ReplicaEntry, c: _Checked, report: TakeoverReport, durable: set[str]) -> bool:
        """Upload a checked replica unless the bucket has it or something newer; True if it is in the bucket now."""
        info = await self._head(e.key)
        v = self._verdict(e, info, report, durable)
        if v is None:
            return e.key in durable
        await self.membership.admit()  # this node's own fence: a taker paused past its lease sends nothing more
        meta = provenance(e).meta(by=self.membership.me)
        fd = os.open(e.path, os.O_RDONLY)
        try:
            try:
                if e.size < self.cfg.multipart_threshold:
                    await threads.call_with_fd(fd, lambda own: put_whole(self.store, e.key, own, e.size, expect=c.xxh3, metadata=meta,
                                                                         if_match=v.if_match, if_none_match=v.if_none_match))
                else:
                    await put_multipart(self.store, e.key, fd, e.size, c.part_size, c.crcs, {**meta, XXH3_META: c.xxh3}, self.parts,
                                        gate=self.membership.admit, if_match=v.if_match, if_none_match=v.if_none_match)
            except StoreError as err:
                # the key changed after it was judged (412), or was deleted under an If-Match (404): another node's
                # write won the race; dropped, never sent again blindly. Unless it is these very bytes (a retry of
                # this write whose first answer was lost): durable then.
                if err.kind not in (PRECONDITION, NO_OBJECT):
                    raise
                now = await self._head(e.key)
                if now is not None and c.xxh3 and now.size == e.size and now.metadata.get(XXH3_META) == c.xxh3:
                    report.already_durable.append(e.key)
                    durable.add(e.key)
                    return True
                self._conflict(e, report, durable, f"it changed after it was judged: {err}")
                return e.key in durable
        finally:
            os.close(fd)
        self.uploaded_files_total += 1
        self.uploaded_bytes_total += e.size
        report.uploaded.append(e.key)
        report.uploaded_bytes += e.size
        durable.add(e.key)
        log.info("takeover of %s: uploaded %s (%d bytes)", e.owner, e.key, e.size)
        return True

    async def _delete(self, d: ReplicaDelete, report: TakeoverReport, by_ino: dict[int, ReplicaEntry], keys_held: set[str],
                      durable: set[str]) -> None:
        """A delete the owner queued, as the owner's drain would apply it (namespace/uploads.py `ready_deletes`): never
        of a key one of its files has now (its upload replaces the object: a rename over a durable file, a new file
        where one was removed; whichever frame went first), and for a delete that waits for a file (a rename's old key:
        `after_ino`) only once that file is durable under its new key. A file held here but not made durable (never
        sealed, corrupt, its source gone) keeps the old key: the bucket keeps the file under one name, never neither. A
        file no longer held was forgotten as durable (or removed): its entry comes before its deletes on the link."""
        if d.key in keys_held:
            return
        waits = by_ino.get(d.after_ino) if d.after_ino is not None else None
        if waits is not None and waits.key not in durable:
            report.deletes_held.append(d.key)
            log.warning("takeover of %s: %s not deleted: %s, renamed from it, is not durable under its new name",
                        d.owner, d.key, waits.key)
            return
        await self.membership.admit()  # this node's own fence: a taker paused past its lease sends nothing more
        if d.etag == OWN_OBJECT_ONLY:  # the owner removed or renamed, while away, a file it never uploaded itself
            (report.deleted if await self._delete_own_stale_version(d) else report.deletes_kept).append(d.key)
            return
        etag = d.etag
        if not etag and self.conditional_deletes():
            # the owner did not know the object's ETag (a name never seen in a listing, an earlier release): judged by
            # the object there now, by its provenance, and deleted only as that object (If-Match)
            info = await self._head(d.key)
            if info is None:
                report.deleted.append(d.key)
                return
            writer = provenance_of(info.metadata)
            if writer is not None and writer.node != d.owner:
                report.deletes_kept.append(d.key)
                log.warning("takeover of %s: %s not deleted: it holds another node's object (written since)", d.owner, d.key)
                return
            etag = info.etag
        conditional = bool(etag) and self.conditional_deletes()
        try:
            if conditional:  # only the object the owner deleted: one another node wrote since stays
                await threads.call(functools.partial(self.store.delete_if_match, d.key, etag))
            else:
                await threads.call(functools.partial(self.store.delete, d.key))
        except StoreError as e:
            if e.kind == PRECONDITION and conditional:
                if await self._delete_own_stale_version(d):
                    report.deleted.append(d.key)
                    return
                report.deletes_kept.append(d.key)
                log.warning("takeover of %s: %s not deleted: it holds another object than the one the owner deleted "
                            "(written since)", d.owner, d.key)
                return
            if e.kind != NO_OBJECT:
                raise
        report.deleted.append(d.key)

    async def _delete_own_stale_version(self, d: ReplicaDelete) -> bool:
        """The key holds another version of the owner's own file than the one it deleted (by provenance: one a
        takeover uploaded for it, whose ETag its journal never saw): deleted too, If-Match. No file of the owner is at
        that key now (`_delete` returned before for one). True when the key is done with."""
        return await threads.call(functools.partial(delete_own_stale_version, self.store, d.key, d.owner, d.journal,
                                                    lambda ino: False))

    def stats(self) -> dict[str, Any]:
        return {"takeovers": self.takeovers_total, "takeover_uploaded_files": self.uploaded_files_total,
                "takeover_uploaded_bytes": self.uploaded_bytes_total, "takeover_conflicts": self.conflicts_total,
                "takeover_corrupt_replicas": self.corrupt_total, "takeover_failures": self.failures_total}


def provenance(e: ReplicaEntry) -> Provenance:
    """Whose file a replica is: the owner's, at the inode and version it sent (publishing.py)."""
    return Provenance(e.owner, e.journal or "", e.ino, e.version)


def first(group: BaseExceptionGroup) -> BaseException:
    """The first leaf of an exception group: the error a log line names."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
