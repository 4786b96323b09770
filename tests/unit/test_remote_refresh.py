"""A lookup that finds its directory's listing deadline already past is answered, never an internal error (EIO);
a directory in use is listed again before its listing expires."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from ckptfs import remote
from ckptfs.journal import ROOT_INODE
from ckptfs.objects import Listing
from ckptfs.remote import Remote, _Job

from tests.unit.test_journal import make_ns


def test_a_deadline_already_past_marks_the_directory_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = make_ns(tmp_path)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    r = Remote(ns, SimpleNamespace(), ns.cfg)  # type: ignore[arg-type]
    r.bound = 1.0
    r._jobs[d.ino] = _Job(progress_at=100.0)  # a listing under way, silent since t=100
    calls = []

    def clock() -> float:  # the request arrives at t=100; the loop gets back to it at t=110
        calls.append(1)
        return 100.0 if len(calls) == 1 else 110.0

    monkeypatch.setattr(remote.time, "monotonic", clock)
    trio.run(r.refresh, d.ino)
    assert d.ino in r.stale and r.listing_timeouts_total == 1


class _Store:
    def __init__(self) -> None:
        self.listed: list[str] = []

    def list(self, prefix: str, recursive: bool = False, on_page: object = None) -> Listing:
        self.listed.append(prefix)
        return Listing([], [], False)


@pytest.mark.parametrize("age, relisted", [(0.5, False), (0.85, True)])
def test_a_directory_in_use_is_listed_again_in_the_background_before_its_listing_expires(tmp_path: Path, age: float, relisted: bool) -> None:
    """A lookup in a directory whose listing is still fresh is answered at once; past REFRESH_AHEAD of the TTL it
    also starts the next listing in the background, so the lookup after the TTL finds a fresh one and does not wait."""
    ns = make_ns(tmp_path, metadata_ttl=10)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    store = _Store()
    r = Remote(ns, store, ns.cfg)  # type: ignore[arg-type]
    listed_at = time.monotonic() - age * r.ttl

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            r._nursery = nursery
            r.listed_at[d.ino] = listed_at
            await r.refresh(d.ino)  # answered from the listing still fresh: no wait
            assert (d.ino in r._jobs) == relisted
            if relisted:
                await r._jobs[d.ino].attempt_done.wait()
            nursery.cancel_scope.cancel()
    trio.run(main)
    assert store.listed == (["p/d/"] if relisted else [])
    assert (r.listed_at[d.ino] > listed_at) == relisted and r.listings_total == int(relisted)
