from __future__ import annotations

import os
import time
import threading
from pathlib import Path
from typing import Callable

import pytest
import trio
import trio.testing

from ckptfs.cache import Cache
from ckptfs.config import load_config
from ckptfs.journal import DIRTY, DURABLE, ROOT_INODE, Journal, JournalError
from ckptfs.namespace import Namespace


def make_ns(tmp_path: Path, **opts) -> Namespace:  # type: ignore[no-untyped-def]
    cfg = load_config(environ={}, overrides=dict(bucket="ckpt", prefix="p", mountpoint="/m", cache_dir=str(tmp_path), **{"upload_delay": 0, **opts}))
    j = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    ns = Namespace(cfg, j, Cache(tmp_path, 0))
    ns.recover()
    return ns


def write_file(ns: Namespace, parent: int, name: str, data: bytes) -> int:
    row = ns.tree.create(parent, name, 0o644, 0, 0)
    fd = ns.files.open(row.ino, write=True)
    ns.files.write(row.ino, fd, 0, data)
    import os

    os.close(fd)
    ns.files.release(row.ino, write=True)
    ns.tree.reap(row.ino)
    return row.ino


def test_foreign_journal_is_refused(tmp_path: Path) -> None:
    Journal(tmp_path / "j.db", "ckpt", "p").close()
    with pytest.raises(JournalError, match="belongs to s3://ckpt/p"):
        Journal(tmp_path / "j.db", "other", "p")
    with pytest.raises(JournalError, match="belongs to"):
        Journal(tmp_path / "j.db", "ckpt", "q")


