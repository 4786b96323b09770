"""Which objects may need a restore before they can be read, by object key (in memory).

Listings tell the storage class of every object for free (`ListingMerge` notes the ones in a
class that may need a restore: GLACIER, DEEP_ARCHIVE, INTELLIGENT_TIERING); HeadObject (asked
by the fetcher when such a file is opened) and a GET refused with InvalidObjectState tell the
restore state, kept here for `metadata_ttl`. Objects in other classes cost nothing here. Lost at
a restart: the next listing of the directory, which comes before any open, says it again.
"""

from __future__ import annotations

import time

from ..storageclass import ArchiveState, may_need_restore


class Archive:
    def __init__(self) -> None:
        self.classes: dict[str, str] = {}  # key -> storage class of the last listing, if it may need a restore
        self.states: dict[str, tuple[ArchiveState, float]] = {}  # key -> (state, when learnt, monotonic)

    def listed(self, key: str, storage_class: str) -> None:
        """A listing showed `key` in `storage_class`."""
        if may_need_restore(storage_class):
            self.classes[key] = storage_class
        else:  # a class read at once (moved back, or replaced): nothing to remember
            self.classes.pop(key, None)
            self.states.pop(key, None)

    def may_need_restore(self, key: str | None) -> bool:
        if not key:
            return False
        state = self.states.get(key)
        return key in self.classes or (state is not None and state[0].archived)

    def storage_class(self, key: str) -> str:
        return self.classes.get(key, "")

    def observed(self, key: str, state: ArchiveState) -> None:
        """HeadObject (or a refused GET) told `key`'s state."""
        self.states[key] = (state, time.monotonic())

    def known(self, key: str, max_age: float) -> ArchiveState | None:
        """The state learnt less than `max_age` seconds ago, if any."""
        got = self.states.get(key)
        if got is None or time.monotonic() - got[1] >= max_age:
            return None
        return got[0]

    def forget(self, key: str) -> None:
        self.classes.pop(key, None)
        self.states.pop(key, None)
