"""The catalogue as the page last read it, refreshed in the background when a page finds it old.

A walk of a bucket with 10,000 checkpoints takes a while, so pages never wait for one except
the very first: they are served from the last answer (its time is on the page) while a task in
the server's nursery fetches the next one. Every read goes through `ask`, which only passes the
commands in READ_COMMANDS: the page cannot ask the daemon to change anything.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import trio

log = logging.getLogger(__name__)

Ask = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]  # one control request -> its (last) answer
READ_COMMANDS = frozenset({"catalogue", "audit", "replicate_status"})
MAX_AGE = 15.0  # seconds a catalogue is shown before a page asks for a new one
FIRST_WAIT = 10.0  # seconds the first page waits for the first catalogue before it says it is still coming


class AskError(Exception):
    """The daemon refused or could not answer a request: one line, shown on the page."""


def read_only(ask: Ask) -> Ask:
    """`ask`, refusing every command that is not a read."""

    async def checked(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("cmd") not in READ_COMMANDS:
            raise AskError(f"the catalogue page only reads: {request.get('cmd')!r} is not one of {sorted(READ_COMMANDS)}")
        reply = await ask(request)
        if not reply.get("ok", False):
            raise AskError(str(reply.get("error") or "the daemon refused the request"))
        return reply

    return checked


@dataclass
class Snapshot:
    taken_at: float = 0.0
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    retention_policy: bool = False
    drills: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the last refresh failed: shown with the catalogue it kept
    by_path: dict[str, dict[str, Any]] = field(default_factory=dict)


class Snapshots:
    def __init__(self, ask: Ask, path: str, max_age: float = MAX_AGE) -> None:
        self.ask, self.path, self.max_age = read_only(ask), path, max_age
        self.current: Snapshot | None = None
        self._wanted = trio.Event()
        self._fresh = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fetch the catalogue whenever a page wants a newer one; until cancelled."""
        task_status.started()
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            await self.refresh()
            self._fresh.set()
            self._fresh = trio.Event()

    async def refresh(self) -> None:
        try:
            reply = await self.ask({"cmd": "catalogue", "path": self.path})
        except (AskError, OSError) as e:
            log.info("catalogue page: reading the catalogue failed: %s", e)
            old = self.current or Snapshot()
            self.current = Snapshot(time.time() if not old.taken_at else old.taken_at, old.checkpoints, old.retention_policy,
                                    old.drills, str(e), old.by_path)
            return
        entries = reply.get("checkpoints") or []
        self.current = Snapshot(time.time(), entries, bool(reply.get("retention_policy")), reply.get("drills") or {}, None,
                                {e["path"]: e for e in entries})

    async def get(self) -> Snapshot:
        """The catalogue to show now: the last one, a newer one asked for if it is old; the first one waited for
        FIRST_WAIT at most (then an empty one that says so: the page refreshes itself)."""
        if self.current is None or time.time() - self.current.taken_at > self.max_age:
            self._wanted.set()
        with trio.move_on_after(FIRST_WAIT):
            while self.current is None:
                await self._fresh.wait()
        return self.current or Snapshot(error="still reading the catalogue from the bucket (many checkpoints take a while): "
                                              "this page fills in by itself")