def test_corrupt_journal_is_refused(tmp_path: Path) -> None:
    (tmp_path / "j.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(JournalError, match="move it aside"):
        Journal(tmp_path / "j.db", "ckpt", "p")


def test_inode_numbers_never_reused_across_restarts(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    ns.tree.unlink(ROOT_INODE, "a")
    ns.tree.forget(a, 1)
    b = write_file(ns, ROOT_INODE, "b", b"2")
    ns.journal.close()
    ns2 = make_ns(tmp_path)
    c = write_file(ns2, ROOT_INODE, "c", b"3")
    assert len({a, b, c}) == 3 and c > b > a


def test_rename_before_upload_goes_to_final_key(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    tmpdir = ns.tree.mkdir(ROOT_INODE, "step.tmp", 0o755, 0, 0)
    write_file(ns, tmpdir.ino, "shard", b"x" * 10)
    ns.tree.rename(ROOT_INODE, "step.tmp", ROOT_INODE, "step", noreplace=False)
    ready, _ = ns.uploads.candidates(now=1e12, busy=set())
    assert [p.key for p in ready] == ["p/step/shard"]
    assert ns.journal.pending_deletes() == []


def test_rename_of_durable_file_reuploads_then_deletes_old_key(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    ino = write_file(ns, ROOT_INODE, "old", b"data")
    t = ns.uploads.begin_upload(ino)
    assert t is not None and t.key == "p/old"
    assert ns.uploads.finish_upload(t, "etag1", "h")
    assert ns.files.row(ino).state == DURABLE
    ns.tree.rename(ROOT_INODE, "old", ROOT_INODE, "new", noreplace=False)
    assert ns.files.row(ino).state == DIRTY
    # the old object is deleted only after the new one is durable
    assert ns.uploads.ready_deletes(set()) == []
    t2 = ns.uploads.begin_upload(ino)
    assert t2 is not None and t2.key == "p/new"
    assert ns.uploads.finish_upload(t2, "etag2", "h")
    assert [key for _, key in ns.uploads.ready_deletes(set())] == ["p/old"]


def test_change_during_upload_is_not_published(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    ino = write_file(ns, ROOT_INODE, "f", b"v1")
    t = ns.uploads.begin_upload(ino)
    assert t is not None
    fd = ns.files.open(ino, write=True)
    ns.files.write(ino, fd, 0, b"v2")
    assert not ns.uploads.still_current(t)
    assert not ns.uploads.finish_upload(t, "e", "h")
    assert ns.files.row(ino).state == DIRTY


def test_unlink_during_upload_deletes_the_stale_object(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    ino = write_file(ns, ROOT_INODE, "f", b"v1")
    t = ns.uploads.begin_upload(ino)
    ns.tree.unlink(ROOT_INODE, "f")
    assert t is not None and not ns.uploads.finish_upload(t, "e", "h")
    assert [key for _, key in ns.uploads.ready_deletes(set())] == ["p/f"]


def test_overwrite_by_rename_does_not_delete_the_new_object(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    old = write_file(ns, ROOT_INODE, "model", b"old")
    t = ns.uploads.begin_upload(old)
    assert t is not None and ns.uploads.finish_upload(t, "e1", "h")
    new = write_file(ns, ROOT_INODE, "model.tmp", b"new")
    ns.tree.rename(ROOT_INODE, "model.tmp", ROOT_INODE, "model", noreplace=False)
    # the queued delete of p/model waits: the live file will replace the object
    assert ns.uploads.ready_deletes(set()) == []
    t2 = ns.uploads.begin_upload(new)
    assert t2 is not None and t2.key == "p/model" and ns.uploads.finish_upload(t2, "e2", "h")
    assert ns.uploads.ready_deletes(set()) == []  # and is dropped once it did
    assert ns.journal.pending_deletes() == []


def test_commit_marker_waits_for_the_rest_of_its_directory(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    step = ns.tree.mkdir(ROOT_INODE, "step", 0o755, 0, 0)
    sub = ns.tree.mkdir(step.ino, "sub", 0o755, 0, 0)
    marker = write_file(ns, step.ino, ".metadata", b"m")
    shard = write_file(ns, sub.ino, "shard", b"s")
    ready, _ = ns.uploads.candidates(now=1e12, busy=set())
    assert [p.ino for p in ready] == [shard]
    t = ns.uploads.begin_upload(shard)
    assert t is not None and ns.uploads.finish_upload(t, "e", "h")
    ready, _ = ns.uploads.candidates(now=1e12, busy=set())
    assert [p.ino for p in ready] == [marker]


def test_oldest_close_first_and_upload_delay(tmp_path: Path) -> None:
    ns = make_ns(tmp_path, upload_delay=10)
    first = write_file(ns, ROOT_INODE, "first", b"1")
    second = write_file(ns, ROOT_INODE, "second", b"2")
    ns.journal.update(first, closed_at=100.0)
    ns.journal.update(second, closed_at=50.0)
    ready, next_at = ns.uploads.candidates(now=55.0, busy=set())
    assert ready == [] and next_at == 60.0
    ready, _ = ns.uploads.candidates(now=200.0, busy=set())
    assert [p.ino for p in ready] == [second, first]


def test_recover_after_crash_requeues_uploading_files(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    ino = write_file(ns, ROOT_INODE, "f", b"12345")
    assert ns.uploads.begin_upload(ino) is not None
    ns.journal.close()  # crash: nothing else happens
    ns2 = make_ns(tmp_path)
    row = ns2.files.row(ino)
    assert row.state == DIRTY and row.size == 5
    ready, _ = ns2.uploads.candidates(now=1e12, busy=set())
    assert [p.key for p in ready] == ["p/f"]


def test_fsync_then_close_still_waits_for_upload_delay(tmp_path: Path) -> None:
    import os
    import time

    ns = make_ns(tmp_path, upload_delay=60)
    row = ns.tree.create(ROOT_INODE, "f.tmp", 0o644, 0, 0)
    fd = ns.files.open(row.ino, write=True)
    ns.files.write(row.ino, fd, 0, b"data")
    trio.run(ns.files.fsync, row.ino)
    os.close(fd)
    ns.files.release(row.ino, write=True)
    now = time.time()
    ready, next_at = ns.uploads.candidates(now=now, busy=set())
    assert ready == [] and next_at is not None and next_at > now + 50


# ---------------------------------------------------------------- a listing racing a delete
def _upload(ns: Namespace, ino: int, etag: str) -> None:
    t = ns.uploads.begin_upload(ino)
    assert t is not None and ns.uploads.finish_upload(t, etag, "h")


def _run_deletes(ns: Namespace) -> list[str]:
    """What the drainer does with every queued delete, in its order (children before their `dir/`)."""
    done: list[str] = []
    ns.uploads.ready_markers(now=0, busy_keys=set())  # drops the markers of directories gone meanwhile
    while ready := ns.uploads.ready_deletes(set()):
        for delete_id, key in ready:
            ns.uploads.delete_done(delete_id, key)
            done.append(key)
    return done


def _uploaded_tree(ns: Namespace) -> tuple[int, int]:
    """t/d/f and t/e/g, durable in the bucket; returns the inodes of t and t/d."""
    t = ns.tree.mkdir(ROOT_INODE, "t", 0o755, 0, 0)
    d = ns.tree.mkdir(t.ino, "d", 0o755, 0, 0)
    e = ns.tree.mkdir(t.ino, "e", 0o755, 0, 0)
    _upload(ns, write_file(ns, d.ino, "f", b"1"), "ef")
    _upload(ns, write_file(ns, e.ino, "g", b"2"), "eg")
    return t.ino, d.ino


def test_listing_started_before_a_finished_rm_rf_does_not_bring_the_tree_back(tmp_path: Path) -> None:
    import time

    from ckptfs.objects import Listing, RemoteObject

    ns = make_ns(tmp_path)
    t, d = _uploaded_tree(ns)
    # a listing of t starts while everything is still in the bucket ...
    started = time.time()
    stale_t = Listing(["d", "e"], [], False)
    stale_d = Listing([], [RemoteObject("f", 1, "ef", started)], False)
    # ... meanwhile `rm -rf t/d t/e` runs and the drainer finishes every delete
    ns.tree.unlink(d, "f")
    ns.tree.rmdir(t, "d")
    e = ns.journal.lookup(t, "e")
    assert e is not None
    ns.tree.unlink(e.ino, "g")
    ns.tree.rmdir(t, "e")
    assert sorted(_run_deletes(ns)) == ["p/t/d/", "p/t/d/f", "p/t/e/", "p/t/e/g"]
    # ... and only then the listing answers: the directories it saw are gone, not new
    ns.merge.merge(t, started, stale_t)
    assert [r.name for r in ns.journal.children(t)] == []
    ns.merge.merge(d, started, stale_d)
    ns.tree.rmdir(ROOT_INODE, "t")  # no ENOTEMPTY
    _run_deletes(ns)
    assert ns.journal.resolve("t") is None
    assert ns.uploads.ready_markers(now=1e12, busy_keys=set()) == ([], None)  # no `t/`, `t/d/` put back
    # a listing that started after the deletes finished still shows what other nodes write there
    later = time.time() + 1
    ns.merge.merge(ROOT_INODE, later, Listing(["t"], [], False))
    assert ns.journal.resolve("t") is not None


def test_marker_put_racing_rmdir_is_deleted_again(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    new = ns.tree.mkdir(ROOT_INODE, "new", 0o755, 0, 0)  # never in the bucket: its state is not durable
    [(marker_id, key)], _ = ns.uploads.ready_markers(now=1e12, busy_keys=set())
    assert key == "p/new/"
    # the drainer is putting the marker when the directory is removed
    ns.tree.rmdir(ROOT_INODE, "new")
    ns.tree.forget(new.ino, 0)
    ns.uploads.marker_done(marker_id, key)
    assert [k for _, k in ns.uploads.ready_deletes(set())] == ["p/new/"]



def test_a_full_journal_gives_up_its_reserve_then_fails_with_enospc_and_changes_nothing(tmp_path: Path) -> None:
    import errno
    import os

    from ckptfs.journal import JOURNAL_RESERVE, DiskFull

    j = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    reserve = tmp_path / "journal.reserve"
    assert os.stat(reserve).st_size == JOURNAL_RESERVE and os.stat(reserve).st_mode & 0o777 == 0o600
    with j.transaction():
        a = j.insert(ROOT_INODE, "a", "file", 0o644, 0, 0, DIRTY)
    # SQLITE_FULL without filling a disk: the database may not grow past its pages now
    pages = j.db.execute("PRAGMA page_count").fetchone()[0]
    j.db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(DiskFull) as e:
        with j.transaction():
            j.update(a.ino, size=1)
            for i in range(200):
                j.insert(ROOT_INODE, f"f{i}-" + "x" * 200, "file", 0o644, 0, 0, DIRTY)
    assert e.value.errno == errno.ENOSPC
    # inside a transaction SQLite may have undone part of it: no retry, the whole change is rolled back;
    # the disk is full, so the reserve is given up for the next change
    assert os.stat(reserve).st_size == 0
    assert not j.db.in_transaction
    got = j.get(a.ino)
    assert got is not None and got.size == 0
    assert [r.name for r in j.children(ROOT_INODE)] == ["a"]
    j.sync()  # the disk itself has room (only the page count is capped): the reserve is taken back
    assert os.stat(reserve).st_size == JOURNAL_RESERVE
    # a statement on its own is retried once after giving the reserve up (here the retry finds no room either)
    with pytest.raises(DiskFull):
        for i in range(200):
            j.insert(ROOT_INODE, f"g{i}-" + "x" * 200, "file", 0o644, 0, 0, DIRTY)
    assert os.stat(reserve).st_size == 0
    # the journal goes on: a change that fits commits, and the next fsync of the journal takes the reserve back
    j.update(a.ino, size=7)
    trio.run(j.durable)
    assert os.stat(reserve).st_size == JOURNAL_RESERVE
    assert j._release_reserve() and os.stat(reserve).st_size == 0
    j.sync()  # the blocking one (open, recovery, stop) too
    assert os.stat(reserve).st_size == JOURNAL_RESERVE
    got = j.get(a.ino)
    assert got is not None and got.size == 7  # type: ignore[union-attr]


# ------------------------------------------------------- the journal's fsync, off the trio thread
def _wal_fsyncs(monkeypatch: pytest.MonkeyPatch, on_wal: Callable[[int], None]) -> None:
    """Route every os.fsync of a `-wal` file through `on_wal(fd)`; other fsyncs stay real."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("-wal"):
            on_wal(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_durable_fsyncs_the_wal_in_a_thread_while_the_trio_thread_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    events: list[str] = []
    started, release = threading.Event(), threading.Event()

    def stalled_disk(fd: int) -> None:
        events.append("fsync started")
        started.set()
        assert release.wait(60)
        events.append("fsync done")  # the real fsync follows at once

    _wal_fsyncs(monkeypatch, stalled_disk)

    async def main() -> None:
        with j.transaction():
            a = j.insert(ROOT_INODE, "a", "file", 0o644, 0, 0, DIRTY)

        async def acknowledge() -> None:
            await j.durable()
            events.append("durable returned")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(acknowledge)
            await trio.to_thread.run_sync(started.wait, 60)
            # the fsync hangs in its thread; the trio thread keeps using the journal meanwhile
            with j.transaction():
                j.insert(ROOT_INODE, "b", "file", 0o644, 0, 0, DIRTY)
            j.update(a.ino, size=5)
            got = j.get(a.ino)
            assert j.lookup(ROOT_INODE, "b") is not None and got is not None and got.size == 5
            await trio.testing.wait_all_tasks_blocked()
            assert events == ["fsync started"]  # not acknowledged while the fsync is still running
            release.set()
        assert events == ["fsync started", "fsync done", "durable returned"]

    trio.run(main)
    j.close()


def test_concurrent_durable_calls_share_one_fsync_that_started_after_their_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    started: list[int] = []  # WAL fsyncs, numbered in the order they started
    finished: list[int] = []
    first_started, release = threading.Event(), threading.Event()

    def counted(fd: int) -> None:
        n = len(started)
        started.append(n)
        if n == 0:
            first_started.set()
            assert release.wait(60)
        finished.append(n)

    _wal_fsyncs(monkeypatch, counted)
    seen: dict[int, tuple[int, list[int]]] = {}

    async def writer(k: int) -> None:
        with j.transaction():
            j.insert(ROOT_INODE, f"w{k}", "file", 0o644, 0, 0, DIRTY)
        begun_before_commit = len(started)  # an fsync that started before the commit may not cover it
        await j.durable()
        seen[k] = (begun_before_commit, list(finished))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(j.durable)  # fsync 0, held up by a busy disk
            await trio.to_thread.run_sync(first_started.wait, 60)
            for k in range(8):
                nursery.start_soon(writer, k)
            await trio.testing.wait_all_tasks_blocked()  # all 8 committed and wait
            release.set()

    trio.run(main)
    assert len(started) == 2  # fsync 0, then one for all 8 writers: not 8 in a row
    for k, (begun, done_at_return) in seen.items():
        assert begun == 1 and any(n >= begun for n in done_at_return), (k, begun, done_at_return)
    j.close()


def test_a_failed_journal_fsync_fails_every_caller_sharing_it_and_the_next_one_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    j = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    calls: list[int] = []
    first_started, release = threading.Event(), threading.Event()

    def disk(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # a first fsync holds the disk while three callers line up behind it
            first_started.set()
            assert release.wait(60)
        elif len(calls) == 2:  # the one they share fails
            raise OSError(errno.EIO, "Input/output error")

    _wal_fsyncs(monkeypatch, disk)
    outcomes: list[str] = []

    async def acknowledge() -> None:
        try:
            await j.durable()
            outcomes.append("ok")
        except OSError as e:
            outcomes.append(errno.errorcode[e.errno or 0])

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(acknowledge)
            await trio.to_thread.run_sync(first_started.wait, 60)
            for _ in range(3):
                nursery.start_soon(acknowledge)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        await acknowledge()  # a later fsync is tried again

    trio.run(main)
    assert outcomes == ["ok", "EIO", "EIO", "EIO", "ok"] and len(calls) == 3
    j.close()


def test_the_first_fsync_of_a_wal_file_also_makes_its_name_and_the_database_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    j._synced_wal_ino = None  # as if the WAL file were new (a journal reopened after a clean stop)
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    j.update(ROOT_INODE, mode=0o40700)
    trio.run(j.durable)
    assert synced == ["journal.sqlite3-wal", "journal.sqlite3", tmp_path.name]
    synced.clear()
    j.update(ROOT_INODE, mode=0o40755)
    trio.run(j.durable)
    assert synced == ["journal.sqlite3-wal"]  # from then on the WAL alone
    j.close()


def test_a_listing_merged_after_a_later_one_keeps_what_the_later_one_confirmed(tmp_path: Path) -> None:
    from ckptfs.objects import Listing, RemoteObject

    ns = make_ns(tmp_path)
    older, later = 1000.0, 2000.0
    # another node's object, first seen by a listing that started at `later` (merged first) ...
    ns.merge.merge(ROOT_INODE, later - 500, Listing(["sub"], [RemoteObject("x", 1, "e1", 1.0)], False))
    ns.merge.merge(ROOT_INODE, later, Listing(["sub"], [RemoteObject("x", 1, "e1", 1.0)], False))
    # ... then a recursive listing that started before it answers, without them: they stay
    ns.merge.merge(ROOT_INODE, older, Listing([], [], False))
    assert sorted(r.name for r in ns.journal.children(ROOT_INODE)) == ["sub", "x"]
    # a listing never moves the time back: the older one that shows them does not make a later one's absence
    # of them older than their confirmation
    ns.merge.merge(ROOT_INODE, older, Listing(["sub"], [RemoteObject("x", 1, "e1", 1.0)], False))
    ns.merge.merge(ROOT_INODE, later - 1, Listing([], [], False))
    assert sorted(r.name for r in ns.journal.children(ROOT_INODE)) == ["sub", "x"]
    # a later listing without them removes them
    ns.merge.merge(ROOT_INODE, later + 1, Listing([], [], False))
    assert ns.journal.children(ROOT_INODE) == []


def test_a_listing_is_not_dropped_for_one_merged_before_the_wall_clock_stepped_back(tmp_path: Path) -> None:
    from ckptfs.objects import Listing, RemoteObject

    ns = make_ns(tmp_path)
    ahead = time.time() + 3600  # merged while the clock was an hour fast
    ns.merge.merge(ROOT_INODE, ahead, Listing([], [RemoteObject("x", 1, "e1", 1.0)], False))
    ns.merge.merge(ROOT_INODE, time.time(), Listing([], [RemoteObject("y", 1, "e2", 1.0)], False))  # after the step back
    assert "y" in [r.name for r in ns.journal.children(ROOT_INODE)]
