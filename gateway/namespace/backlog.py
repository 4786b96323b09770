"""The backlog: the files not yet durable, kept in memory so that a file operation costs the same however many wait.

Why: the drainer wakes on every close, rename and unlink. Reading every file not yet durable
from the journal and walking its ancestors on each wake made every file operation cost time in
proportion to the files waiting (5,000 small files: 15 files/s, and `rm -rf` of them 7
minutes). So the set is read from the journal once, at start-up (`load`), and kept up to date
from then on: whoever changes a file's row says so (`changed`, a set insert), and the next query
brings those entries in step (`reconcile`: one row read per inode changed). Reading the row
rather than being told what changed keeps one rule for every path (close, fsync, rename, unlink,
an upload ending, a transaction rolled back), so the backlog cannot drift from the journal.

Each entry remembers the directories it is counted under (its `chain`, parent to root); each
directory counts the files waiting below it and how many of them are not commit markers. So
"does anything but markers still wait under this directory" is a dictionary lookup, and a
directory rename moves nothing here but the entries of the files it moves (each re-counted
under its new chain when reconciled).

Temporary directories (`temporary_dir_patterns`, docs/semantics.md): a file with a directory
of such a name anywhere in its chain is *held*: due `temporary_hold_seconds` after its last
close rather than `upload_delay`, so that the writer's rename of the directory comes first and
the file goes straight to its final key. A rename marks every file it moves changed (see
`UploadQueue.requeue_moved`), and reconciling one reads the names along its chain again, so
the hold ends with the rename that ends it.

Order: a file becomes *due* `upload_delay` after its last close (at once when urgent), and not
before its retry time after a failure; due files go oldest close first. Two heaps with lazy
deletion (an entry's `seq` names its one live heap item): `_due` by the time a file becomes due,
`_ready` by close time. A file the drainer took is in neither until it is given back; a file
held back (open writers) is in neither until it changes again; a commit marker held back waits
in `_held` on its directory until nothing but markers waits there.

Figures (`ckptfs status`, the metrics, systemd's STATUS every few seconds) are kept as entries change
(`_account`): counts and bytes by state, and two heaps with lazy deletion for the oldest close, so that
reading them costs the files under temporary directories, not the files waiting (0.03 ms of the trio
thread per read with 5,000 waiting and 0.05 with 20,000, against 1.9 and 8.3 ms for the scan before).

Synchronous, on the trio thread. Knows only the journal.
"""

from __future__ import annotations

import fnmatch
import heapq
import re
from dataclasses import dataclass
from typing import Iterable

from ..journal import DIRTY, ROOT_INODE, UPLOADING, Journal, Row


@dataclass(slots=True)
class Waiting:
    """A file not yet durable, as the journal had it when last reconciled."""

    ino: int
    name: str
    chain: tuple[int, ...]  # the directories it is counted under: parent first, the root last
    marker: bool  # its name is a commit marker
    closed_at: float  # wall time of the last close; 0.0 if never closed (due as soon as no writer is left)
    size: int  # the journal's size (an open file's in-memory size is newer)
    state: str  # dirty | uploading
    cached: bool
    temporary: bool = False  # a directory of its chain has a temporary name: held back (see the module's docstring)
    urgent: bool = False  # a flush asked for it: no upload delay, open writers do not hold it
    retry_at: float = 0.0  # wall time before which it is not tried again (the drainer's backoff)
    seq: int = 0  # its live heap item

    @property
    def parent(self) -> int:
        return self.chain[0]


