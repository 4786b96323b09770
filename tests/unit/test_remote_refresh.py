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
    r = Remote(ns, SimpleNamespace(answered_at=0.0), ns.cfg)  # type: ignore[arg-type]
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
        self.answered_at = 0.0

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


# ------------------------------------------------------------ "the store does not answer" ends with any answer
def test_any_request_the_store_answers_ends_the_outage_not_only_a_listing(tmp_path: Path) -> None:
    """The hung-store flake (issue 34): after the store answered again and a flush succeeded, an rmdir still got
    ETIMEDOUT until a background listing happened to succeed first. Now the flush's upload is news enough."""
    import errno

    import zlib

    from ckptfs.objects import NETWORK, crc32_b64
    from tests.support.memstore import MemoryStore

    ns = make_ns(tmp_path)
    store = MemoryStore()
    store.put_object_body("p/elsewhere/unseen.bin", b"x", crc32_b64(zlib.crc32(b"x")), {})  # another node's, never listed here
    ns.merge.merge(ROOT_INODE, time.time(), Listing(["elsewhere"], [], False))
    elsewhere = ns.journal.lookup(ROOT_INODE, "elsewhere")
    assert elsewhere is not None
    r = Remote(ns, store, ns.cfg)  # type: ignore[arg-type]

    async def rmdir_listing() -> int:
        try:
            await r.refresh_tree(elsewhere.ino, "rmdir")
            return 0
        except OSError as e:
            return e.errno or -1

    store.fail("list", NETWORK)  # the outage: the rmdir's listing gets no answer
    assert trio.run(rmdir_listing) == errno.ETIMEDOUT
    assert trio.run(rmdir_listing) == errno.ETIMEDOUT  # known down: not even asked
    assert store.calls["list"] == [("p/elsewhere/", True)]
    store.put_object_body("p/step/shard.bin", b"s", crc32_b64(zlib.crc32(b"s")), {})  # a flush's upload succeeds: the store answers
    assert trio.run(rmdir_listing) == 0  # listed: the object under it is seen
    assert not r.store_down()
    assert [row.name for row in ns.journal.children(elsewhere.ino)] == ["unseen.bin"]


def test_a_failure_of_a_request_sent_before_the_last_answer_is_old_news(tmp_path: Path) -> None:
    from tests.support.memstore import MemoryStore

    ns = make_ns(tmp_path)
    store = MemoryStore()
    r = Remote(ns, store, ns.cfg)  # type: ignore[arg-type]
    sent = time.monotonic()  # a listing sent into the outage ...
    store.delete("p/x")  # ... the store answers another request meanwhile ...
    r._store_down(sent)  # ... and the listing's timeout arrives late
    assert not r.store_down()
    r._store_down(time.monotonic() + 1e-6)  # a request sent after that answer fails: down
    assert r.store_down()


def test_a_hung_listing_is_waited_for_once_then_the_directory_is_stale_until_the_store_answers(tmp_path: Path) -> None:
    from tests.support.memstore import MemoryStore

    ns = make_ns(tmp_path)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    store = MemoryStore()
    store.hang("list")  # the store takes the request and says nothing
    r = Remote(ns, store, ns.cfg)  # type: ignore[arg-type]
    r.bound = 0.2  # listing_timeout

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            r._nursery = nursery
            await r.refresh(d.ino)  # answered after the bound, from what the node knows
            assert d.ino in r.stale and r.store_down() and r.listing_timeouts_total == 1
            await r.refresh(d.ino)  # not waited for a second time
            assert store.calls["list"] == [("p/d/", False)]
            await trio.to_thread.run_sync(store.release)  # the store answers the listing it held
            with trio.fail_after(60):
                while d.ino in r.stale:
                    await trio.sleep(0.01)
            assert not r.store_down() and r.listings_total == 1
            nursery.cancel_scope.cancel()

    trio.run(main)
