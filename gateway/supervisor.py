"""Supervision of the daemon's background services: an unexpected error restarts one service, never the mount.

Every service (the drainer, the listings, the fetcher, the control socket, the metrics server, the
lifecycle, the cold mover, replication) runs in the daemon's one nursery; unsupervised, an exception
nobody expected in any of them would cancel the FUSE session with it and leave a dead mount. Here each
runs in a loop of its own: an `Exception` it raises is logged (its traceback the first time; the same
error again is counted and logged in one line), counted (`ckptfs_service_restarts_total{service}`),
shown in `ckptfs status` (`services`), and the service is started again after a backoff that doubles
from `first_backoff` up to `max_backoff` (reset once it ran `reset_after` seconds without failing).

Cancellation (`trio.Cancelled`: the daemon stopping), `KeyboardInterrupt` and any other
`BaseException` are never errors to restart: they pass through. A service that fails before it first
reports started (`task_status.started()`) fails the daemon's start as before (a busy metrics port is one
`UserError` line); failing while it restarts only counts as one more failure. An error `fatal` names (the
journal failing for good), and any error of a service supervised with `restart=False` (the FUSE
session), is not retried: `on_fatal` is told why, and the daemon stops cleanly.

Why a loop and not a retry library (tenacity and the like): a restart here is not a function called
again but a task that reports started once to its nursery, may fail before or after that, and has a
state other tasks read (`status`); under trio that is a few lines with `nursery.start`'s `task_status`,
and a retry decorator would hide exactly the parts that matter.

For tests only: `CKPTFS_TEST_FAULTS=NAME[,NAME...]` (read once, when the daemon starts) lets the control
request `{"cmd": "inject_fault", "service": NAME}` raise `InjectedFault` inside that running service, so
a test can show a real mount surviving a service's failure. Unset (always, outside tests) the request
does not exist.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import traceback
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import trio

log = logging.getLogger(__name__)

RUNNING = "running"
RESTARTING = "restarting"
TEST_FAULTS_ENV = "CKPTFS_TEST_FAULTS"


class InjectedFault(RuntimeError):
    """The failure a test asked for (CKPTFS_TEST_FAULTS): an unexpected exception like any other."""


@dataclass
class ServiceState:
    """What `status` shows of one service, and what the restart loop needs to know."""

    name: str
    state: str = RESTARTING  # until it first reports started
    restarts: int = 0
    last_error: str | None = None
    failures_in_a_row: int = 0
    last_signature: tuple[str, ...] | None = None  # the last error's type, text and place: a repeat is logged briefly
    repeats: int = 0  # how many times in a row that same error came back
    fault: trio.Event = field(default_factory=trio.Event)

    def as_status(self) -> dict[str, Any]:
        return {"state": self.state, "restarts": self.restarts, "last_error": self.last_error}


def leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (nurseries wrap what they raise)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    """One line: `Type: message`."""
    exc = leaf(exc)
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _signature(exc: BaseException) -> tuple[str, ...]:
    """What makes two failures 'the same error': type, message and the line that raised it."""
    exc = leaf(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return (type(exc).__qualname__, str(exc), where)


def faults_from_environment() -> frozenset[str]:
    """Services a test may inject a fault into (CKPTFS_TEST_FAULTS); empty outside tests."""
    value = os.environ.get(TEST_FAULTS_ENV, "")
    return frozenset(n.strip() for n in value.split(",") if n.strip())


class Supervisor:
    def __init__(self, *, on_restart: Callable[[str], None] = lambda name: None,
                 fatal: Callable[[BaseException], str | None] = lambda exc: None,
                 on_fatal: Callable[[str, str], None] = lambda name, why: None,
                 faults: frozenset[str] = frozenset(),
                 first_backoff: float = 0.5, max_backoff: float = 30.0, reset_after: float = 60.0) -> None:
        self.services: dict[str, ServiceState] = {}
        self.on_restart, self.fatal, self.on_fatal = on_restart, fatal, on_fatal
        self.faults = faults
        self.first_backoff, self.max_backoff, self.reset_after = first_backoff, max_backoff, reset_after
        if faults:
            log.warning("%s is set: tests may inject failures into %s (never set it outside tests)",
                        TEST_FAULTS_ENV, ", ".join(sorted(faults)))

    def status(self) -> dict[str, dict[str, Any]]:
        """name -> {"state": "running"|"restarting", "restarts": N, "last_error": str|None}."""
        return {name: s.as_status() for name, s in self.services.items()}

    def inject_fault(self, name: str) -> None:
        """Make service `name` raise InjectedFault (tests only). KeyError if faults are not enabled for it or it is not running."""
        if name not in self.faults:
            raise KeyError(f"faults are not enabled for service {name!r} ({TEST_FAULTS_ENV})")
        state = self.services.get(name)
        if state is None:
            raise KeyError(f"no service {name!r} runs")
        state.fault.set()

    def backoff(self, failures_in_a_row: int) -> float:
        return min(self.max_backoff, self.first_backoff * 2 ** max(0, failures_in_a_row - 1))

    async def supervise(self, name: str, run: Callable[..., Awaitable[Any]], *args: Any,
                        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Run `run(*args, task_status=...)` as service `name` until cancelled, restarting it after an unexpected error.

        Reports started (with the value the service reports) the first time the service does; an exception
        before that propagates to the caller's `nursery.start`. Returns when the service returns.
        """
        await self._supervise(name, run, args, True, task_status)

    async def critical(self, name: str, run: Callable[..., Awaitable[Any]], *args: Any,
                       task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Like `supervise`, but any failure after the start is fatal (`on_fatal`): the FUSE session."""
        await self._supervise(name, run, args, False, task_status)

    async def _supervise(self, name: str, run: Callable[..., Awaitable[Any]], args: tuple[Any, ...], restart: bool,
                         task_status: trio.TaskStatus[Any]) -> None:
        state = self.services[name] = ServiceState(name)
        reported = False

        class _Started:
            """The service's task_status: the first start is passed on to the caller's nursery.start."""

            def started(self, value: Any = None) -> None:
                nonlocal reported
                state.state = RUNNING
                if not reported:
                    reported = True
                    task_status.started(value)

        try:
            while True:
                began = trio.current_time()
                try:
                    await self._run_once(state, run, args, _Started())
                except BaseException as exc:  # noqa: BLE001 - sorted below: only plain Exceptions are restarted
                    if not reported:
                        raise  # failed to start: the caller's start fails (one line for a user error)
                    if not isinstance(exc, Exception):  # a group with a Cancelled in it is a BaseExceptionGroup, not an Exception
                        raise  # cancelled (the daemon stops), KeyboardInterrupt, SystemExit: never an error to restart
                    why = self.fatal(exc) or (None if restart else f"{name} failed: {describe(exc)}")
                    state.state, state.last_error = RESTARTING, describe(exc)
                    if why is not None:
                        log.error("%s failed: %s", name, describe(exc), exc_info=leaf(exc))
                        self.on_fatal(name, why)
                        await trio.sleep_forever()  # the daemon stops: it cancels this
                    if trio.current_time() - began >= self.reset_after:  # it ran well a while: a new episode
                        state.failures_in_a_row, state.last_signature = 0, None
                    state.failures_in_a_row += 1
                    delay = self.backoff(state.failures_in_a_row)
                    self._log_failure(state, exc, delay)
                    state.restarts += 1
                    self.on_restart(name)
                    state.fault = trio.Event()
                    await trio.sleep(delay)
                    continue
                log.debug("service %s finished", name)
                return
        finally:
            if self.services.get(name) is state:
                del self.services[name]

    async def _run_once(self, state: ServiceState, run: Callable[..., Awaitable[Any]], args: tuple[Any, ...], started: Any) -> None:
        if state.name not in self.faults:
            await run(*args, task_status=started)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fault_point, state)
            await run(*args, task_status=started)
            nursery.cancel_scope.cancel()

    @staticmethod
    async def _fault_point(state: ServiceState) -> None:
        await state.fault.wait()
        raise InjectedFault(f"fault injected into {state.name} by a test ({TEST_FAULTS_ENV})")

    def _log_failure(self, state: ServiceState, exc: BaseException, delay: float) -> None:
        signature = _signature(exc)
        if signature != state.last_signature:
            state.last_signature, state.repeats = signature, 0
            log.error("service %s failed unexpectedly: %s; restarting it in %.1fs", state.name, describe(exc), delay,
                      exc_info=leaf(exc))
            return
        state.repeats += 1
        log.warning("service %s failed again with the same error (%d times in a row): %s; restarting it in %.1fs",
                    state.name, state.repeats + 1, describe(exc), delay)


def journal_failed_for_good(exc: BaseException) -> str | None:
    """Why a service's error means the journal cannot be used any more (corrupt, replaced), else None.

    A full disk or an I/O error may pass (the service restarts and tries again); a corrupt database does not."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(c for c in (e.__cause__, e.__context__) if c is not None)
        code = getattr(e, "sqlite_errorcode", None) if isinstance(e, sqlite3.DatabaseError) else None
        if code is not None and (code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
                                 or code == getattr(sqlite3, "SQLITE_READONLY_DBMOVED", -1)):
            return f"the journal cannot be used any more ({describe(e)})"
    return None
