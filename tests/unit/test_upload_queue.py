"""The upload queue on its in-memory mirrors: the files not yet durable (backlog) and the deletes queued.

No FUSE, no server: a namespace on a journal in tmp_path, driven the way fs.py and the drainer
drive it. The invariant under every sequence of changes: each mirror equals one freshly read
from the journal. The cost of a file operation is counted in SQL statements, not timed.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from ckptfs.journal import DIRTY, DURABLE, ROOT_INODE, UPLOADING
from ckptfs.namespace import Namespace
from ckptfs.namespace.backlog import Backlog
from ckptfs.namespace.deletes import DeleteQueue

from tests.unit.test_journal import make_ns, write_file


def snapshot(b: Backlog) -> tuple[dict[int, tuple[object, ...]], dict[int, tuple[int, int]]]:
    """What the backlog holds: each file's fields, each directory's counts (white box: the invariant)."""
    b.reconcile()
    files = {ino: (e.name, e.chain, e.marker, e.closed_at, e.size, e.state, e.cached, e.temporary) for ino, e in b._entries.items()}
    return files, {d: (c[0], c[1]) for d, c in b._dirs.items()}


def fresh(ns: Namespace) -> Backlog:
    b = Backlog(ns.journal, ns.cfg.commit_markers, ns.cfg.upload_delay, ns.cfg.temporary_dir_patterns, ns.cfg.temporary_hold_seconds)
    b.load()
    return b


def deletes(q: DeleteQueue) -> tuple[list[tuple[int, str, int | None]], dict[str, int]]:
    rows = list(q)
    return rows, dict(q._below) | {f"key:{k}": n for k, n in q._keys.items()}


def assert_in_step(ns: Namespace) -> None:
    assert snapshot(ns.backlog) == snapshot(fresh(ns))
    assert deletes(ns.deletes) == deletes(DeleteQueue(ns.journal))


def take_all(ns: Namespace, now: float = 1e12) -> list[str]:
    """Keys of everything the drainer may take now, handed back at once (nothing uploaded)."""
    taken, _ = ns.uploads.take(now, 10_000, set())
    for p in taken:
        ns.uploads.upload_ended(p.ino)
    return [p.key for p in taken]


def upload(ns: Namespace, ino: int) -> None:
    t = ns.uploads.begin_upload(ino)
    assert t is not None and ns.uploads.finish_upload(t, "etag", "h")
    ns.uploads.upload_ended(ino)


def open_file(ns: Namespace, ino: int) -> int:
    return ns.files.open(ino, write=True)


def close_file(ns: Namespace, ino: int, fd: int) -> None:
    os.close(fd)
    ns.files.release(ino, write=True)
    ns.tree.reap(ino)


# ------------------------------------------------------------------ what is taken, when
def test_take_gives_oldest_close_first_up_to_the_limit_and_not_twice(tmp_path: Path) -> None:
    ns = make_ns(tmp_path, upload_delay=10)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    b = write_file(ns, ROOT_INODE, "b", b"2")
    c = write_file(ns, ROOT_INODE, "c", b"3")
    for ino, closed in ((a, 300.0), (b, 100.0), (c, 200.0)):
        ns.journal.update(ino, closed_at=closed)
        ns.backlog.changed(ino)
    assert ns.uploads.take(105.0, 10, set()) == ([], 110.0)
    first, next_at = ns.uploads.take(215.0, 1, set())
    assert [p.ino for p in first] == [b] and next_at == 310.0  # c is due too, but the limit is 1
    second, _ = ns.uploads.take(215.0, 10, set())
    assert [p.ino for p in second] == [c]  # b is the drainer's until handed back
    ns.uploads.upload_ended(b)
    third, next_at = ns.uploads.take(215.0, 10, set())
    assert [p.ino for p in third] == [b] and next_at == 310.0


def test_a_failed_upload_waits_for_its_retry_time_and_a_busy_key_for_its_turn(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    [p], _ = ns.uploads.take(time.time(), 10, set())
    assert ns.uploads.begin_upload(a) is not None
    ns.uploads.upload_failed(a)
    retry = time.time() + 30
    ns.uploads.upload_ended(a, retry)
    assert ns.uploads.take(time.time(), 10, set()) == ([], retry)
    assert [q.ino for q in ns.uploads.take(retry, 10, {"p/a"})[0]] == []  # a delete of its key runs
    assert [q.ino for q in ns.uploads.take(retry, 10, set())[0]] == [a]


def test_open_writers_hold_a_file_until_they_close_it_or_a_flush_asks(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    fd = open_file(ns, a)
    assert take_all(ns) == []
    close_file(ns, a, fd)
    assert take_all(ns) == ["p/a"]
    fd = open_file(ns, a)
    assert take_all(ns) == []
    ns.uploads.mark_urgent("")
    assert take_all(ns) == ["p/a"]
    close_file(ns, a, fd)


def test_flush_skips_the_upload_delay_of_the_files_under_its_path_only(tmp_path: Path) -> None:
    ns = make_ns(tmp_path, upload_delay=3600)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    write_file(ns, d.ino, "in", b"1")
    write_file(ns, ROOT_INODE, "out", b"2")
    assert take_all(ns, time.time()) == []
    ns.uploads.mark_urgent("d")
    assert take_all(ns, time.time()) == ["p/d/in"]
    assert ns.uploads.pending_under("d")[:2] == (1, 1) and ns.uploads.pending_under("")[:2] == (2, 2)


def test_a_marker_goes_after_everything_below_its_directory_even_across_renames(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    step = ns.tree.mkdir(ROOT_INODE, "step", 0o755, 0, 0)
    sub = ns.tree.mkdir(ROOT_INODE, "sub", 0o755, 0, 0)
    marker = write_file(ns, step.ino, "COMMIT", b"m")
    shard = write_file(ns, sub.ino, "shard", b"s")
    assert take_all(ns) == ["p/step/COMMIT", "p/sub/shard"]  # nothing else waits under step/
    # the marker was not uploaded; a directory with a shard moves in under step/: the marker waits again
    ns.tree.rename(ROOT_INODE, "sub", step.ino, "sub", noreplace=False)
    assert_in_step(ns)
    taken, _ = ns.uploads.take(1e12, 10, set())
    assert [p.ino for p in taken] == [shard]
    ns.uploads.upload_ended(shard)
    upload(ns, shard)
    assert take_all(ns) == ["p/step/COMMIT"]  # released once the shard is durable
    assert ns.journal.get(marker).state == DIRTY  # type: ignore[union-attr]


def test_a_file_renamed_into_a_marker_name_becomes_a_marker(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    step = ns.tree.mkdir(ROOT_INODE, "step", 0o755, 0, 0)
    fd = open_file(ns, write_file(ns, step.ino, "shard", b"s"))  # still being written: it blocks
    tmp = write_file(ns, step.ino, "COMMIT.tmp", b"m")
    assert take_all(ns) == ["p/step/COMMIT.tmp"]
    ns.tree.rename(step.ino, "COMMIT.tmp", step.ino, "COMMIT", noreplace=False)
    assert take_all(ns) == []
    assert_in_step(ns)
    shard = ns.journal.lookup(step.ino, "shard")
    assert shard is not None
    close_file(ns, shard.ino, fd)
    upload(ns, shard.ino)
    assert take_all(ns) == ["p/step/COMMIT"]
    assert [p.ino for p in ns.uploads.candidates(1e12, set())[0]] == [tmp]


# ------------------------------------------------------------ temporary directories
HOLD = 600.0


def test_files_under_a_temporary_directory_wait_for_its_rename_and_go_under_the_final_name(tmp_path: Path) -> None:
    ns = make_ns(tmp_path, temporary_hold_seconds=HOLD)
    tmp = ns.tree.mkdir(ROOT_INODE, "step_1.tmp", 0o755, 0, 0)
    sub = ns.tree.mkdir(tmp.ino, "sub", 0o755, 0, 0)
    write_file(ns, tmp.ino, "a", b"1")
    write_file(ns, sub.ino, "b", b"2")
    write_file(ns, ROOT_INODE, "other", b"3")
    now = time.time()
    taken, next_at = ns.uploads.take(now + 1, 10, set())
    assert [p.key for p in taken] == ["p/other"] and next_at is not None and next_at >= now + HOLD - 5
    assert ns.uploads.stats()["temporary_held_files"] == 2
    ns.tree.rename(ROOT_INODE, "step_1.tmp", ROOT_INODE, "step_1", noreplace=False)
    assert sorted(take_all(ns, time.time() + 1)) == ["p/step_1/a", "p/step_1/sub/b"]
    assert ns.uploads.stats()["temporary_held_files"] == 0
    assert_in_step(ns)


def test_a_file_under_a_temporary_directory_goes_under_its_name_once_the_hold_passes(tmp_path: Path) -> None:
    ns = make_ns(tmp_path, temporary_hold_seconds=HOLD)
    for name in ("7.orbax-checkpoint-tmp-1732", "tmp-x", ".tmp_ab", "step.tmp"):
        d = ns.tree.mkdir(ROOT_INODE, name, 0o755, 0, 0)
        write_file(ns, d.ino, "f", b"1")
    kept = ns.tree.mkdir(ROOT_INODE, "step.tmpl", 0o755, 0, 0)  # a name near a pattern, matching none
    other = write_file(ns, kept.ino, "f", b"1")
    closed = time.time()
    assert take_all(ns, closed + 1) == ["p/step.tmpl/f"]
    upload(ns, other)
    assert sorted(take_all(ns, closed + HOLD + 1)) == ["p/.tmp_ab/f", "p/7.orbax-checkpoint-tmp-1732/f", "p/step.tmp/f", "p/tmp-x/f"]


def test_renaming_a_directory_to_a_temporary_name_holds_its_files_and_a_flush_does_not_wait(tmp_path: Path) -> None:
    ns = make_ns(tmp_path, temporary_hold_seconds=HOLD, upload_delay=1)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    write_file(ns, d.ino, "f", b"1")
    ns.tree.rename(ROOT_INODE, "d", ROOT_INODE, "d.tmp", noreplace=False)
    assert take_all(ns, time.time() + 2) == []
    ns.uploads.mark_urgent("d.tmp")
    assert take_all(ns, time.time()) == ["p/d.tmp/f"]


def test_no_hold_when_the_hold_is_zero_or_the_patterns_empty(tmp_path: Path) -> None:
    for i, opts in enumerate(({"temporary_hold_seconds": 0}, {"temporary_dir_patterns": []})):
        ns = make_ns(tmp_path / str(i), **opts) if (tmp_path / str(i)).mkdir() is None else None
        assert ns is not None
        d = ns.tree.mkdir(ROOT_INODE, "d.tmp", 0o755, 0, 0)
        write_file(ns, d.ino, "f", b"1")
        assert take_all(ns, time.time() + 1) == ["p/d.tmp/f"]


def test_the_marker_of_an_empty_temporary_directory_waits_like_its_files(tmp_path: Path) -> None:
    ns = make_ns(tmp_path, temporary_hold_seconds=HOLD)
    ns.tree.mkdir(ROOT_INODE, "empty.tmp", 0o755, 0, 0)
    now = time.time()
    ready, next_at = ns.uploads.ready_markers(now + 1, set())
    assert ready == [] and next_at is not None and next_at >= now + HOLD - 5
    ns.tree.rename(ROOT_INODE, "empty.tmp", ROOT_INODE, "empty", noreplace=False)
    assert [key for _, key in ns.uploads.ready_markers(time.time() + 1, set())[0]] == ["p/empty/"]


def test_a_flush_puts_the_markers_queued_under_its_path_before_it_asked_not_a_later_save_s(tmp_path: Path) -> None:
    # a trainer waits for its save to be durable (a flush), then starts the next save in a temporary directory
    ns = make_ns(tmp_path, temporary_hold_seconds=HOLD, upload_delay=60)
    ns.tree.mkdir(ROOT_INODE, "done", 0o755, 0, 0)
    ns.tree.mkdir(ROOT_INODE, "elsewhere", 0o755, 0, 0)
    ns.uploads.mark_urgent("done")
    time.sleep(0.01)  # the next save's markers are queued after the flush last asked
    ns.tree.mkdir(ROOT_INODE, "next.tmp", 0o755, 0, 0)
    ready = [key for _, key in ns.uploads.ready_markers(time.time(), set())[0]]
    assert ready == ["p/done/"]


# ------------------------------------------------------------ what a file operation costs
def _statements(ns: Namespace, op: callable) -> int:  # type: ignore[valid-type]
    count = 0

    def seen(sql: str) -> None:
        nonlocal count
        count += 1

    ns.journal.db.set_trace_callback(seen)
    try:
        op()
    finally:
        ns.journal.db.set_trace_callback(None)
    return count


def _costs(tmp_path: Path, waiting: int) -> tuple[int, int]:
    """SQL statements of (create + write + close + the drainer's wake) and (unlink + wake) with `waiting` files not uploaded."""
    tmp_path.mkdir()
    ns = make_ns(tmp_path, upload_delay=3600)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    for i in range(waiting):
        write_file(ns, d.ino, f"f{i}", b"x")
    take_all(ns, time.time())
    write = _statements(ns, lambda: (write_file(ns, d.ino, "new", b"y"), ns.uploads.take(time.time(), 8, set())))
    unlink = _statements(ns, lambda: (ns.tree.unlink(d.ino, "f0"), ns.uploads.take(time.time(), 8, set())))
    assert ns.journal.pending_deletes() == []  # never uploaded: nothing to delete in the bucket
    assert_in_step(ns)
    return write, unlink


def test_a_file_operation_costs_the_same_however_many_files_wait(tmp_path: Path) -> None:
    assert _costs(tmp_path / "few", 3) == _costs(tmp_path / "many", 300)


# ----------------------------------------------------- in step with the journal, whatever happens
def scanned_stats(ns: Namespace, now: float) -> dict[str, float]:
    """The queue's figures by a scan of every file waiting (what `queue_stats` computed before it kept them as they
    change): the reference the running figures must equal."""
    b = ns.backlog
    dirty = uploading = held = 0
    oldest = oldest_close = 0.0
    in_cache = {DIRTY: 0, UPLOADING: 0}
    for e in b.entries():
        live = ns.files.live.get(e.ino)
        size = live.size if live is not None else e.size
        dirty += size
        if e.cached:
            in_cache[e.state] += size
        age = now - e.closed_at if e.closed_at else 0.0
        oldest_close = max(oldest_close, age)
        if e.state == UPLOADING:
            uploading += 1
        elif e.temporary and b.due_at(e) > now:
            held += 1
            continue
        oldest = max(oldest, age)
    return {"dirty_files": len(b), "dirty_bytes": dirty, "uploading_files": uploading, "temporary_held_files": held,
            "oldest_dirty_age_seconds": oldest, "oldest_close_age_seconds": oldest_close,
            "cache_dirty_bytes": in_cache[DIRTY], "cache_uploading_bytes": in_cache[UPLOADING]}


def assert_stats_as_scanned(ns: Namespace) -> None:
    got = ns.uploads.stats()
    want = scanned_stats(ns, time.time())
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=0.05 if "age" in k else 0), k


