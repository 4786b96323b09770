"""Queued object deletions, mirrored in memory: finding the ones that may run costs those, not all queued.

Why: `rm -rf` of uploaded files queues a delete per file and wakes the drainer per file; reading
every queued delete from the journal (and resolving its key) on each wake made removing N
uploaded files cost N squared (1,000 files: 26 s). The journal stays the truth: rows are only
ever appended (ids increase) and dropped, so the mirror reads the rows added since it last
looked (`id > last`) and checks the ones it was told were dropped (`dropped`): a drop rolled
back with its transaction stays queued. It is only read outside a transaction (the drainer, the
control socket), so it never sees a row that is not committed.

It also counts, per directory key (`a/b/`), the deletes queued below it: a directory's `dir/`
object goes after everything under it, and that is now a lookup.

Directory markers to put (op 'marker') are not mirrored: there are few, and they are read as before.
"""

from __future__ import annotations

from typing import Iterator

from ..journal import Journal


def _parents(key: str) -> Iterator[str]:
    """The directory keys above `key`: 'a/b/c' and 'a/b/' both give 'a/', then 'a/b/' for the first."""
    end = key.find("/")
    while end != -1 and end < len(key) - 1:
        yield key[:end + 1]
        end = key.find("/", end + 1)


class DeleteQueue:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._rows: dict[int, tuple[str, int | None]] = {}  # id -> (key, after_ino), in id order
        self._below: dict[str, int] = {}  # directory key -> deletes queued for keys below it
        self._keys: dict[str, int] = {}  # key -> deletes of it queued
        self._last_id = 0
        self._dropped: set[int] = set()  # dropped since the last sync: checked against the journal
        self._loaded = False

    def sync(self) -> None:
        """Take in the deletes queued and dropped since the last call."""
        if not self._loaded:
            self._loaded = True
            self._dropped.clear()
        for delete_id, key, after_ino in self.journal.deletes_after(self._last_id):
            self._rows[delete_id] = (key, after_ino)
            self._last_id = delete_id
            self._keys[key] = self._keys.get(key, 0) + 1
            for parent in _parents(key):
                self._below[parent] = self._below.get(parent, 0) + 1
        if self._dropped:
            gone = self._dropped - self.journal.deletes_present(self._dropped)
            self._dropped.clear()
            for delete_id in gone:
                row = self._rows.pop(delete_id, None)
                if row is None:
                    continue
                if self._keys[row[0]] > 1:
                    self._keys[row[0]] -= 1
                else:
                    del self._keys[row[0]]
                for parent in _parents(row[0]):
                    left = self._below[parent] - 1
                    if left:
                        self._below[parent] = left
                    else:
                        del self._below[parent]

    def dropped(self, delete_id: int) -> None:
        """`delete_id` was dropped from the journal (done, moot or refused): forgotten at the next sync."""
        self._dropped.add(delete_id)

    def __iter__(self) -> Iterator[tuple[int, str, int | None]]:
        """Every queued delete, oldest first: (id, key, inode whose upload it waits for). Dropping while
        iterating is fine (it takes effect at the next sync); queueing is not."""
        self.sync()
        return ((delete_id, key, after) for delete_id, (key, after) in self._rows.items())

    def __len__(self) -> int:
        self.sync()
        return len(self._rows)

    def newest(self) -> int:
        """The id of the newest delete queued so far (0: none yet); ids only increase."""
        self.sync()
        return self._last_id

    def queued(self, key: str) -> bool:
        """True while a delete of `key` is queued (synced first)."""
        self.sync()
        return key in self._keys

    def any_below(self, dir_key: str) -> bool:
        """True while a delete of a key below directory key `dir_key` ('a/b/') is queued (as of the last sync)."""
        return self._below.get(dir_key, 0) > 0
