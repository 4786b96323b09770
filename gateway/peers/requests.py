"""What membership costs the bucket, counted by kind: `ckptfs_membership_requests_total{backend,kind}`.

Why a wrapper of the store rather than counters in membership.py: every request of the node records (the
renewal, the LIST of the others, their GETs, claims, the prune, identity's and departure's reads) goes through
the store object Membership holds, so counting there misses none, and the code that makes them stays as it is.
The figure a cluster's operator needs is requests per node per period (docs/peers.md: it grows with the number of
nodes; the bill and the store's request limits follow from it).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

from ..objects import Listing

KINDS = ("list", "get", "put", "delete")


class CountedStore:
    """The store as membership uses it, each request counted (a LIST by its pages). A store that counts its own
    requests (`requests_by_kind`: store/etcd.py, whose LIST answers from a watched copy without a request) is taken at its word."""

    def __init__(self, store: Any) -> None:
        self._store = store
        own = getattr(store, "requests_by_kind", None)
        self.counting = own is None
        self.counts: collections.Counter[str] = own if own is not None else collections.Counter({k: 0 for k in KINDS})
        self._lock = threading.Lock()  # the requests run in worker threads, several GETs at once

    def _count(self, kind: str) -> None:
        if self.counting:
            with self._lock:
                self.counts[kind] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def list(self, prefix: str, recursive: bool = False, on_page: Callable[[], None] | None = None) -> Listing:
        def page() -> None:
            pages.append(1)
            self._count("list")
            if on_page is not None:
                on_page()

        pages: list[int] = []
        try:
            return self._store.list(prefix, recursive, on_page=page)  # type: ignore[no-any-return]
        finally:
            if not pages:  # failed before a page came back, or a store that does not report pages
                self._count("list")

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        self._count("get")
        return self._store.get_bytes(key)  # type: ignore[no-any-return]

    def put_bytes(self, key: str, body: bytes, **kw: Any) -> str:
        self._count("put")
        return self._store.put_bytes(key, body, **kw)  # type: ignore[no-any-return]

    def delete_if_match(self, key: str, etag: str) -> None:
        self._count("delete")
        self._store.delete_if_match(key, etag)

    def head_object(self, key: str) -> Any:
        self._count("get")  # a HEAD is billed as a GET
        return self._store.head_object(key)
