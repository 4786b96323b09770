"""The supervisor of the daemon's background services (gateway/supervisor.py), on trio's virtual clock.

Restarts come after a doubling backoff (virtual time: the assertions are about the schedule the
supervisor keeps, not about how fast this machine is), are counted and shown; cancellation and
KeyboardInterrupt pass through; a fatal error stops instead of restarting; the same error is logged
with its traceback once.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import pytest
import trio
import trio.testing

from ckptfs.supervisor import InjectedFault, Supervisor


class Flaky:
    """A service that fails `failures` times (after reporting started), then runs until cancelled."""

    def __init__(self, failures: int, error: type[Exception] = RuntimeError) -> None:
        self.failures, self.error = failures, error
        self.starts: list[float] = []
        self.cancelled = 0

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(trio.current_time())
        task_status.started("port 1")
        await trio.sleep(0.01)
        if len(self.starts) <= self.failures:
            raise self.error("the disk said no")
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled += 1
            raise


def run_virtual(fn: Any) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_failing_service_restarts_with_a_doubling_backoff_counted_and_shown() -> None:
    service = Flaky(failures=3)
    counted: list[str] = []
    sup = Supervisor(on_restart=counted.append, first_backoff=0.5, max_backoff=30.0)
    seen: list[dict[str, Any]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            value = await nursery.start(sup.supervise, "drainer", service.run)
            assert value == "port 1"  # the first start's value reaches the caller
            await trio.sleep(0.3)  # inside the first backoff
            seen.append(sup.status()["drainer"])
            await trio.sleep(60)
            seen.append(sup.status()["drainer"])
            nursery.cancel_scope.cancel()

    run_virtual(main)
    gaps = [round(b - a - 0.01, 3) for a, b in zip(service.starts, service.starts[1:])]
    assert gaps == [0.5, 1.0, 2.0]
    assert counted == ["drainer"] * 3
    assert seen[0] == {"state": "restarting", "restarts": 1, "last_error": "RuntimeError: the disk said no"}
    assert seen[1] == {"state": "running", "restarts": 3, "last_error": "RuntimeError: the disk said no"}


def test_the_backoff_is_capped_and_starts_over_after_a_long_run() -> None:
    sup = Supervisor(first_backoff=0.5, max_backoff=4.0, reset_after=60.0)
    assert [sup.backoff(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    starts: list[float] = []

    async def fails_late(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started()
        await trio.sleep(100 if len(starts) in (3, 4) else 0)  # the 3rd and 4th runs last past reset_after
        raise RuntimeError("late")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.supervise, "fetcher", fails_late)
            await trio.sleep(300)
            nursery.cancel_scope.cancel()

    run_virtual(main)
    gaps = [round(b - a, 3) for a, b in zip(starts, starts[1:])][:5]
    assert gaps == [0.5, 1.0, 100.5, 100.5, 1.0]  # each long run reset the count: 0.5 again, then doubling


def test_cancellation_passes_through_and_is_not_a_restart() -> None:
    service = Flaky(failures=0)
    counted: list[str] = []
    sup = Supervisor(on_restart=counted.append)

    async def main() -> None:
        with trio.move_on_after(5):
            async with trio.open_nursery() as nursery:
                await nursery.start(sup.supervise, "listings", service.run)
        assert sup.status() == {}  # a service that is not running is not listed

    run_virtual(main)
    assert service.cancelled == 1 and len(service.starts) == 1 and counted == []


def test_keyboard_interrupt_is_not_restarted() -> None:
    sup = Supervisor()
    starts: list[int] = []

    async def interrupted(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(1)
        task_status.started()
        raise KeyboardInterrupt

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.supervise, "control", interrupted)

    with pytest.raises(BaseException) as caught:
        run_virtual(main)
    assert caught.group_contains(KeyboardInterrupt) if isinstance(caught.value, BaseExceptionGroup) else caught.type is KeyboardInterrupt
    assert starts == [1]


def test_a_failure_before_the_first_start_fails_the_start() -> None:
    """A busy metrics port at start-up stays the daemon's one-line error: the caller's start raises it."""
    sup = Supervisor()

    async def refused(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        raise OSError(98, "Address already in use")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with pytest.raises(OSError, match="Address already in use"):
                await nursery.start(sup.supervise, "metrics", refused)

    run_virtual(main)


def test_a_restart_that_fails_to_start_is_one_more_failure() -> None:
    starts: list[float] = []
    counted: list[str] = []
    sup = Supervisor(on_restart=counted.append, first_backoff=1.0)

    async def port_taken_later(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        if len(starts) in (2, 3):
            raise OSError(98, "Address already in use")  # someone took the port while it restarted
        task_status.started()
        if len(starts) == 1:
            raise RuntimeError("boom")
        await trio.sleep_forever()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.supervise, "metrics", port_taken_later)
            await trio.sleep(100)
            assert sup.status()["metrics"] == {"state": "running", "restarts": 3, "last_error": "OSError: [Errno 98] Address already in use"}
            nursery.cancel_scope.cancel()

    run_virtual(main)
    assert [round(b - a, 3) for a, b in zip(starts, starts[1:])] == [1.0, 2.0, 4.0]
    assert counted == ["metrics"] * 3


def test_a_fatal_error_stops_instead_of_restarting() -> None:
    """The journal failing for good is not retried: the daemon is told why, once, and stops."""
    told: list[tuple[str, str]] = []
    counted: list[str] = []

    def journal_gone(exc: BaseException) -> str | None:
        return "the journal is corrupt" if isinstance(exc, sqlite3.DatabaseError) else None

    sup = Supervisor(on_restart=counted.append, fatal=journal_gone, on_fatal=lambda name, why: told.append((name, why)))
    service = Flaky(failures=5, error=sqlite3.DatabaseError)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.supervise, "drainer", service.run)
            await trio.sleep(100)
            nursery.cancel_scope.cancel()  # what the daemon does once it stopped

    run_virtual(main)
    assert told == [("drainer", "the journal is corrupt")]
    assert len(service.starts) == 1 and counted == []


def test_a_service_that_must_not_restart_stops_the_daemon() -> None:
    """The FUSE session (`critical`): any failure is fatal."""
    told: list[tuple[str, str]] = []
    sup = Supervisor(on_fatal=lambda name, why: told.append((name, why)))
    service = Flaky(failures=1)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.critical, "fuse", service.run)
            await trio.sleep(100)
            nursery.cancel_scope.cancel()

    run_virtual(main)
    assert told == [("fuse", "fuse failed: RuntimeError: the disk said no")]
    assert len(service.starts) == 1


def test_the_same_error_is_logged_with_its_traceback_once(caplog: pytest.LogCaptureFixture) -> None:
    service = Flaky(failures=4)
    sup = Supervisor(first_backoff=0.1)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.supervise, "lifecycle", service.run)
            await trio.sleep(100)
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING, logger="ckptfs.supervisor"):
        run_virtual(main)
    records = [r for r in caplog.records if r.name == "ckptfs.supervisor"]
    assert len(records) == 4
    assert [r.exc_info is not None for r in records] == [True, False, False, False]
    assert "failed unexpectedly: RuntimeError: the disk said no" in records[0].getMessage()
    assert "(4 times in a row)" in records[3].getMessage()
    assert all("\n" not in r.getMessage() for r in records)


def test_faults_are_injected_only_into_the_services_a_test_named() -> None:
    starts: list[int] = []
    sup = Supervisor(faults=frozenset({"drainer"}), first_backoff=0.5)

    async def steady(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(1)
        task_status.started()
        await trio.sleep_forever()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.supervise, "drainer", steady)
            await nursery.start(sup.supervise, "control", steady)
            with pytest.raises(KeyError):
                sup.inject_fault("control")  # not named in CKPTFS_TEST_FAULTS
            sup.inject_fault("drainer")
            await trio.sleep(10)
            assert sup.status()["drainer"] == {"state": "running", "restarts": 1,
                                               "last_error": "InjectedFault: fault injected into drainer by a test (CKPTFS_TEST_FAULTS)"}
            sup.inject_fault("drainer")  # a second time, on the restarted service
            await trio.sleep(10)
            assert sup.status()["drainer"]["restarts"] == 2
            assert sup.status()["control"]["restarts"] == 0
            nursery.cancel_scope.cancel()

    run_virtual(main)
    assert len(starts) == 4  # drainer 3 times, control once
    assert issubclass(InjectedFault, Exception)


def test_only_a_journal_that_cannot_be_used_any_more_is_fatal(tmp_path: Any) -> None:
    """Real SQLite errors: a database file overwritten with garbage is fatal; a busy or full one is not (restarted)."""
    from ckptfs.supervisor import journal_failed_for_good

    path = tmp_path / "journal.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t(x)")
    db.commit()
    db.close()
    path.write_bytes(b"this is not a database" * 1000)
    with pytest.raises(sqlite3.DatabaseError) as corrupt:
        sqlite3.connect(path).execute("SELECT * FROM t")
    why = journal_failed_for_good(corrupt.value)
    assert why is not None and "the journal cannot be used any more (DatabaseError: file is not a database)" == why
    # wrapped as a service raises it: inside a nursery's group, as the cause of another error
    try:
        try:
            raise corrupt.value
        except sqlite3.DatabaseError as e:
            raise RuntimeError("recording an upload failed") from e
    except RuntimeError as wrapped:
        assert journal_failed_for_good(ExceptionGroup("nursery", [wrapped])) == why

    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
    assert journal_failed_for_good(busy) is None
    assert journal_failed_for_good(OSError(28, "No space left on device")) is None
    assert journal_failed_for_good(RuntimeError("a bug")) is None
