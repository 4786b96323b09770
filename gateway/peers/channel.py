"""One chosen peer of the owner's sender (peers/sender.py) and what it is owed: per file byte ranges, a truncate,
the entry meta and a seal; the pump that sends them, and the seals beside it.

Why seals run beside the pump, one task per file: a seal hashes the whole file (under passthrough it must read it
again: the kernel may have rewritten bytes in place that no size poll sees), and a pump that sealed files one
after another made each writer's fsync wait for the others' hashes, and every hash wait for the file's last bytes.
A seal task starts when a file is to be sealed (an fsync, a FLUSH, a close), hashes while the pump still sends the
file's tail (both read the page cache), then sends the seal frame once the file's bytes are out: frames leave in
order, so the peer checks the bytes the owner hashed.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Protocol

import trio

from ..journal import Row
from ..namespace import Namespace
from .bandwidth import TokenBucket
from .digests import Digests
from .link import Held, PeerError, PeerLink, SealMismatch

log = logging.getLogger(__name__)

CHUNK = 16 << 20  # bytes per write frame (sendfile from the cache file)
MAX_EXTENTS = 64  # ranges owed per file before they are merged into one covering range
POLL_SECONDS = 0.05  # passthrough writers' sizes; a seal that found its file changing is tried again after it


class Names(Protocol):
    """The sender's numbering of name changes (peers/names.py)."""

    def target(self) -> tuple[int, int]: ...


class Sender(Protocol):
    """The owner's sender (peers/sender.py) as its channels see it."""

    ns: Namespace
    timeout: float
    replicas: int
    replicated_bytes: int
    files: set[int]
    single_since: dict[int, float]
    bandwidth: TokenBucket
    digests: Digests
    on_sent: Callable[[int], None]
    clock: Callable[[], float]

    def current(self, ino: int) -> tuple[Row, int, int] | None: ...
    def holds(self, ch: "Channel", ino: int, version: int) -> bool: ...
    def sealed_on(self, ino: int, version: int) -> int: ...
    @property
    def names(self) -> Names: ...
    def meta_of(self, ino: int, row: Row, version: int, size: int) -> dict[str, Any] | None: ...
    def next_seq(self) -> int: ...
    def notify(self) -> None: ...


@dataclass
class Owed:
    """What one channel still has to send its peer of one file."""

    since: float  # monotonic: the oldest change not yet sent
    extents: list[list[int]] = field(default_factory=list)  # [start, end), in the order written
    truncate_to: int | None = None  # the smallest size truncated to since the last send
    entry: bool = True  # the entry meta (key...) to (re)send

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        last = self.extents[-1] if self.extents else None
        if last is not None and start <= last[1] and end >= last[0]:
            last[0], last[1] = min(last[0], start), max(last[1], end)
        else:
            self.extents.append([start, end])
        if len(self.extents) > MAX_EXTENTS:
            self.extents = [[min(e[0] for e in self.extents), max(e[1] for e in self.extents)]]

    def truncate(self, size: int) -> None:
        self.truncate_to = size if self.truncate_to is None else min(self.truncate_to, size)
        self.extents = [[s, min(e, size)] for s, e in self.extents if s < size]


