"""Names and inodes the kernel must forget, sent to it from a task of their own.

Why: the kernel keeps a name it was given (entry timeout), a file's attributes (attribute
timeout) and its pages without asking the daemon again. When a listing shows that another node
deleted a name or replaced an object (`namespace.merge`), the kernel must be told, or a `stat`
finds a file that `ls` no longer shows. Telling it cannot happen where the change is found: the
kernel handles an entry invalidation under the parent directory's lock, which a LOOKUP or READDIR
of that directory holds while it waits for the very listing being merged (pyfuse3's docs: "must
not be called while handling a related request"). So `entry` and `inode` only queue (on the trio
thread, never blocking), and `run` sends them one after another through the session, each in a
worker thread (`KernelSession` and `LibfuseSession` both do so), while requests go on being
answered. `stop` waits for the one in flight: it must end before the session closes its
connection.

Sent later, an invalidation could reach the kernel after the user's next look: `ls` shows a
name gone, and a `stat` right after still finds it. So an OPENDIR, which the kernel sends
holding no directory lock (unlike LOOKUP and READDIR), waits (`delivered`) until what its
directory's listing queued has been sent, before the READDIR that shows the listing: what `ls`
no longer lists, `stat` no longer finds. The wait is bounded (`DELIVERED_WAIT`): an
invalidation held up by a long request on another directory delays an `ls` at most that long.
"""

from __future__ import annotations

import errno
import logging
import math
from typing import Any, Protocol

import trio

log = logging.getLogger(__name__)

DELIVERED_WAIT = 5.0  # seconds an OPENDIR waits at most for the invalidations queued before it


class Notifier(Protocol):
    """What of a FUSE session this needs (`session.FuseSession` has it)."""

    async def invalidate_entry(self, parent: int, name: bytes) -> None: ...

    async def invalidate_inode(self, ino: int) -> None: ...


class Invalidations:
    """A queue of kernel cache invalidations and the task that sends them."""

    def __init__(self, merge: Any = None) -> None:
        """`merge`: a listing merge (namespace.ListingMerge) whose removed names and replaced inodes are queued."""
        if merge is not None:
            merge.on_removed.append(self.entry)
            merge.on_replaced.append(self.inode)
        send, receive = trio.open_memory_channel[tuple[int, bytes | None]](math.inf)
        self._send, self._receive = send, receive
        self._scope: trio.CancelScope | None = None
        self._done = trio.Event()
        self._queued = 0  # invalidations queued so far
        self._handled = 0  # of them, sent or given up
        self._progress = trio.Event()  # set (and replaced) each time one is handled, or when the task ends
        self.sent_total = 0  # invalidations the kernel took
        self.failed_total = 0  # refused for another reason than "nothing cached" (logged)

    def entry(self, parent: int, name: str) -> None:
        """Queue: the kernel forgets the name `name` in directory `parent` (and what is below it)."""
        if self._scope is not None:  # before the mount the kernel has nothing cached; after the stop, no one to tell
            self._send.send_nowait((parent, name.encode("utf-8", "surrogateescape")))
            self._queued += 1

    def inode(self, ino: int) -> None:
        """Queue: the kernel forgets the attributes and the pages it caches of inode `ino`."""
        if self._scope is not None:
            self._send.send_nowait((ino, None))
            self._queued += 1

    async def run(self, session: Notifier, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Send what is queued until `stop`."""
        self._done = trio.Event()  # per run: the supervisor may start it again after an unexpected error
        self._progress = trio.Event()
        try:
            with trio.CancelScope() as self._scope:
                task_status.started()
                async for target, name in self._receive:
                    try:
                        # shielded: `stop` must not return while one is in flight (the session's connection closes next)
                        with trio.CancelScope(shield=True):
                            if name is None:
                                await session.invalidate_inode(target)
                            else:
                                await session.invalidate_entry(target, name)
                        self.sent_total += 1
                    except OSError as e:
                        if e.errno == errno.ENOENT:
                            continue  # the kernel had nothing of it cached
                        self.failed_total += 1
                        what = f"inode {target}" if name is None else f"entry {name!r} of directory {target}"
                        log.warning("could not make the kernel forget %s: %s", what, e.strerror or e)
                    finally:
                        self._handled += 1
                        self._progress.set()
                        self._progress = trio.Event()
        finally:
            self._scope = None
            self._done.set()
            self._progress.set()  # whoever waits in `delivered` stops waiting: nothing more will be sent

    async def delivered(self, bound: float = DELIVERED_WAIT) -> None:
        """Return once every invalidation queued before this call has been sent (or refused), or after `bound`
        seconds, or at once while none is being sent. Never from a request that holds a directory lock (LOOKUP,
        READDIR): the invalidation may be waiting for it."""
        target = self._queued
        with trio.move_on_after(bound):
            while self._handled < target and self._scope is not None:
                await self._progress.wait()

    async def stop(self) -> None:
        """Stop sending; returns once an invalidation in flight (in its thread) has ended."""
        if self._scope is not None:
            self._scope.cancel()
            await self._done.wait()
