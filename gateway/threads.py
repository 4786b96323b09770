"""Object store calls in worker threads that a hung store cannot hold up.

trio waits for a worker thread before a cancelled task can finish, and a
request to a store that accepts connections but never answers returns only
after botocore's timeouts and retries (minutes). So every store call runs with
`abandon_on_cancel=True`: a cancelled caller (the daemon stopping, a reader's
or a lookup's bound) goes on at once, and the thread finishes on its own, its
result dropped. That is safe because nothing a store call does is recorded
before its caller sees the result: an abandoned upload or delete is redone by
the next attempt (or the next mount), as after a crash.

An abandoned thread must not use a file descriptor the daemon closes, and the
kernel hands out again, meanwhile: `call_with_fd` gives the thread a duplicate
of its own, closed by whichever side ends up owning it.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, TypeVar

import trio

T = TypeVar("T")


async def call(fn: Callable[[], T], limiter: trio.CapacityLimiter | None = None) -> T:
    """`fn()` in a worker thread; a cancelled caller does not wait for it."""
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=limiter)


class _Dup:
    """A duplicate descriptor for one worker thread; whoever claims it first closes it."""

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)
        self._lock = threading.Lock()
        self._owner: str | None = None

    def claim(self, who: str) -> bool:
        with self._lock:
            if self._owner is None:
                self._owner = who
            return self._owner == who


async def call_with_fd(fd: int, fn: Callable[[int], T], limiter: trio.CapacityLimiter | None = None) -> T:
    """`fn(own_fd)` in a worker thread, `own_fd` a duplicate of `fd` that outlives an abandoned call."""
    dup = _Dup(fd)

    def run() -> T:
        if not dup.claim("thread"):
            raise RuntimeError("abandoned before it started")  # nobody waits for this result
        try:
            return fn(dup.fd)
        finally:
            os.close(dup.fd)

    try:
        return await trio.to_thread.run_sync(run, abandon_on_cancel=True, limiter=limiter)
    finally:
        if dup.claim("trio"):  # the thread never started (cancelled while waiting for a thread)
            os.close(dup.fd)
