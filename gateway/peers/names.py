"""A rename that returned is safe with its node (docs/peers.md, docs/semantics.md): under `durability = peer` a rename,
unlink or rmdir returns once R peers hold what it changed, so a node lost right after is taken over with the names the
writer saw, whether or not it fsynced the directory.

Why here and not in the channels alone: the FUSE request waits, and it must wait for its own changes only, not for the
bytes other writers are streaming. So each name change is numbered (`paths_changed`, the namespace's hook), each channel keeps the number of
the files whose entry (or forget) has not gone out yet (`Channel.names_due`), and a waiter asks for "every change up to
now and every delete queued up to now" (`target`). A channel confirms that with one barrier once those went out, in
order (a renamed file's entry before the delete of its old key; the pump sends them before each file and each chunk of
other files' bytes: `Channel.send_names`); renames made meanwhile share its next round trip.
The operation is already applied on this node when it waits: with fewer than R peers answering it returns anyway,
counted as a degraded write and logged, whatever `on_no_peer` says (an EIO would tell the writer a rename failed that
happened).
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Protocol

import trio

from ..journal import Row
from ..namespace import Namespace
from .channel import Channel

log = logging.getLogger(__name__)


class Sender(Protocol):
    """The owner's sender (peers/sender.py) as the wait sees it."""

    ns: Namespace
    files: set[int]
    single_since: dict[int, float]
    replicas: int
    timeout: float
    degraded_writes: int
    on_degraded: Callable[[], None]
    clock: Callable[[], float]
    _changed: trio.Event

    def current(self, ino: int) -> tuple[Row, int, int] | None: ...
    def notify(self) -> None: ...
    def _healthy(self) -> list[Channel]: ...
    def _fill(self) -> None: ...
    def counting(self) -> list[Channel]: ...


class NameChanges:
    """The sender's numbering of name changes, and the wait of a rename, unlink or rmdir for its peers."""

    def __init__(self, sender: Sender) -> None:
        self.sender = sender
        self.seq = 0  # name changes (renames, unlinks, replaces) so far
        self.told = (0, 0)  # the highest (name change, delete id) confirmed by R peers, or acknowledged degraded
        self.logged = -1e18  # monotonic time of the last "fewer peers" line (one per peer_timeout)

    def paths_changed(self, inos: list[int]) -> None:
        """The namespace's hook: renamed, moved with a directory, unlinked or replaced. The peers get the new key (or
        forget the file); the change is numbered, so that a rename waits for its own entries, not for other files'
        bytes."""
        s = self.sender
        now = s.clock()
        for ch in s._healthy():
            ch.deletes_due = True
            ch.wake.set()
        seq: int | None = None
        for ino in inos:
            cur = s.current(ino)
            if cur is None and ino not in s.files:
                continue
            if seq is None:
                self.seq += 1
                seq = self.seq
            if ino not in s.files:  # a durable file renamed: its bytes are in the bucket, copied to its new key
                s.files.add(ino)
                s.single_since.setdefault(ino, now)
            for ch in s._healthy():
                ch.owe(ino, now).entry = True
                ch.name_due(ino, seq)
        s.notify()

    def target(self) -> tuple[int, int]:
        """(name changes so far, the newest queued delete's id): what a rename returning now must have told the peers."""
        return self.seq, self.sender.ns.deletes.newest()

    async def replicated(self) -> None:
        """Until every name change and delete made so far is on R peers' disks (one barrier per peer: one round trip)."""
        s = self.sender
        target = self.target()
        if target[0] <= self.told[0] and target[1] <= self.told[1]:
            return  # nothing new to tell (a rename of an empty directory, of files the peers need not hold)
        deadline = s.clock() + s.timeout
        while True:
            healthy = s._healthy()
            held = [ch for ch in healthy if ch.ready and ch.names_confirmed[0] >= target[0] and ch.names_confirmed[1] >= target[1]]
            counted = len([ch for ch in s.counting() if ch in held])  # on peers our record lists (holders.py)
            if counted >= s.replicas:
                break
            for ch in healthy:
                if ch.ready and ch not in held:
                    ch.ask_names(s)
            s._fill()
            healthy = s._healthy()
            all_hold = all(ch in held for ch in healthy)
            if len(healthy) < s.replicas and all_hold or all_hold and s.clock() >= deadline:  # (or: not listed in time)
                s.degraded_writes += 1
                s.on_degraded()
                if s.clock() - self.logged >= s.timeout:
                    self.logged = s.clock()
                    log.warning("a rename or delete returned with %d of %d peers holding it: a node lost now may lose the "
                                "new names (no other peer answers; single-copy until it drains)", counted, s.replicas)
                break
            with trio.move_on_after(max(0.0, deadline - s.clock()) if all_hold else math.inf):
                await s._changed.wait()
        self.told = (max(self.told[0], target[0]), max(self.told[1], target[1]))