class Channel:
    """One chosen peer and what it is owed."""

    def __init__(self, node: str, addr: str) -> None:
        self.node, self.addr = node, addr
        self.link: PeerLink | None = None
        self.ready = False  # connected and its holdings learnt
        self.insist = False  # every other candidate had its share of owners: asked to take us anyway (spread.py)
        self.failed = False
        self.owed: dict[int, Owed] = {}
        self.sealed: dict[int, int] = {}  # ino -> version sealed on the peer
        self.seal_wanted: set[int] = set()
        self.forgets: dict[int, int | None] = {}  # ino -> version durable (None: removed) to tell the peer
        self.deletes_sent: set[int] = set()
        self.deletes_due = True  # the queued deletes to be looked at again
        self.entries_sent: set[int] = set()
        self.replicated_bytes = 0
        self.wake = trio.Event()
        self.sealing: set[int] = set()  # files whose seal task runs (hashing, or waiting for the answer)
        self.sending: int | None = None  # the file whose frames the pump is sending now
        self.sent = trio.Event()  # set (and replaced) each time the pump is done with a file's frames
        # names: ino -> the name-change number (peers/names.py `paths_changed`; 0 for a new channel's
        # files) of a rename, unlink or replace whose entry (or forget) this peer has not been sent yet
        self.names_due: dict[int, int] = {}
        self._due_counts: dict[int, int] = {}  # name change -> files of it in names_due (a waiter's check costs the changes)
        self.names_confirmed: tuple[int, int] = (0, 0)  # (name change, delete id) up to which the peer holds the names
        self.names_asked = False
        self.confirming = False  # the confirmer task runs
        self.copy_entries: dict[int, int] = {}  # ino -> version of the last entry sent sealed as a renamed durable file
        self.nursery: trio.Nursery | None = None  # the pump's, the seal tasks' and the link's watch
        self.error: BaseException | None = None  # what failed the channel in one of them
        self.scope = trio.CancelScope()  # the channel's whole life (`Sender._serve`): `close` cancels it

    def close(self, why: str) -> None:
        """Judge the peer gone (its node record is down): the channel fails as if a frame had, and its files go to the
        next candidate. Whatever it was doing (connecting, sending, waiting for a seal) is cancelled."""
        if self.error is None:
            self.error = PeerError(f"peer {self.node}: {why}")
        self.scope.cancel()

    def owe(self, ino: int, now: float) -> Owed:
        owed = self.owed.get(ino)
        if owed is None:
            owed = self.owed[ino] = Owed(since=now)
        self.wake.set()
        return owed

    def learn(self, s: Sender, held: dict[int, Held]) -> None:
        """A new channel owes its peer every file not yet durable, but for those it already holds sealed at their
        current version and size (after a restart: replicated without resending)."""
        now = s.clock()
        for ino in list(s.files):
            cur = s.current(ino)
            if cur is None:
                continue
            _, version, size = cur
            self.name_due(ino, 0)  # its name is this peer's only once its entry went out
            h = held.get(ino)
            if h is not None and h.sealed and h.version == version and h.size == size:
                self.sealed[ino] = version
                self.entries_sent.add(ino)
                self.owe(ino, now)  # the entry again: it may have been renamed meanwhile
                continue
            owed = self.owe(ino, now)
            owed.truncate(0)
            owed.add(0, size)
        for ino, h in held.items():
            if ino not in s.files:
                self.forgets[ino] = None  # durable or removed meanwhile
        self.wake.set()

    async def pump_forever(self, s: Sender) -> None:
        while True:
            self.wake = trio.Event()
            if not await self.pump(s):
                # a seal that found the file changing is tried again soon even if no callback says so
                with trio.move_on_after(POLL_SECONDS if self.seal_wanted - self.sealing else math.inf):
                    await self.wake.wait()

    async def pump(self, s: Sender) -> bool:
        """Send some of what the peer is owed; True if it did anything (look again before sleeping)."""
        link = self.link
        assert link is not None
        did = False
        for ino, version in list(self.forgets.items()):
            del self.forgets[ino]
            with trio.fail_after(s.timeout):
                await link.forget(ino, version)
            did = True
        # entries before deletes: a rename's delete of the old key follows the renamed file's entry on the link, so a
        # peer that holds the delete holds what it waits for (the takeover applies it only once that is durable)
        for ino in list(self.owed):
            if self.names_due:
                await self.send_names(s)
            owed = self.owed.pop(ino, None)
            if owed is None:
                continue
            did = True
            self.sending = ino
            try:
                await self.send_owed(s, ino, owed, self.names_due.get(ino))
            finally:
                self.sending = None
                self.sent.set()
                self.sent = trio.Event()
        if self.deletes_due:
            self.deletes_due = False
            did = await self.send_deletes(s) or did
        for ino in list(self.seal_wanted):
            self.start_seal(s, ino)
        self.sent.set()  # the deletes of the pass went out too
        self.sent = trio.Event()
        return did

    def start_seal(self, s: Sender, ino: int) -> None:
        """Seal the file now, beside the pump: hashed while its last bytes are still being sent (both read the page
        cache, on two cores at once); the seal frame itself waits for them (`seal`)."""
        self.seal_wanted.add(ino)
        if ino in self.sealing:
            return  # its task wakes the pump when it ends; a wake now would spin the pump for as long as the seal waits
        if self.nursery is None or not self.ready or self.failed or self.error is not None:
            self.wake.set()
            return
        try:
            self.nursery.start_soon(self._sealer, s, ino)
        except RuntimeError:  # the channel is ending (its tasks cancelled, not yet marked failed): the next one seals it
            self.wake.set()
            return
        self.sealing.add(ino)

    async def _sealer(self, s: Sender, ino: int) -> None:
        """One file's seal, beside the pump and the other files' seals (a writer's fsync does not wait for the seals
        of files written at the same time, one after another)."""
        try:
            await self.guarded(self.seal, s, ino)
            if ino in self.seal_wanted and not self.failed:
                await trio.sleep(POLL_SECONDS)  # it changed while hashed: looked at again soon, not at every write
        finally:
            self.sealing.discard(ino)
            self.wake.set()

    async def guarded(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """A task of the channel: its failure fails the channel (kept for `Sender._serve`, the other tasks cancelled)."""
        try:
            await fn(*args)
        except (PeerError, OSError, trio.TooSlowError) as e:
            if self.error is None:
                self.error = e
            assert self.nursery is not None
            self.nursery.cancel_scope.cancel()

    def name_due(self, ino: int, seq: int) -> None:
        """Name change `seq` moved (or removed) the file: its entry (or forget) is owed to the peer."""
        self.drop_name(ino)
        self.names_due[ino] = seq
        self._due_counts[seq] = self._due_counts.get(seq, 0) + 1

    def drop_name(self, ino: int) -> None:
        """Nothing of the file's name is owed any more (its entry went out, or it is durable under its name)."""
        seq = self.names_due.pop(ino, None)
        if seq is not None:
            left = self._due_counts[seq] - 1
            if left:
                self._due_counts[seq] = left
            else:
                del self._due_counts[seq]

    def _named(self, ino: int, due: int | None) -> None:
        """The file's entry (or forget) as of name change `due` went out: that change is this peer's."""
        if due is not None and self.names_due.get(ino) == due:
            self.drop_name(ino)

    async def send_owed(self, s: Sender, ino: int, owed: Owed, due: int | None = None) -> None:
        """`due`: the name change pending for the file when it was taken (cleared once its entry or forget went out)."""
        link = self.link
        assert link is not None
        cur = s.current(ino)
        if cur is None:
            self.copy_entries.pop(ino, None)
            if ino in self.entries_sent or ino in self.sealed:
                # sent now, not at the next pass: a waiting unlink or rename returns once the peer forgot the file
                self.forgets.pop(ino, None)
                self.sealed.pop(ino, None)
                self.entries_sent.discard(ino)
                with trio.fail_after(s.timeout):
                    await link.forget(ino, None)
            s.files.discard(ino)
            self._named(ino, due)
            return
        row, version, size = cur
        if owed.entry or ino not in self.entries_sent:
            await self.send_entry(s, ino, row, version, size)
        self._named(ino, due)
        if row.copy_from:
            return  # its bytes are in the bucket (a durable file renamed): the entry says where
        if owed.truncate_to is not None:
            with trio.fail_after(s.timeout):
                await link.truncate(ino, owed.truncate_to)
        await self.send_ranges(s, ino, owed.extents)
        live = s.ns.files.live.get(ino)
        if (live is None or live.writers == 0) and not s.holds(self, ino, version):
            self.start_seal(s, ino)  # closed: sealed without anyone asking, so it is replicated before it drains

    async def send_entry(self, s: Sender, ino: int, row: Row, version: int, size: int) -> None:
        """The file's entry meta (key, version, size, copy_from, marker...) as it is now."""
        link = self.link
        assert link is not None
        # a version counted without a byte changed (a passthrough close, a rename during an upload) keeps the
        # version the peer sealed: an entry of another version would unseal its copy of the same bytes
        held = self.sealed.get(ino) if s.holds(self, ino, version) else None
        meta = s.meta_of(ino, row, version if held is None else held, size)
        if meta is None:
            return
        with trio.fail_after(s.timeout):
            await link.entry(ino, meta)
        self.entries_sent.add(ino)
        if meta.get("sealed"):
            self.copy_entries[ino] = int(meta["version"])
        else:
            self.copy_entries.pop(ino, None)

    async def send_names(self, s: Sender) -> None:
        """Name changes go ahead of other files' bytes (called before each file and each chunk): the entries (or
        forgets) of files renamed or removed, then the deletes queued, so a rename or unlink waits for its own frames
        and one round trip, not for a pass over files other writers are streaming."""
        did = False
        for ino in list(self.names_due):
            owed = self.owed.get(ino)
            if ino == self.sending or owed is None or ino not in self.names_due:
                continue  # the file being sent now: its entry went first
            due = self.names_due[ino]
            cur = s.current(ino)
            if cur is None:
                del self.owed[ino]
                await self.send_owed(s, ino, owed, due)  # a forget, no bytes
            else:
                await self.send_entry(s, ino, *cur)
                owed.entry = False
                self._named(ino, due)
            did = True
        if self.deletes_due:
            self.deletes_due = False
            did = await self.send_deletes(s) or did
        if did:
            self.sent.set()
            self.sent = trio.Event()

    async def send_ranges(self, s: Sender, ino: int, extents: list[list[int]]) -> None:
        if not extents:
            return
        link = self.link
        assert link is not None
        try:
            fd = os.open(s.ns.cache.path(ino), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # removed meanwhile: the next pump forgets it
        try:
            size = os.fstat(fd).st_size
            for start, end in extents:
                end = min(end, size)
                while start < end:
                    if self.names_due or self.deletes_due:
                        await self.send_names(s)
                    n = min(CHUNK, end - start)
                    await s.bandwidth.take(n)
                    with trio.fail_after(s.timeout):
                        await link.write(ino, fd, start, n)
                    self.replicated_bytes += n
                    s.replicated_bytes += n
                    s.on_sent(n)
                    await s.digests.extend(ino, start, start + n)
                    start += n
        finally:
            os.close(fd)

    async def send_deletes(self, s: Sender) -> bool:
        """Object deletes queued by unlinks and renames of durable files, in order; done ones retired."""
        link = self.link
        assert link is not None
        queued = {delete_id: (key, after) for delete_id, key, after in s.ns.deletes}
        did = False
        for delete_id, (key, after) in queued.items():
            if delete_id not in self.deletes_sent:
                if after is not None and after in self.names_due:
                    self.deletes_due = True  # after the entry of the file it waits for (the next pass)
                    continue
                with trio.fail_after(s.timeout):
                    await link.delete(delete_id, key, s.next_seq(), after, s.ns.journal.delete_etag(delete_id))
                self.deletes_sent.add(delete_id)
                did = True
        for delete_id in [d for d in self.deletes_sent if d not in queued]:
            with trio.fail_after(s.timeout):
                await link.delete_done(delete_id)
            self.deletes_sent.discard(delete_id)
            did = True
        return did

    def names_out(self, s: Sender, target: tuple[int, int]) -> bool:
        """Every name change up to target[0] and every delete queued up to id target[1] went out to the peer."""
        if any(seq <= target[0] for seq in self._due_counts):
            return False
        return all(delete_id in self.deletes_sent for delete_id, _, _ in s.ns.deletes if delete_id <= target[1])

    def ask_names(self, s: Sender) -> None:
        """A rename, unlink or rmdir waits for the peer to hold the names: confirm them (one confirmer per channel;
        the renames made meanwhile share its next round trip)."""
        self.names_asked = True
        self.deletes_due = True
        self.wake.set()
        if self.confirming or self.nursery is None or not self.ready or self.failed or self.error is not None:
            return
        try:
            self.nursery.start_soon(self._confirmer, s)
        except RuntimeError:  # the channel is ending: the waiter looks at the next one
            return
        self.confirming = True

    async def _confirmer(self, s: Sender) -> None:
        try:
            await self.guarded(self._confirm_names, s)
        finally:
            self.confirming = False
            s.notify()

    async def _confirm_names(self, s: Sender) -> None:
        """Until no rename waits: what they changed sent (entries before the deletes that wait for them), then one
        barrier, answered once the peer has them on its disk. A renamed durable file's entry went sealed (its bytes
        are the bucket's): the barrier's answer makes it replicated here."""
        link = self.link
        assert link is not None
        while self.names_asked:
            self.names_asked = False
            target = s.names.target()
            while not self.names_out(s, target):
                self.deletes_due = True
                self.wake.set()
                await self.sent.wait()  # after each file's frames and each pass: its own entries, not others' bytes
            copies = dict(self.copy_entries)
            with trio.fail_after(s.timeout):
                await link.barrier()
            self.names_confirmed = (max(self.names_confirmed[0], target[0]), max(self.names_confirmed[1], target[1]))
            for ino, version in copies.items():
                cur = s.current(ino)
                if cur is not None and cur[0].copy_from and cur[1] == version and self.copy_entries.get(ino) == version:
                    self.sealed[ino] = version
                    if s.sealed_on(ino, version) >= s.replicas:
                        s.single_since.pop(ino, None)
            s.notify()

    async def sent_out(self, ino: int) -> None:
        """Until nothing of the file is owed or being sent (frames leave in order: what is sent next comes after)."""
        while ino in self.owed or self.sending == ino:
            await self.sent.wait()

    async def seal(self, s: Sender, ino: int) -> bool:
        """Seal the file's current version on the peer; False if there was nothing to do or it must be tried again
        (it changed while hashed: the pump looks again after POLL_SECONDS, or at the change)."""
        link = self.link
        assert link is not None
        cur = s.current(ino)
        if cur is None:
            self.seal_wanted.discard(ino)
            return False
        row, version, size = cur
        if s.holds(self, ino, version):
            self.seal_wanted.discard(ino)
            return False
        if row.copy_from:
            await self.sent_out(ino)  # the entry naming the object its bytes are in, sent
            with trio.fail_after(s.timeout):
                await link.barrier()  # and arrived
        else:
            t0 = s.clock()
            digest = await s.digests.digest(ino, version, size)
            t1 = s.clock()
            if digest is None:
                log.debug("seal of %d v%d (%d B): hashed in %.3f s, changed meanwhile", ino, version, size, t1 - t0)
                return False  # it changed while hashed (or under passthrough the kernel wrote more): the seal stays wanted
            await self.sent_out(ino)  # its bytes go first
            if not s.digests.holds(ino, version, digest):
                return False  # changed since it was hashed: hashed again
            t2 = s.clock()
            try:
                with trio.fail_after(s.timeout):
                    await link.seal(ino, version, size, digest)
                log.debug("seal of %d v%d (%d B) on %s: hashed in %.3f s, bytes sent %.3f s later, answered %.3f s later",
                          ino, version, size, self.node, t1 - t0, t2 - t1, s.clock() - t2)
            except SealMismatch:
                log.info("peer %s: its copy of %s differs; sending it whole", self.node, s.ns.journal.path_of(ino))
                s.digests.forget(ino)  # hashed whole next time, whatever was kept of it
                owed = self.owe(ino, s.clock())
                owed.truncate(0)
                owed.add(0, size)
                return True
        self.seal_wanted.discard(ino)
        now = s.current(ino)
        if now is not None and now[1] == version:
            self.sealed[ino] = version
            if s.sealed_on(ino, version) >= s.replicas:
                s.single_since.pop(ino, None)
        s.notify()
        return True


def close_down(channels: Iterable[Channel], down: set[str]) -> None:
    """Channels to nodes whose record is down (`Membership.down`) are closed: a peer that died silently (power lost)
    while nothing was sent to it timed nothing out, and its files must go to the next candidate."""
    for ch in list(channels):
        if ch.node in down and not ch.failed:
            ch.close("its node record is down (not renewed within peer_lease_ttl)")


def single_copy_from_now(s: Sender) -> None:
    """A channel failed: every file that fewer than R healthy channels hold now is single-copy from this moment
    (`Sender.single_copy`, and not `replicated`), until another peer seals it."""
    now = s.clock()
    for ino in list(s.files):
        cur = s.current(ino)
        if cur is not None and s.sealed_on(ino, cur[1]) < s.replicas:
            s.single_since.setdefault(ino, now)


def channel_status(channels: dict[str, Channel], single_since: dict[int, float], now: float) -> dict[str, dict[str, Any]]:
    """Each channel as `ckptfs status` shows it: connected, how far behind its peer is (the oldest change or seal it
    still owes), the bytes it sent."""
    out = {}
    for node, ch in channels.items():
        waiting = [o.since for o in ch.owed.values()] + [single_since[i] for i in ch.seal_wanted if i in single_since]
        out[node] = {"connected": ch.ready and not ch.failed, "lag_seconds": round(now - min(waiting), 3) if waiting else 0.0,
                     "replicated_bytes": ch.replicated_bytes}
    return out
