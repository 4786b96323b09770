"""The drain's state machine against an in-memory store with injected faults (tests/support/memstore.py):
retries after a transient error, a multipart upload resumed after a crash between two parts, an upload
abandoned when the file changes under it, a cache file that cannot be read. Fast and deterministic; the
SeaweedFS tests (tests/integration) remain the proof that uploads work against a real store.

Each test runs the real `Drainer` over a real journal and cache directory, and waits for a state (a file
durable, a call made) with a generous bound, never for a time.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Callable

import pytest
import trio

from ckptfs import drain, upload
from ckptfs.cache import Cache
from ckptfs.config import MiB, load_config
from ckptfs.drain import Drainer
from ckptfs.journal import DURABLE, ROOT_INODE, Journal
from ckptfs.metrics import Metrics
from ckptfs.namespace import Namespace
from ckptfs.objects import NETWORK, SERVER
from tests.support.memstore import MemoryStore
from tests.unit.test_journal import write_file

PART = 5 * MiB  # S3's smallest part
BOUND = 60.0  # seconds a state may take to come: generous, the machine is shared


def namespace(tmp_path: Path) -> Namespace:
    cfg = load_config(environ={}, overrides=dict(
        bucket="ckpt", prefix="p", mountpoint="/m", cache_dir=str(tmp_path), upload_delay=0,
        multipart_threshold=PART, part_size=PART, max_parts_in_flight=1, retry_max_backoff=0.05))
    ns = Namespace(cfg, Journal(tmp_path / "journal.sqlite3", "ckpt", "p"), Cache(tmp_path, 0))
    ns.recover()
    return ns


def drainer(ns: Namespace, store: MemoryStore) -> Drainer:
    return Drainer(ns.cfg, ns, ns.cache, store, Metrics(lambda: {}))


def drain_until(d: Drainer, done: Callable[[], bool], meanwhile: Callable[[], object] | None = None) -> None:
    """Run the drainer until `done()`; `meanwhile` runs in a worker thread alongside (a test's own steps)."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(d.run)
            if meanwhile is not None:
                nursery.start_soon(trio.to_thread.run_sync, meanwhile)
            with trio.fail_after(BOUND):
                while not done():
                    await trio.sleep(0.005)
            nursery.cancel_scope.cancel()

    trio.run(main)


def durable(ns: Namespace, ino: int) -> bool:
    row = ns.journal.get(ino)
    return row is not None and row.state == DURABLE


def errors(d: Drainer, kind: str) -> float | None:
    """ckptfs_upload_errors_total{kind} as a scrape would show it."""
    return d.metrics.registry.get_sample_value("ckptfs_upload_errors_total", {"kind": kind})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rewrite(ns: Namespace, ino: int, data: bytes) -> None:
    fd = ns.files.open(ino, write=True)
    try:
        ns.files.write(ino, fd, 0, data)
    finally:
        os.close(fd)
    ns.files.release(ino, write=True)


# ------------------------------------------------------------ transient store errors
@pytest.mark.parametrize("kind", [SERVER, NETWORK])
def test_a_transient_store_error_is_retried_until_the_file_is_durable(tmp_path: Path, kind: str) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    data = os.urandom(1000)
    ino = write_file(ns, ROOT_INODE, "small.bin", data)
    store.fail("put_object_body", kind, times=2)
    d = drainer(ns, store)
    drain_until(d, lambda: durable(ns, ino))
    assert sha(store.objects["p/small.bin"].body) == sha(data)
    assert len(store.calls["put_object_body"]) == 3  # two refused, the third taken
    assert errors(d, kind) == 2
    assert "injected" in d.last_error


def test_a_failed_part_keeps_the_upload_and_retries_only_that_part(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    data = os.urandom(3 * PART - 7)
    ino = write_file(ns, ROOT_INODE, "big.bin", data)
    store.fail("upload_part", SERVER, times=1, key="p/big.bin")
    drain_until(drainer(ns, store), lambda: durable(ns, ino))
    assert sha(store.objects["p/big.bin"].body) == sha(data)
    assert len(store.calls["create_multipart"]) == 1  # the same upload, resumed (ListParts), not a new one
    sent = [c[2] for c in store.calls["upload_part"]]
    assert sorted(sent) == sorted([1, 2, 3, sent[0]])  # the part refused sent again, each other one once
    assert store.uploads == {} and ns.journal.upload_of(ino) is None


# ------------------------------------------------------------ a crash between two parts
def test_a_multipart_upload_cut_by_a_crash_between_parts_resumes_from_the_parts_in_the_bucket(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    data = os.urandom(3 * PART + 11)
    ino = write_file(ns, ROOT_INODE, "big.bin", data)
    store.crash("upload_part", skip=1)  # one part goes through; the daemon dies sending the next
    drain_until(drainer(ns, store), store.hung("upload_part").is_set)
    first = store.calls["upload_part"][0][2]
    rec = ns.journal.upload_of(ino)
    assert rec is not None and set(rec.parts) == {first}  # what the journal committed before the crash
    assert list(store.uploads) == [rec.upload_id]
    ns.journal.close()
    store.release()
    store.calls.clear()

    ns = namespace(tmp_path)  # the next start: same cache directory, journal reopened and recovered
    drain_until(drainer(ns, store), lambda: durable(ns, ino))
    assert sha(store.objects["p/big.bin"].body) == sha(data)
    assert store.calls["list_parts"] == [("p/big.bin", rec.upload_id)]  # asked the bucket what it has
    assert "create_multipart" not in store.calls  # the same upload, not a new one
    assert sorted(c[2] for c in store.calls["upload_part"]) == sorted({1, 2, 3, 4} - {first})  # not sent again
    assert store.uploads == {}


# ------------------------------------------------------------ the file changes under its upload
def test_a_file_rewritten_during_its_multipart_upload_abandons_it_and_uploads_the_new_bytes(tmp_path: Path) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    old, new = os.urandom(3 * PART), os.urandom(3 * PART)
    ino = write_file(ns, ROOT_INODE, "big.bin", old)
    store.hang("upload_part", skip=1)  # part 2 waits in the store while the file is rewritten
    rewritten = trio.Event()
    first_upload: list[str] = []

    def writer_then_release() -> None:
        assert store.hung("upload_part").wait(BOUND)
        first_upload.append(store.calls["upload_part"][0][1])  # type: ignore[arg-type]
        trio.from_thread.run_sync(rewrite, ns, ino, new)
        trio.from_thread.run_sync(rewritten.set)
        store.release()

    d = drainer(ns, store)
    drain_until(d, lambda: rewritten.is_set() and durable(ns, ino), writer_then_release)
    assert d.metrics.registry.get_sample_value("ckptfs_abandoned_uploads_total") == 1
    assert sha(store.objects["p/big.bin"].body) == sha(new)  # never the old bytes, never a mix
    assert ("p/big.bin", first_upload[0]) in store.calls["abort"]  # the first upload was abandoned, not completed
    assert [c[1] for c in store.calls["complete"]] != first_upload
    assert store.uploads == {} and ns.journal.upload_of(ino) is None


# ------------------------------------------------------------ the cache file cannot be read
@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
@pytest.mark.parametrize("size", [1000, 2 * PART])
def test_a_cache_file_that_cannot_be_read_is_reported_and_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   code: int, size: int) -> None:
    ns, store = namespace(tmp_path), MemoryStore()
    data = os.urandom(size)
    ino = write_file(ns, ROOT_INODE, "f.bin", data)
    failures: list[int] = []
    # a small file is read by the PutObject shared with the takeover (upload.put_whole), a large one hashed by the drain
    module, reader = (upload, "read_whole") if size < PART else (drain, "file_digests")
    real = getattr(module, reader)

    def failing(*args: object, **kw: object) -> object:
        if not failures:
            failures.append(code)
            raise OSError(code, os.strerror(code))
        return real(*args, **kw)

    monkeypatch.setattr(module, reader, failing)
    d = drainer(ns, store)
    drain_until(d, lambda: durable(ns, ino))
    assert failures == [code]
    assert sha(store.objects["p/f.bin"].body) == sha(data)
    assert d.last_error.startswith("reading cache file for p/f.bin") and os.strerror(code) in d.last_error
    assert errors(d, "other") == 1


# ------------------------------------------------------------ a crash between the store's step and the journal's
def crash_and_restart(tmp_path: Path, store: MemoryStore, op: str, data: bytes) -> tuple[Namespace, int]:
    """Upload a new file until the daemon dies with `op` done in the store but not recorded; then the next start."""
    ns = namespace(tmp_path)
    ino = write_file(ns, ROOT_INODE, "big.bin", data)
    store.crash(op, after=True)
    drain_until(drainer(ns, store), store.hung(op).is_set)
    ns.journal.close()
    store.release()
    return namespace(tmp_path), ino


def test_a_crash_after_the_store_completed_an_upload_the_journal_did_not_record_uploads_it_again(tmp_path: Path) -> None:
    store, data = MemoryStore(), os.urandom(2 * PART + 1)
    ns, ino = crash_and_restart(tmp_path, store, "complete", data)
    assert not durable(ns, ino) and ns.journal.upload_of(ino) is not None  # the journal never heard of the completion
    drain_until(drainer(ns, store), lambda: durable(ns, ino))
    assert sha(store.objects["p/big.bin"].body) == sha(data)
    assert len(store.calls["create_multipart"]) == 2  # ListParts found the completed upload gone: a new one
    assert store.uploads == {} and ns.journal.upload_of(ino) is None


def test_a_crash_after_the_store_created_an_upload_the_journal_did_not_record_starts_another(tmp_path: Path) -> None:
    store, data = MemoryStore(), os.urandom(2 * PART + 1)
    ns, ino = crash_and_restart(tmp_path, store, "create_multipart", data)
    [leaked] = store.uploads
    assert ns.journal.upload_of(ino) is None
    drain_until(drainer(ns, store), lambda: durable(ns, ino))
    assert sha(store.objects["p/big.bin"].body) == sha(data)
    # the upload nobody recorded never got a part (parts follow the journal's record of their upload): it costs
    # no storage; the sweep at start aborts it, unless the file's new upload had taken the key first, in which
    # case `abort_stale_uploads_after` does
    assert set(store.uploads) <= {leaked} and all(not u.parts for u in store.uploads.values())
