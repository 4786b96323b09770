"""What an eviction and a listing cost the journal, counted, never timed: the same with 1,000 cached
files as with 10,000 (issue 34: both run on the trio thread, several times a second or at every
`metadata_ttl`, and once read or rewrote every row).

Counted: SQL statements run (the trace callback, which sees every row of an `executemany`), rows
written (`total_changes`) and SQLite virtual machine instructions (the progress handler, called at
every instruction): a sort or a scan of every evictable row shows in the last even as one statement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ckptfs.journal import DURABLE, ROOT_INODE
from ckptfs.namespace import Namespace
from ckptfs.objects import Listing, RemoteObject
from tests.unit.test_journal import make_ns


@dataclass(frozen=True)
class Cost:
    statements: int
    rows_written: int
    instructions: int


def cost(ns: Namespace, op: Callable[[], object]) -> Cost:
    db = ns.journal.db
    statements = instructions = 0

    def statement(sql: str) -> None:
        nonlocal statements
        statements += 1

    def instruction() -> int:
        nonlocal instructions
        instructions += 1
        return 0

    written = db.total_changes
    db.set_trace_callback(statement)
    db.set_progress_handler(instruction, 1)
    try:
        op()
    finally:
        db.set_trace_callback(None)
        db.set_progress_handler(None, 1)
    return Cost(statements, db.total_changes - written, instructions)


def listing_of(files: int) -> Listing:
    return Listing([], [RemoteObject(f"f{i:05}", 100, f"etag{i}", 1.0) for i in range(files)], False)


def directory_of(tmp_path: Path, files: int) -> tuple[Namespace, int]:
    """A directory of `files` durable files another node wrote, as a listing brings them."""
    tmp_path.mkdir(exist_ok=True)
    ns = make_ns(tmp_path)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    ns.journal.update(d.ino, state=DURABLE)
    ns.merge.merge(d.ino, time.time() - 60, listing_of(files))
    assert len(ns.journal.children(d.ino)) == files
    return ns, d.ino


# ------------------------------------------------------------ eviction
def one_eviction(tmp_path: Path, files: int) -> Cost:
    ns, d = directory_of(tmp_path, files)
    with ns.journal.transaction():  # every file fetched once, f00000 least recently
        ns.journal.db.execute("UPDATE inodes SET cached = 1, atime = 1000 + CAST(substr(name, 2) AS INTEGER) WHERE parent = ?", (d,))
    ns.cache.used_bytes = 100 * files
    first, second = ns.journal.lookup(d, "f00000"), ns.journal.lookup(d, "f00001")
    assert first is not None and second is not None
    ns.files.fetching.add(first.ino)  # in use: skipped, never evicted
    spent = cost(ns, lambda: ns.space.evict(1))
    assert ns.journal.get(first.ino).cached == 1  # type: ignore[union-attr]
    assert ns.journal.get(second.ino).cached == 0  # type: ignore[union-attr]  # the least recently used one not in use
    assert sum(r.cached for r in ns.journal.children(d)) == files - 1
    return spent


def test_an_eviction_costs_the_same_however_many_files_are_cached(tmp_path: Path) -> None:
    few, many = one_eviction(tmp_path / "few", 1_000), one_eviction(tmp_path / "many", 10_000)
    assert few == many
    assert few.rows_written == 1  # the victim's `cached`


def test_eviction_goes_through_every_clean_copy_in_order_across_batches(tmp_path: Path) -> None:
    ns, d = directory_of(tmp_path, 300)
    with ns.journal.transaction():  # three files per access time, newest inode first in the order of names
        ns.journal.db.execute("UPDATE inodes SET cached = 1, atime = CAST(substr(name, 2) AS INTEGER) / 3 WHERE parent = ?", (d,))
    order = [r.ino for r in ns.journal.evictable_in_order()]
    rows = {r.ino: r for r in ns.journal.children(d)}
    assert order == sorted(rows, key=lambda i: (rows[i].atime, i)) and len(order) == 300
    ns.cache.used_bytes = 100 * 300
    assert ns.space.evict(100 * 200) == 100 * 200
    assert sorted(r.ino for r in ns.journal.evictable_in_order()) == sorted(order[200:])


# ------------------------------------------------------------ a listing of an unchanged directory
def one_listing(tmp_path: Path, files: int) -> Cost:
    ns, d = directory_of(tmp_path, files)
    spent = cost(ns, lambda: ns.merge.merge(d, time.time(), listing_of(files)))
    assert len(ns.journal.children(d)) == files
    return spent


def test_a_listing_of_an_unchanged_directory_writes_nothing_however_large(tmp_path: Path) -> None:
    few, many = one_listing(tmp_path / "few", 1_000), one_listing(tmp_path / "many", 10_000)
    assert few.statements == many.statements
    assert few.rows_written == many.rows_written == 0


def test_a_subdirectory_its_own_listing_showed_outlives_an_older_listing_of_its_parent(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    ns.merge.merge(ROOT_INODE, 1000.0, Listing(["sub"], [], False))
    sub = ns.journal.lookup(ROOT_INODE, "sub")
    assert sub is not None
    ns.merge.merge(sub.ino, 3000.0, Listing([], [RemoteObject("x", 1, "e", 1.0)], False))  # it holds x at 3000
    ns.merge.merge(ROOT_INODE, 2000.0, Listing([], [], False))  # the root's listing from before sub/x was put
    assert [r.name for r in ns.journal.children(ROOT_INODE)] == ["sub"]
    ns.merge.merge(ROOT_INODE, 4000.0, Listing([], [], False))  # a later one without it: gone
    assert ns.journal.children(ROOT_INODE) == []
