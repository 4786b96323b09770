"""The owner's side of peer durability: which bytes go to which peer when, and when a file is `replicated`.

Why the bytes stream while they are written: an fsync (or the FLUSH of a close) under `durability = peer`
returns once R peers hold the file, and a checkpoint shard is written in seconds; sending it only at fsync
would make every save wait for a whole second copy over the network. So each change is noticed as it
happens (copy mode: the namespace's `OpenFiles.on_bytes`/`on_truncate`, on the trio thread; a file the
kernel writes itself under passthrough: its cache file's size, polled while it is open) and each peer is
owed the changed ranges, read from the cache file when sent (a range written twice before it goes out goes
once). An fsync then waits only for the tail and the seal.

A *channel* (peers/channel.py) is one chosen peer (`Membership.targets()` order: the first R that answer). It owes its peer,
per file, byte ranges, a truncate, the entry meta (key, copy_from, commit marker, checkpoint) and a seal.
A seal carries the whole file's xxh3-128 (what the drain computes), so the peer's copy is checked end to
end: a copy that differs (a range the kernel rewrote in place under passthrough, which no size poll sees)
is sent again whole. A file is replicated when its current version is sealed on R channels: in memory,
re-learnt after a restart from `PeerLink.holdings()` (sealed, same version and size: nothing resent).
A channel that fails (PeerError, PeerFull, no answer within `peer_timeout`) is dropped and its node rested
for `peer_timeout`; the next candidate gets every file not yet durable again. When fewer than R answer,
`on_no_peer` decides: `degrade` acknowledges (counted, logged once per file) or `fail` answers EIO.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Protocol, Sequence

import trio

from ..journal import DURABLE, Row
from ..namespace import Namespace, under
from ..patterns import Patterns
from .bandwidth import TokenBucket
from .digests import Digests
from .channel import POLL_SECONDS, Channel, channel_status, close_down, single_copy_from_now
from .link import PeerBusy, PeerError, PeerLink, PeerRefused, PeerUnreachable
from .names import NameChanges

log = logging.getLogger(__name__)

CONNECT_RETRY_SECONDS = 0.05  # the first wait before a refused connection is tried again (doubling to 1 s)
HOUSEKEEPING_SECONDS = 1.0  # queued deletes looked at, missing channels filled
LOOK_FOR_PEERS_SECONDS = 1.0  # between two reads of the node records by fsyncs that found no peer at start-up


class Target(Protocol):
    """A candidate peer (membership.PeerState)."""

    node: str
    addr: str


LinkOpener = Callable[[str, str], Awaitable[PeerLink]]  # (node, addr) -> a connected, authenticated link


async def connect(open_link: LinkOpener, node: str, addr: str) -> PeerLink:
    """A link to `node`, a refused connection tried again until the caller's deadline (peer_timeout): a peer's
    listener that restarts (the supervisor waits 0.5 s and more) refuses for a moment, and the fsyncs waiting
    on the channel would otherwise be acknowledged single-copy for a whole peer_timeout."""
    delay = CONNECT_RETRY_SECONDS
    while True:
        try:
            return await open_link(node, addr)
        except PeerUnreachable:
            await trio.sleep(delay)
            delay = min(2 * delay, 1.0)


async def _nothing() -> None:
    return None


class Sender:
    def __init__(self, cfg: Any, ns: Namespace, open_link: LinkOpener, targets: Callable[[], Sequence[Target]],
                 *, clock: Callable[[], float] = time.monotonic, down: Callable[[], set[str]] = set) -> None:
        self.cfg, self.ns, self.open_link, self.targets, self.clock = cfg, ns, open_link, targets, clock
        self.down = down  # nodes whose record says down (Membership.down): their channels are closed
        self.replicas: int = cfg.peer_replicas
        self.timeout: float = cfg.peer_timeout
        self.fail = cfg.on_no_peer == "fail"
        self.bandwidth = TokenBucket(cfg.peer_max_bandwidth, clock)
        self.checkpoints = Patterns(cfg.checkpoint_patterns)
        self.channels: dict[str, Channel] = {}
        self.rested: dict[str, float] = {}  # node -> monotonic time its channel failed: not tried again for peer_timeout
        self.busy: set[str] = set()  # of those, the ones that took their share of owners: insisted on if nobody else takes us
        self.reconnected: dict[str, float] = {}  # node -> monotonic time a broken channel to it was opened again at once
        # node -> (why its last channel failed, whether it refused the handshake): `ckptfs status`; gone once one works
        self.failures: dict[str, tuple[str, bool]] = {}
        # the node records read now (Membership.refresh, errors swallowed): an fsync at start-up that knows no peer
        self.find_peers: Callable[[], Awaitable[None]] = _nothing
        self.started_at = clock()
        self._ever_connected = False
        self._looked_at = -1e18
        self.files: set[int] = set()  # every file not yet durable that the peers must hold
        self.single_since: dict[int, float] = {}  # files not replicated -> monotonic time they became so
        self.degraded: set[int] = set()  # files acknowledged single-copy or refused (counted and logged once each)
        self.degraded_writes = 0  # files acknowledged single-copy (on_no_peer = degrade): one per file, not per call
        self.refused_writes = 0  # fsyncs and closes answered EIO for want of a peer (on_no_peer = fail)
        self.last_error: str | None = None  # the last of either, for `ckptfs status`
        self.last_error_at: float | None = None  # wall time
        self.replicated_bytes = 0
        self.passthrough_inos: Callable[[], Iterable[int]] = lambda: ()  # fs.py's passthrough writers (the daemon wires it)
        self.sync_passthrough: Callable[[], None] = lambda: None  # fs.py's: the sizes the kernel wrote, taken now (as fsync)
        self.on_sent: Callable[[int], None] = lambda n: None  # bytes sent to a peer (the metrics' counter)
        self.on_degraded: Callable[[], None] = lambda: None  # an fsync or close acknowledged without R peers
        self.uncounted: Callable[[], str | None] = lambda: None  # why peer copies do not count now (no record of ours)
        # the holders our record lists (holders.py): only their copies count (None: every ready channel's, no record)
        self.listed: Callable[[], frozenset[str] | None] = lambda: None
        self.ask_listing: Callable[[list[str]], None] = lambda nodes: None  # list these holders in our record, now
        self._pt_sizes: dict[int, int] = {}
        self._seq = 0
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.digests = Digests(ns, self.current, self._kernel_writes)  # the xxh3 of each file's bytes, kept between seals
        self.names = NameChanges(self)  # renames, unlinks, rmdirs: numbered, and what their FUSE request waits for
        ns.files.on_bytes.subscribe(self._on_bytes)
        ns.files.on_truncate.subscribe(self._on_truncate)
        ns.tree.on_paths_changed.subscribe(self.names.paths_changed)
        ns.uploads.on_file_durable.subscribe(self._on_durable)

    # ------------------------------------------------------------------ state
    def current(self, ino: int) -> tuple[Row, int, int] | None:
        """(row, version, size) of a file the peers must hold; None if durable, removed or not a file."""
        try:
            row = self.ns.files.row(ino)
        except OSError:
            return None
        if row.kind != "file" or row.parent is None or row.state == DURABLE:
            return None
        live = self.ns.files.live.get(ino)
        return (row, live.version, live.size) if live is not None else (row, row.version, row.size)

    def _healthy(self) -> list[Channel]:
        return [ch for ch in self.channels.values() if not ch.failed]

    def is_replicated(self, ino: int) -> bool:
        """The file's current version is sealed on R peers (False for a durable file: it is more than that)."""
        cur = self.current(ino)
        if cur is None:
            return False
        return self.sealed_on(ino, cur[1]) >= self.replicas

    def holds(self, ch: Channel, ino: int, version: int) -> bool:
        return ch.ready and ch.sealed.get(ino) in self.digests.versions_held(ino, version)

    def sealed_on(self, ino: int, version: int) -> int:
        held = self.digests.versions_held(ino, version) if self.uncounted() is None else set()
        return sum(1 for ch in self.counting() if ch.sealed.get(ino) in held)

    def counting(self) -> list[Channel]:
        """The ready channels whose peers' copies count: our record lists them (holders.py), or there is no list."""
        listed = self.listed()
        return [ch for ch in self._healthy() if ch.ready and (listed is None or ch.node in listed)]

    def _list_ready(self) -> None:
        """Our record lists the ready channels' nodes before their copies count (holders.py): asked once one is not."""
        ready = [ch.node for ch in self._healthy() if ch.ready]
        listed = self.listed()
        if ready and listed is not None and not set(ready) <= listed:
            self.ask_listing(ready)

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def next_seq(self) -> int:
        """The owner's order of changes (entries, deletes), increasing across restarts too (wall-clock based)."""
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return self._seq

    # -------------------------------------------------- the namespace's callbacks
    def _track(self, ino: int) -> bool:
        """A file changed: it is single-copy until sealed again. False if the peers need not hold it."""
        if ino not in self.files:
            if self.current(ino) is None:
                return False
            self.files.add(ino)
        if ino not in self.single_since:
            self.single_since[ino] = self.clock()
            # only a change of state wakes the waiters: each waiter tracks its file at every wake, and two waiters
            # notifying each other would spin the event loop for as long as they wait
            self.notify()
        return True

    def _on_bytes(self, ino: int, offset: int, length: int) -> None:
        self.digests.below(ino, offset)
        if not self._track(ino):
            return
        now = self.clock()
        for ch in self._healthy():
            ch.owe(ino, now).add(offset, offset + length)

    def _on_truncate(self, ino: int, size: int) -> None:
        self.digests.below(ino, size)
        if not self._track(ino):
            return
        now = self.clock()
        for ch in self._healthy():
            ch.owe(ino, now).truncate(size)

    def _on_durable(self, ino: int, version: int) -> None:
        """The drain made `version` durable: the peers drop their replicas of it."""
        self._drop(ino, version)

    def _drop(self, ino: int, version: int | None) -> None:
        self.files.discard(ino)
        self.single_since.pop(ino, None)
        self.degraded.discard(ino)
        self._pt_sizes.pop(ino, None)
        self.digests.forget(ino)
        for ch in self.channels.values():
            ch.owed.pop(ino, None)
            ch.drop_name(ino)  # durable under its name now: the bucket has the name
            ch.copy_entries.pop(ino, None)
            ch.seal_wanted.discard(ino)
            if ch.sealed.pop(ino, None) is not None or ino in ch.entries_sent:
                ch.entries_sent.discard(ino)
                ch.forgets[ino] = version
                ch.wake.set()
        self.notify()

    def _poll_passthrough(self, ino: int) -> None:
        """What the kernel wrote to a passthrough file since the last look: its new tail (a rewrite in place is
        caught by the seal's checksum and sent again whole)."""
        try:
            size = os.stat(self.ns.cache.path(ino)).st_size
        except OSError:
            return
        last = self._pt_sizes.get(ino)
        self._pt_sizes[ino] = size
        self.digests.kernel_writes(ino)  # hashed whole at each seal
        if last is None:
            self._on_bytes(ino, 0, size)
        elif size > last:
            self._on_bytes(ino, last, size - last)
        elif size < last:
            self._on_truncate(ino, size)

    # ------------------------------------------------------ what fs and control wait on
    async def replicated(self, ino: int) -> None:
        """Until the file's current version is sealed on R peers. No R peers answering: `degrade` returns
        (counted, logged once per file), `fail` raises OSError(EIO)."""
        if ino in self._pt_sizes or ino in set(self.passthrough_inos()):
            self._poll_passthrough(ino)
        deadline = self.clock() + self.timeout
        while True:
            cur = self.current(ino)
            if cur is None:
                return  # durable, or removed: nothing to wait for
            self._track(ino)
            version = cur[1]
            if self.sealed_on(ino, version) >= self.replicas:
                self.single_since.pop(ino, None)
                return
            healthy = self._healthy()
            for ch in healthy:
                if not self.holds(ch, ino, version) and ino not in ch.sealing:
                    ch.start_seal(self, ino)
            self._fill()
            healthy = self._healthy()
            why = self.uncounted()  # no record of ours: what the peers hold is not a replica
            if why is None and not healthy and await self._awaited_a_first_peer(deadline):
                continue
            all_hold = all(self.holds(ch, ino, version) for ch in healthy)
            if why is not None or len(healthy) < self.replicas and all_hold:
                self._no_peer(ino, 0 if why else len(healthy), why)
                return
            if all_hold and self.clock() >= deadline:  # held, but our record could not list the holders in time
                self._no_peer(ino, self.sealed_on(ino, version), "this node's record does not list the peers holding it: "
                              "it could not be written (its lease, `ckptfs status`)")
                return
            with trio.move_on_after(max(0.0, deadline - self.clock()) if all_hold else math.inf):
                await self._changed.wait()

    async def _awaited_a_first_peer(self, deadline: float) -> bool:
        """No peer known, in this node's first 2 x peer_lease_ttl and before it ever reached one: True after looking
        for one (the records read now, at most once a second, then a short wait), False once that window or this
        call's peer_timeout is over. A node mounted before the others sees them only at its next read of the records
        (a third of the lease later): its first fsyncs wait for them rather than acknowledge single-copy at once."""
        now = self.clock()
        if self._ever_connected or now >= min(deadline, self.started_at + 2 * self.cfg.peer_lease_ttl):
            return False
        if now - self._looked_at >= LOOK_FOR_PEERS_SECONDS:
            self._looked_at = now
            await self.find_peers()
            self._fill()
        if not self._healthy():
            with trio.move_on_after(min(LOOK_FOR_PEERS_SECONDS, max(0.0, deadline - now))):
                await self._changed.wait()
        return True

    def _no_peer(self, ino: int, holders: int, why: str | None = None) -> None:
        path = self.ns.journal.path_of(ino) or f"inode {ino}"
        first = ino not in self.degraded  # a file's fsync and then its close are one file: counted and logged once
        self.degraded.add(ino)
        self.last_error_at = time.time()
        if self.fail:
            self.refused_writes += 1
            self.last_error = (f"{path}: fsync/close refused (EIO): {holders} of {self.replicas} peers hold a copy "
                               f"({why or 'no other peer answers'}; on_no_peer = fail)")
            if first:
                log.error("%s", self.last_error)
            raise OSError(errno.EIO, f"{path}: only {holders} of {self.replicas} peers hold a copy (on_no_peer = fail){why and ': ' + why or ''}")
        self.last_error = (f"{path}: acknowledged with {holders} of {self.replicas} peer copies "
                           f"({why or 'no other peer answers'}; on_no_peer = degrade)")
        if first:
            self.degraded_writes += 1
            self.on_degraded()
            log.warning("%s: acknowledged with %d of %d peer copies: single-copy on this node until it drains "
                        "(%s; on_no_peer = degrade)", path, holders, self.replicas, why or "no other peer answers")

    def unreplicated_under(self, path: str) -> tuple[int, int]:
        """(files, bytes) under mount-relative `path` that are neither durable nor replicated."""
        files = size = 0
        for ino in list(self.files):
            cur = self.current(ino)
            p = self.ns.journal.path_of(ino) if cur is not None else None
            if p is not None and under(path, p) and self.sealed_on(ino, cur[1]) < self.replicas:  # type: ignore[index]
                files += 1
                size += cur[2]  # type: ignore[index]
        return files, size

    async def wait_replicated_under(self, path: str) -> None:
        """`ckptfs flush --level replicated`: every file under `path` replicated (or durable). Passthrough writers'
        sizes taken first, as their fsync would: every byte written before the call, not what the last poll saw."""
        self.sync_passthrough()
        for ino in list(self.passthrough_inos()):
            self._poll_passthrough(ino)
        for ino in list(self.files):
            p = self.ns.journal.path_of(ino)
            if p is not None and under(path, p):
                await self.replicated(ino)

    # -------------------------------------------------------------- figures
    def single_copy(self) -> tuple[int, float]:
        """(bytes not yet durable and not replicated, age in seconds of the oldest of them)."""
        now = self.clock()
        size, oldest = 0, 0.0
        for ino, since in list(self.single_since.items()):
            cur = self.current(ino)
            if cur is None:
                continue
            if self.sealed_on(ino, cur[1]) >= self.replicas:
                # sealed already: a passthrough close (or a poll) that counted a version without a byte changed
                # marks it again, and nothing re-seals what the peers hold
                self.single_since.pop(ino, None)
                continue
            size += cur[2]
            oldest = max(oldest, now - since)
        return size, oldest

    def channel_status(self) -> dict[str, dict[str, Any]]:
        return channel_status(self.channels, self.single_since, self.clock())

    # ------------------------------------------------------------------ run
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Channels to the first R targets that answer, kept filled; the passthrough poll; queued deletes."""
        for row in self.ns.journal.pending_files():
            if row.parent is not None:
                self.files.add(row.ino)
                self.single_since.setdefault(row.ino, self.clock())
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._fill()
                task_status.started()
                last_housekeeping = 0.0
                while True:
                    for ino in list(self.passthrough_inos()):
                        self._poll_passthrough(ino)
                    open_pt = set(self.passthrough_inos())
                    for ino in [i for i in self._pt_sizes if i not in open_pt]:
                        self._poll_passthrough(ino)  # its last bytes, then it is an ordinary file again
                        del self._pt_sizes[ino]
                        if self._track(ino):  # its close made a new version: sealed again, bytes or not
                            for ch in self._healthy():
                                ch.owe(ino, self.clock())
                    if self.clock() - last_housekeeping >= HOUSEKEEPING_SECONDS:
                        last_housekeeping = self.clock()
                        close_down(self.channels.values(), self.down())
                        self._fill()
                        self._list_ready()
                        for ch in self._healthy():
                            ch.deletes_due = True
                            ch.wake.set()
                    await trio.sleep(POLL_SECONDS)
        finally:
            self._nursery = None
            for ch in self.channels.values():
                ch.failed = True
            self.channels.clear()

    def _fill(self) -> None:
        """Open channels to the next candidates until R are healthy (or none is left to try)."""
        if self._nursery is None:
            return
        now = self.clock()
        for node in [n for n, at in self.rested.items() if now - at >= self.timeout]:
            del self.rested[node]
            self.busy.discard(node)
        missing = self.replicas - len(self._healthy())
        if missing <= 0:
            return
        targets = self.targets()
        for insist in (False, True):  # then, every candidate left having its share of owners: the best, insisting
            for target in targets:
                if missing <= 0:
                    return
                if target.node in self.channels or target.node in self.rested and not (insist and target.node in self.busy):
                    continue
                self.rested.pop(target.node, None)
                self.busy.discard(target.node)
                ch = self.channels[target.node] = Channel(target.node, target.addr)
                ch.insist = insist
                self._nursery.start_soon(self._serve, ch)
                missing -= 1

    async def _serve(self, ch: Channel) -> None:
        """One channel's life: connect, learn what the peer holds, send what it is owed (its link watched) until it fails."""
        failed = again = False
        try:
            with ch.scope:
                with trio.fail_after(self.timeout):
                    ch.link = await connect(self.open_link, ch.node, ch.addr)
                    held = await ch.link.holdings(insist=ch.insist)
                ch.learn(self, held)
                ch.ready = True
                self._list_ready()
                self._ever_connected = True
                self.failures.pop(ch.node, None)
                log.info("replicating to peer %s (%s)", ch.node, ch.addr)
                self.notify()
                async with trio.open_nursery() as nursery:
                    ch.nursery = nursery
                    nursery.start_soon(ch.guarded, ch.pump_forever, self)
                    nursery.start_soon(ch.guarded, ch.link.watch)
            if ch.error is not None:
                raise ch.error
        except (PeerError, OSError, trio.TooSlowError) as e:
            failed = True
            why = "no answer within peer_timeout" if isinstance(e, trio.TooSlowError) else str(e) or type(e).__name__
            # a connection that worked and broke (its listener restarted) is opened again at once, once per peer_timeout
            again = ch.ready and ch.link is not None and ch.link.connection_lost and self.clock() - self.reconnected.get(ch.node, -1e18) >= self.timeout
            if again:
                self.reconnected[ch.node] = self.clock()
            if isinstance(e, PeerBusy):  # its share of owners taken (spread.py): not a failure of the node (its record
                self.busy.add(ch.node)  # is not read again for it); asked again, insisting, if nobody else takes us
                log.info("peer %s sent us on: %s", ch.node, why)
            else:
                self.failures[ch.node] = (why, isinstance(e, PeerRefused))
                log.warning("peer %s (%s) dropped: %s; %s", ch.node, ch.addr, why,
                            "connecting again" if again else "its files go to the next candidate")
        finally:
            ch.failed = True
            if self.channels.get(ch.node) is ch:
                del self.channels[ch.node]
            single_copy_from_now(self)
            if failed and not again:  # cancelled (the sender stops or restarts): the next run connects at once
                self.rested[ch.node] = self.clock()
            if ch.link is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    try:
                        await ch.link.aclose()
                    except (PeerError, OSError):
                        pass
            self.notify()
        if failed:
            self._fill()

    def meta_of(self, ino: int, row: Row, version: int, size: int) -> dict[str, Any] | None:
        path = self.ns.journal.path_of(ino)
        if path is None:
            return None
        cp = self.checkpoints.checkpoint_of(path, is_dir=False)
        key = self.ns.keys.of(path)
        meta = {"key": key, "version": version, "size": size, "copy_from": row.copy_from,
                "marker": self.ns.backlog.is_marker(path.rsplit("/", 1)[-1]), "seq": self.next_seq(),
                "mtime": row.mtime_ns / 1e9, "checkpoint": cp.path if cp is not None else None,
                **judged_by(row, key)}
        if row.copy_from:
            # a durable file renamed: its bytes are the bucket's (the object it is copied from), so its entry goes
            # sealed, with that object's xxh3; a takeover copies it to the new key, and only then deletes the old one
            meta["sealed"], meta["xxh3"] = True, row.xxh3
        return meta

    def _kernel_writes(self, ino: int) -> bool:
        return ino in self._pt_sizes or ino in set(self.passthrough_inos())


def judged_by(row: Row, key: str) -> dict[str, str]:
    """What a taker judges the key's object by (publishing.py): the ETag this node last saw there ("": none). The
    journal whose inode and version the provenance will name is the connection's (the handshake says it)."""
    return {"seen": row.etag if row.etag and row.remote_key == key else ""}