def name_matcher(patterns: Iterable[str]) -> re.Pattern[str]:
    """One compiled pattern for fnmatch patterns of names (commit markers, temporary directories): matched once per file change."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns) or r"(?!)")


class Backlog:
    def __init__(self, journal: Journal, commit_markers: Iterable[str], upload_delay: float,
                 temporary_dir_patterns: Iterable[str] = (), temporary_hold_seconds: float = 0.0) -> None:
        self.journal = journal
        self.upload_delay = upload_delay
        self.temporary_hold = temporary_hold_seconds
        self._markers = name_matcher(commit_markers)
        self._temporary = name_matcher(temporary_dir_patterns if temporary_hold_seconds > 0 else ())
        self._entries: dict[int, Waiting] = {}
        self._dirs: dict[int, list[int]] = {}  # directory -> [files waiting below it, of those not markers]
        self._changed: dict[int, None] = {}  # inodes whose rows changed since the last reconcile, in order
        self._loaded = False
        self._taken: set[int] = set()  # the drainer's until given back
        self._held: dict[int, set[int]] = {}  # directory -> commit markers waiting for the rest of it
        self._due: list[tuple[float, int, int]] = []  # (due at, seq, ino)
        self._ready: list[tuple[float, int, int]] = []  # (closed at, seq, ino)
        self._seq = 0
        # the figures, kept as entries change (`_account`)
        self.uploading = 0  # entries in state uploading
        self.journal_bytes = 0  # their sizes as the journal has them (an open file's in-memory size may be newer)
        self.cached_bytes = {DIRTY: 0, UPLOADING: 0}  # of those, held in the cache file, by state
        self.temporaries: set[int] = set()  # entries under a temporary directory: held or not depends on the time
        self._closes: list[tuple[float, int]] = []  # (closed at, ino) of every entry closed at least once
        self._lagging: list[tuple[float, int]] = []  # the same, for entries not under a temporary directory

    def is_marker(self, name: str) -> bool:
        return self._markers.fullmatch(name) is not None

    def is_temporary(self, name: str) -> bool:
        """`name` is a directory name that holds the files below it back."""
        return self._temporary.fullmatch(name) is not None

    def in_temporary(self, path: str) -> bool:
        """A directory of mount-relative `path` (the last part included) has a temporary name."""
        return any(self.is_temporary(part) for part in path.split("/") if part)

    # ------------------------------------------------------------ keeping in step
    def changed(self, ino: int) -> None:
        """`ino`'s row changed (state, close time, size, name or place): looked at again before the next query."""
        self._changed.pop(ino, None)
        self._changed[ino] = None

    def load(self) -> None:
        """Read the files not yet durable from the journal: once, at start-up, after recovery."""
        self._entries.clear()
        self._dirs.clear()
        self._changed.clear()
        self._held.clear()
        self._due.clear()
        self._ready.clear()
        self.uploading = self.journal_bytes = 0
        self.cached_bytes = {DIRTY: 0, UPLOADING: 0}
        self.temporaries.clear()
        self._closes.clear()
        self._lagging.clear()
        self._loaded = True
        parents: dict[int, tuple[int | None, bool]] = {}
        for row in self.journal.pending_files():
            if row.parent is not None:
                self._add(row, parents)

    def reconcile(self) -> None:
        """Bring the entries of the inodes that changed in step with the journal."""
        if not self._loaded:
            self.load()
            return
        if not self._changed:
            return
        parents: dict[int, tuple[int | None, bool]] = {}  # the journal does not change while this runs
        changed, self._changed = self._changed, {}
        for ino in changed:
            self._sync(ino, parents)

    def _sync(self, ino: int, parents: dict[int, tuple[int | None, bool]]) -> None:
        row = self.journal.get(ino)
        waiting = row is not None and row.kind == "file" and row.parent is not None and row.state in (DIRTY, UPLOADING)
        e = self._entries.get(ino)
        if e is None:
            if waiting:
                assert row is not None
                self._add(row, parents)
            return
        self._unhold(e)
        self._account(e, -1)
        if not waiting:
            self._count(e, -1)
            del self._entries[ino]
            return
        assert row is not None and row.parent is not None
        chain, temporary = self._chain(row.parent, parents)
        marker = self.is_marker(row.name or "")
        if chain != e.chain or marker != e.marker:
            self._count(e, -1)
            e.chain, e.marker = chain, marker
            self._count(e, +1)
        e.name, e.closed_at, e.size, e.state, e.cached = row.name or "", row.closed_at or 0.0, row.size, row.state or DIRTY, bool(row.cached)
        e.temporary = temporary
        self._account(e, +1)
        if ino not in self._taken:
            self._place(e)

    def _add(self, row: Row, parents: dict[int, tuple[int | None, bool]]) -> None:
        assert row.parent is not None
        chain, temporary = self._chain(row.parent, parents)
        e = Waiting(row.ino, row.name or "", chain, self.is_marker(row.name or ""),
                    row.closed_at or 0.0, row.size, row.state or DIRTY, bool(row.cached), temporary)
        self._entries[row.ino] = e
        self._count(e, +1)
        self._account(e, +1)
        if row.ino not in self._taken:
            self._place(e)

    def _chain(self, parent: int, parents: dict[int, tuple[int | None, bool]]) -> tuple[tuple[int, ...], bool]:
        """The directories from `parent` up to the root, and whether one of them has a temporary name.

        `parents` caches each directory's (parent, temporary name) for one reconcile."""
        out = []
        temporary = False
        cur: int | None = parent
        while cur is not None:
            out.append(cur)
            if cur == ROOT_INODE:
                break
            if cur not in parents:
                row = self.journal.get(cur)
                parents[cur] = (None, False) if row is None else (row.parent, self.is_temporary(row.name or ""))
            cur, held = parents[cur]
            temporary = temporary or held
        return tuple(out), temporary

    def _count(self, e: Waiting, sign: int) -> None:
        """Count `e` under (+1) or take it out of (-1) every directory of its chain."""
        blocking = 0 if e.marker else sign
        for d in e.chain:
            c = self._dirs.get(d)
            if c is None:
                c = self._dirs[d] = [0, 0]
            c[0] += sign
            c[1] += blocking
            if blocking < 0 and c[1] == 0:
                self._release_markers(d)
            if c[0] == 0:
                del self._dirs[d]

    def _account(self, e: Waiting, sign: int) -> None:
        """Count `e` into (+1) or out of (-1) the figures; its heap items go stale when it changes or leaves."""
        self.journal_bytes += sign * e.size
        if e.state == UPLOADING:
            self.uploading += sign
        if e.cached:
            self.cached_bytes[e.state] = self.cached_bytes.get(e.state, 0) + sign * e.size
        if sign < 0:
            self.temporaries.discard(e.ino)
            return
        if e.temporary:
            self.temporaries.add(e.ino)
        if e.closed_at:
            heapq.heappush(self._closes, (e.closed_at, e.ino))
            if not e.temporary:
                heapq.heappush(self._lagging, (e.closed_at, e.ino))
            if len(self._closes) > 4 * len(self._entries) + 1024:
                self._closes = [t for t in self._closes if self._closed(t, False)]
                self._lagging = [t for t in self._lagging if self._closed(t, True)]
                heapq.heapify(self._closes)
                heapq.heapify(self._lagging)

    def _closed(self, item: tuple[float, int], lagging: bool) -> bool:
        e = self._entries.get(item[1])
        return e is not None and e.closed_at == item[0] and not (lagging and e.temporary)

    def _oldest(self, heap: list[tuple[float, int]], lagging: bool) -> float | None:
        """The earliest close among live items of `heap` (stale ones popped on the way), or None."""
        while heap and not self._closed(heap[0], lagging):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def oldest_close(self) -> float | None:
        """The earliest last close of any file waiting (reconciled)."""
        self.reconcile()
        return self._oldest(self._closes, False)

    def oldest_lagging_close(self) -> float | None:
        """The earliest last close of the files waiting outside temporary directories (reconciled)."""
        self.reconcile()
        return self._oldest(self._lagging, True)

    def entry(self, ino: int) -> Waiting | None:
        return self._entries.get(ino)

    # ------------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Waiting]:
        """Every file not yet durable (reconciled)."""
        self.reconcile()
        return list(self._entries.values())

    def under(self, ino: int) -> list[Waiting]:
        """The files not yet durable at or below inode `ino` (reconciled)."""
        self.reconcile()
        if ino == ROOT_INODE:
            return list(self._entries.values())
        if ino not in self._dirs:
            e = self._entries.get(ino)
            return [e] if e is not None else []
        return [e for e in self._entries.values() if ino in e.chain]

    def blocking_in(self, directory: int) -> bool:
        """True while a file that is not a commit marker waits at any depth below `directory`."""
        c = self._dirs.get(directory)
        return c is not None and c[1] > 0

    def waiting(self, ino: int) -> bool:
        """True while file `ino` is not durable (as of the last reconcile)."""
        return ino in self._entries

    def due_at(self, e: Waiting) -> float:
        if e.urgent:
            return e.retry_at
        return max(e.retry_at, e.closed_at + (max(self.upload_delay, self.temporary_hold) if e.temporary else self.upload_delay))

    def is_taken(self, ino: int) -> bool:
        return ino in self._taken

    # ---------------------------------------------------------------- scheduling
    def _place(self, e: Waiting) -> None:
        """(Re)queue `e` by when it becomes due; any earlier heap item of it goes stale."""
        self._seq += 1
        e.seq = self._seq
        heapq.heappush(self._due, (self.due_at(e), e.seq, e.ino))
        if len(self._due) + len(self._ready) > 4 * len(self._entries) + 1024:
            self._compact()

    def _valid(self, seq: int, ino: int) -> Waiting | None:
        e = self._entries.get(ino)
        return e if e is not None and e.seq == seq and ino not in self._taken else None

    def _compact(self) -> None:
        """Drop stale heap items (each change of a file queues a new one)."""
        self._due = [t for t in self._due if self._valid(t[1], t[2]) is not None]
        self._ready = [t for t in self._ready if self._valid(t[1], t[2]) is not None]
        heapq.heapify(self._due)
        heapq.heapify(self._ready)

    def release_due(self, now: float) -> None:
        """Move every file due by `now` (wall time) to the ready heap."""
        while self._due and self._due[0][0] <= now:
            _, seq, ino = heapq.heappop(self._due)
            e = self._valid(seq, ino)
            if e is not None:
                heapq.heappush(self._ready, (e.closed_at, seq, ino))

    def pop_ready(self) -> Waiting | None:
        """The due file closed longest ago, out of the queue: the caller takes it, holds it or puts it back."""
        while self._ready:
            _, seq, ino = heapq.heappop(self._ready)
            e = self._valid(seq, ino)
            if e is not None:
                e.seq = 0
                return e
        return None

    def put_back(self, e: Waiting) -> None:
        """A due file that could not go now (its key is busy): first in line again."""
        self._seq += 1
        e.seq = self._seq
        heapq.heappush(self._ready, (e.closed_at, e.seq, e.ino))

    def next_due(self) -> float | None:
        """When the next file that is not due yet becomes due (wall time)."""
        while self._due and self._valid(self._due[0][1], self._due[0][2]) is None:
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else None

    def take(self, ino: int) -> None:
        """The drainer uploads `ino`: out of the queue until `give_back`."""
        self._taken.add(ino)

    def give_back(self, ino: int, retry_at: float = 0.0) -> None:
        """The drainer is done with `ino`; if it still waits (failed, abandoned), queue it, not before `retry_at`."""
        self._taken.discard(ino)
        e = self._entries.get(ino)
        if e is not None:
            e.retry_at = retry_at
            self._place(e)

    def make_urgent(self, e: Waiting) -> None:
        """A flush asked for `e`: due at once, open writers or not."""
        if not e.urgent:
            e.urgent = True
            if e.ino not in self._taken:
                self._place(e)

    def hold_marker(self, e: Waiting) -> None:
        """A commit marker popped while other files wait under its directory: queued again once none do."""
        self._held.setdefault(e.parent, set()).add(e.ino)

    def _unhold(self, e: Waiting) -> None:
        held = self._held.get(e.parent)
        if held is not None:
            held.discard(e.ino)
            if not held:
                del self._held[e.parent]

    def _release_markers(self, directory: int) -> None:
        for ino in self._held.pop(directory, ()):
            e = self._entries.get(ino)
            if e is not None and ino not in self._taken:
                self._place(e)