def test_the_backlog_stays_in_step_with_the_journal_through_random_changes(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    rnd = random.Random(24)
    dirs = [ROOT_INODE]
    open_fds: dict[int, int] = {}

    def files() -> list[int]:
        return [r[0] for r in ns.journal.db.execute("SELECT ino FROM inodes WHERE kind = 'file' AND parent IS NOT NULL")]

    def step() -> None:
        op = rnd.choice(["mkdir", "create", "create", "close", "reopen", "rename", "rename_dir", "unlink", "rmdir",
                         "upload", "upload", "fail", "abandon", "flush", "delete", "grow", "uploading"])
        if op == "mkdir":
            dirs.append(ns.tree.mkdir(rnd.choice(dirs), rnd.choice(["d", "tmp-d", "d.tmp"]).replace("d", f"d{rnd.randrange(10**6)}", 1), 0o755, 0, 0).ino)
        elif op == "create":
            name = rnd.choice(["COMMIT", ".metadata", f"f{rnd.randrange(10**6)}"])
            if ns.journal.lookup(parent := rnd.choice(dirs), name) is None:
                ino = write_file(ns, parent, name, b"x" * rnd.randrange(5))
                if rnd.random() < 0.3:
                    open_fds[ino] = open_file(ns, ino)
        elif op == "close" and open_fds:
            ino = rnd.choice(list(open_fds))
            close_file(ns, ino, open_fds.pop(ino))
        elif op == "reopen" and files():
            ino = rnd.choice(files())
            if ino not in open_fds:
                fd = open_file(ns, ino)
                ns.files.write(ino, fd, 0, b"changed")
                close_file(ns, ino, fd)
        elif op in ("rename", "rename_dir"):
            rows = [ns.journal.get(i) for i in (files() if op == "rename" else dirs[1:])]
            if rows:
                row = rnd.choice(rows)
                assert row is not None
                if row.parent is not None:
                    try:
                        ns.tree.rename(row.parent, row.name or "", rnd.choice(dirs), rnd.choice(["COMMIT", f"r{rnd.randrange(10**6)}", f"r{rnd.randrange(10**6)}.tmp"]),
                                       noreplace=False)
                    except OSError:
                        pass  # into itself, over a non-empty directory...
        elif op == "unlink" and files():
            row = ns.journal.get(rnd.choice(files()))
            assert row is not None and row.parent is not None
            ns.tree.unlink(row.parent, row.name or "")
            open_fds.pop(row.ino, None)
        elif op == "rmdir" and len(dirs) > 1:
            row = ns.journal.get(rnd.choice(dirs[1:]))
            if row is not None and row.parent is not None and not ns.journal.has_children(row.ino):
                ns.tree.rmdir(row.parent, row.name or "")
                dirs.remove(row.ino)
        elif op in ("upload", "fail", "abandon"):
            taken, _ = ns.uploads.take(1e12, 3, set())
            for p in taken:
                t = ns.uploads.begin_upload(p.ino)
                if t is not None and op == "upload":
                    ns.uploads.finish_upload(t, "e", "h")
                elif t is not None and op == "abandon":
                    fd = open_file(ns, p.ino)
                    ns.files.write(p.ino, fd, 0, b"newer")
                    close_file(ns, p.ino, fd)
                    assert not ns.uploads.finish_upload(t, "e", "h")
                else:
                    ns.uploads.upload_failed(p.ino)
                ns.uploads.upload_ended(p.ino, time.time() + 5 if op == "fail" else 0.0)
        elif op == "grow" and open_fds:  # an open file's bytes ahead of the journal's size
            ino = rnd.choice(list(open_fds))
            ns.files.write(ino, open_fds[ino], rnd.randrange(8), b"more" * rnd.randrange(1, 4))
        elif op == "uploading":  # begun, not finished: state uploading until the next step hands it back
            taken, _ = ns.uploads.take(1e12, 2, set())
            for p in taken:
                ns.uploads.begin_upload(p.ino)
                assert_stats_as_scanned(ns)
                ns.uploads.upload_failed(p.ino)
                ns.uploads.upload_ended(p.ino)
        elif op == "flush":
            ns.uploads.mark_urgent(rnd.choice(["", "d"]))
        elif op == "delete":
            for delete_id, key in ns.uploads.ready_deletes(set(), 3):
                ns.uploads.delete_done(delete_id, key)

    for i in range(600):
        step()
        assert_stats_as_scanned(ns)
        if i % 7 == 0:
            assert_in_step(ns)
            ready, _ = ns.uploads.candidates(1e12, set())
            for p in ready:  # never a marker while anything else waits under its directory
                e = ns.backlog._entries[p.ino]
                assert not (e.marker and ns.backlog.blocking_in(e.parent))
    assert_in_step(ns)
    # everything handed back: each file waiting is taken exactly once by draining to the end
    for ino, fd in list(open_fds.items()):
        close_file(ns, ino, fd)
    for _ in range(1000):
        taken, _ = ns.uploads.take(1e13, 5, set())
        if not taken and not len(ns.backlog):
            break
        for p in taken:
            upload(ns, p.ino)
    assert len(ns.backlog) == 0 and ns.journal.pending_files() == []
    assert {r[0] for r in ns.journal.db.execute("SELECT state FROM inodes WHERE kind = 'file' AND parent IS NOT NULL")} <= {DURABLE}


def test_a_rolled_back_change_leaves_the_backlog_as_the_journal_is(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    a = write_file(ns, d.ino, "a", b"1")
    assert take_all(ns) == ["p/d/a"]
    try:
        with ns.journal.transaction():
            ns.tree.unlink(d.ino, "a")  # joins the outer transaction
            raise RuntimeError("the commit never happens")
    except RuntimeError:
        pass
    assert_in_step(ns)
    assert ns.journal.get(a).parent == d.ino  # type: ignore[union-attr]
    assert take_all(ns) == ["p/d/a"]


def test_the_backlog_is_read_from_the_journal_once_at_start_up(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    write_file(ns, d.ino, "COMMIT", b"m")
    shard = write_file(ns, d.ino, "shard", b"s")
    assert ns.uploads.begin_upload(shard) is not None  # a crash while it uploads
    ns.journal.close()
    again = make_ns(tmp_path)
    assert_in_step(again)
    assert take_all(again) == ["p/d/shard"]
    calls = []
    again.journal.pending_files = lambda: calls.append(1) or []  # type: ignore[method-assign]
    write_file(again, d.ino, "more", b"x")
    again.uploads.stats()
    again.uploads.pending_under("")
    assert take_all(again) == ["p/d/shard", "p/d/more"] and calls == []  # COMMIT waits for both


# --------------------------------------------------------------------------- deletes
def _uploaded(ns: Namespace, parent: int, n: int) -> None:
    for i in range(n):
        upload(ns, write_file(ns, parent, f"f{i}", b"x"))


def _run_all_deletes(ns: Namespace, limit: int = 4) -> list[str]:
    """What the drainer does with the queued deletes, `limit` at a time, in its order."""
    done: list[str] = []
    while ready := ns.uploads.ready_deletes(set(), limit):
        assert len(ready) <= limit
        for delete_id, key in ready:
            ns.uploads.delete_done(delete_id, key)
            done.append(key)
    return done


def test_a_directory_object_goes_after_every_delete_below_it(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    t = ns.tree.mkdir(ROOT_INODE, "t", 0o755, 0, 0)
    d = ns.tree.mkdir(t.ino, "d", 0o755, 0, 0)
    _uploaded(ns, d.ino, 6)
    for i in range(6):
        ns.tree.unlink(d.ino, f"f{i}")
    ns.tree.rmdir(t.ino, "d")  # `t/d/` goes once every `t/d/f*` is gone (the marker of t/ that rmdir left: after)
    done = _run_all_deletes(ns, 4)
    assert sorted(done[:6]) == [f"p/t/d/f{i}" for i in range(6)] and done[6:] == ["p/t/d/"]
    assert_in_step(ns)
    assert ns.uploads.stats()["pending_deletes"] == 0


def test_the_old_key_of_a_renamed_file_goes_once_the_new_object_is_complete(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    upload(ns, a)
    ns.tree.rename(ROOT_INODE, "a", ROOT_INODE, "b", noreplace=False)
    assert ns.uploads.ready_deletes(set()) == []
    upload(ns, a)
    assert [k for _, k in ns.uploads.ready_deletes(set())] == ["p/a"]


def test_a_drop_rolled_back_with_its_transaction_stays_queued(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    upload(ns, a)
    ns.tree.unlink(ROOT_INODE, "a")
    [(delete_id, key)] = ns.uploads.ready_deletes(set())
    try:
        with ns.journal.transaction():
            ns.uploads.drop_delete(delete_id)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    assert ns.uploads.ready_deletes(set()) == [(delete_id, key)]
    assert_in_step(ns)


def _rm_costs(tmp_path: Path, uploaded: int) -> int:
    """SQL statements of unlinking one uploaded file and the drainer's next look at the deletes, with `uploaded` deletes queued."""
    tmp_path.mkdir()
    ns = make_ns(tmp_path)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    _uploaded(ns, d.ino, uploaded + 1)
    for i in range(uploaded):
        ns.tree.unlink(d.ino, f"f{i}")
    running = ns.uploads.ready_deletes(set(), 8)  # the drainer runs 8 of them
    busy = {key for _, key in running}
    ns.uploads.ready_deletes(busy, 8, {i for i, _ in running})
    count = _statements(ns, lambda: (ns.tree.unlink(d.ino, f"f{uploaded}"), ns.uploads.ready_deletes(busy, 8, {i for i, _ in running})))
    assert_in_step(ns)
    return count


def test_removing_an_uploaded_file_costs_the_same_however_many_deletes_are_queued(tmp_path: Path) -> None:
    assert _rm_costs(tmp_path / "few", 20) == _rm_costs(tmp_path / "many", 200)  # at least 8 + 8 queued: each look takes 8


# ------------------------------------------------- the lifecycle tracker reads the same mirrors
def test_the_tracker_sees_checkpoints_with_local_work_from_the_backlog_and_the_delete_queue(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from ckptfs.patterns import Patterns
    from ckptfs.lifecycle.tracker import Tracker

    ns = make_ns(tmp_path)
    s1 = ns.tree.mkdir(ROOT_INODE, "step_1", 0o755, 0, 0)
    s2 = ns.tree.mkdir(ROOT_INODE, "step_2", 0o755, 0, 0)
    sub = ns.tree.mkdir(s2.ino, "sub", 0o755, 0, 0)
    s3 = ns.tree.mkdir(ROOT_INODE, "step_3", 0o755, 0, 0)
    writing = write_file(ns, s1.ino, "a", b"1")
    fd = open_file(ns, writing)
    write_file(ns, sub.ino, "b", b"2")  # closed, not uploaded
    write_file(ns, ROOT_INODE, "step_4", b"a file named like a checkpoint is not one")
    upload(ns, write_file(ns, s3.ino, "c", b"3"))
    ns.tree.unlink(s3.ino, "c")  # its delete is queued
    lc = SimpleNamespace(ns=ns, patterns=Patterns(["step_{step}"]), keys=ns.keys)
    tracker = Tracker(lc, str(tmp_path))  # type: ignore[arg-type]
    assert tracker.scan() == {"step_1": "writing", "step_2": "draining", "step_3": "draining"}
    assert {p: a.step for p, a in tracker.active.items()} == {"step_1": 1, "step_2": 2, "step_3": 3}
    close_file(ns, writing, fd)
    assert tracker.scan() == {"step_1": "draining", "step_2": "draining", "step_3": "draining"}
    ns.tree.rename(ROOT_INODE, "step_2", ROOT_INODE, "step_5", False)  # the backlog follows the directory
    assert tracker.scan() == {"step_1": "draining", "step_5": "draining", "step_3": "draining"}
    for e in ns.backlog.entries():
        upload(ns, e.ino)
    for delete_id, key, _ in list(ns.deletes):
        ns.uploads.delete_done(delete_id, key)
    assert tracker.scan() == {}
    assert_in_step(ns)



def test_a_checkpoint_whose_files_are_all_on_peers_is_replicated_until_durable(tmp_path: Path) -> None:
    """With durability = peer the daemon hands the tracker the peers' answer per inode: a checkpoint whose files not
    yet durable are all replicated shows `replicated`; one file that is not, or one open for writing, outranks it."""
    from types import SimpleNamespace

    from ckptfs.lifecycle.tracker import Tracker
    from ckptfs.patterns import Patterns

    ns = make_ns(tmp_path)
    s1 = ns.tree.mkdir(ROOT_INODE, "step_1", 0o755, 0, 0)
    s2 = ns.tree.mkdir(ROOT_INODE, "step_2", 0o755, 0, 0)
    a = write_file(ns, s1.ino, "a", b"1")
    b = write_file(ns, s1.ino, "b", b"2")
    c = write_file(ns, s2.ino, "c", b"3")
    on_peers: set[int] = {a, b}
    lc = SimpleNamespace(ns=ns, patterns=Patterns(["step_{step}"]), keys=ns.keys)
    tracker = Tracker(lc, str(tmp_path))  # type: ignore[arg-type]
    assert tracker.scan() == {"step_1": "draining", "step_2": "draining"}  # no peers (durability = local)
    tracker.replicated = on_peers.__contains__
    assert tracker.scan() == {"step_1": "replicated", "step_2": "draining"}
    fd = open_file(ns, a)  # written again: open for writing
    assert tracker.scan() == {"step_1": "writing", "step_2": "draining"}
    close_file(ns, a, fd)
    on_peers.discard(a)  # its new version not yet sealed on the peers
    assert tracker.scan() == {"step_1": "draining", "step_2": "draining"}
    on_peers |= {a, c}
    tracker.refresh()
    assert tracker.local_state("step_1") == tracker.local_state("step_2") == "replicated"
    for ino in (a, b, c):
        upload(ns, ino)
    assert tracker.scan() == {}  # durable: no local work left; the bucket says the rest


def test_after_a_restart_the_tracker_derives_the_checkpoints_to_commit_from_the_journal(tmp_path: Path) -> None:
    """What a close on this node left to upload, durable or not, makes its checkpoint active again; files only
    listed from the bucket do not; no state file is read or written (issue 35)."""
    from types import SimpleNamespace

    import trio

    from ckptfs.lifecycle.tracker import LEGACY_STATE_FILE, Tracker
    from ckptfs.patterns import Patterns

    ns = make_ns(tmp_path)
    run = ns.tree.mkdir(ROOT_INODE, "run3", 0o755, 0, 0)
    s7 = ns.tree.mkdir(run.ino, "step_7", 0o755, 0, 0)
    for name in ("model", "optim", "state"):
        upload(ns, write_file(ns, s7.ino, name, b"x"))  # durable just before the stop
    s8 = ns.tree.mkdir(run.ino, "step_8", 0o755, 0, 0)
    write_file(ns, s8.ino, "model", b"y")  # still draining
    s9 = ns.tree.mkdir(run.ino, "step_9", 0o755, 0, 0)
    ns.journal.insert(s9.ino, "model", "file", 0o100644, 0, 0, DURABLE, remote_key="ckpt/run3/step_9/model", cached=0)  # listed
    write_file(ns, ROOT_INODE, "notes", b"not in a checkpoint")
    (tmp_path / LEGACY_STATE_FILE).write_text("{}")
    lc = SimpleNamespace(ns=ns, patterns=Patterns(["step_{step}"]), keys=ns.keys)
    tracker = Tracker(lc, str(tmp_path))  # type: ignore[arg-type]
    assert not (tmp_path / LEGACY_STATE_FILE).exists()
    trio.run(tracker.recover)
    assert {p: (a.step, a.recovered) for p, a in tracker.active.items()} == {"run3/step_7": (7, True), "run3/step_8": (8, True)}
    tracker.refresh()
    # listed only with local work: one waiting for quiet is in the bucket, where the catalogue finds it
    assert [c.path for c in tracker.local_checkpoints()] == ["run3/step_8"]
    assert tracker.local_state("run3/step_7") is None and tracker.local_state("run3/step_8") == "draining"

# ------------------------------------------------- a rename while the upload runs keeps what was sent
def test_a_file_renamed_while_it_uploads_is_published_under_the_old_key_then_copied(tmp_path: Path) -> None:
    ns = make_ns(tmp_path, temporary_hold_seconds=HOLD)
    tmp = ns.tree.mkdir(ROOT_INODE, "step_1.tmp", 0o755, 0, 0)
    a = write_file(ns, tmp.ino, "a", b"1")
    [p] = ns.uploads.take(time.time() + HOLD + 1, 10, set())[0]  # the hold passed: it uploads under the temporary name
    t = ns.uploads.begin_upload(a)
    assert t is not None and t.key == "p/step_1.tmp/a"
    ns.tree.rename(ROOT_INODE, "step_1.tmp", ROOT_INODE, "step_1", noreplace=False)
    assert ns.uploads.publishable(t) and not ns.uploads.still_current(t)  # the upload goes on
    assert not ns.uploads.finish_upload(t, "e", "h")
    ns.uploads.upload_ended(a)
    row = ns.journal.get(a)
    assert row is not None and row.state == DIRTY and row.copy_from == "p/step_1.tmp/a" and row.xxh3 == "h"
    assert ns.uploads.ready_deletes(set()) == []  # the old key goes once the copy is complete
    [c] = ns.uploads.take(time.time() + 1, 10, set())[0]
    copy = ns.uploads.begin_upload(a)
    assert c.key == "p/step_1/a" and copy is not None and copy.copy_from == "p/step_1.tmp/a"
    assert ns.uploads.finish_upload(copy, "e", "h")
    ns.uploads.upload_ended(a)
    assert [key for _, key in ns.uploads.ready_deletes(set())] == ["p/step_1.tmp/a"]  # then its directory's key
    for delete_id, key in ns.uploads.ready_deletes(set()):
        ns.uploads.delete_done(delete_id, key)
    assert [key for _, key in ns.uploads.ready_deletes(set())] == ["p/step_1.tmp/"]
    assert_in_step(ns)


def test_an_upload_whose_old_name_another_file_took_or_whose_bytes_changed_is_dropped(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    b = write_file(ns, ROOT_INODE, "b", b"2")
    ta, tb = ns.uploads.begin_upload(a), ns.uploads.begin_upload(b)
    assert ta is not None and tb is not None
    ns.tree.rename(ROOT_INODE, "a", ROOT_INODE, "a2", noreplace=False)
    write_file(ns, ROOT_INODE, "a", b"another file")
    assert not ns.uploads.publishable(ta) and ns.uploads.bytes_current(ta)
    ns.tree.rename(ROOT_INODE, "b", ROOT_INODE, "b2", noreplace=False)
    fd = open_file(ns, b)
    ns.files.write(b, fd, 0, b"changed")
    close_file(ns, b, fd)
    assert not ns.uploads.publishable(tb) and not ns.uploads.bytes_current(tb)
    for t in (ta, tb):
        assert not ns.uploads.finish_upload(t, "e", "h")
        row = ns.journal.get(t.ino)
        assert row is not None and row.state == DIRTY and row.copy_from is None  # uploaded again from the cache
    assert_in_step(ns)
