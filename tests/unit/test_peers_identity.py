"""Identity (issue 42, cases 2, 8 and 9, in memory): a real Listener and PeerLink over loopback, real Memberships and
a real Takeover over the in-memory store, a real ReplicaStore on tmpfs.

* case 8: an owner claimed by its holder that goes on sending (a paused owner resumed) has its seal refused, so its
  write is not acknowledged as replicated; the replica the takeover would drop is never kept;
* case 9: an owner whose record was never written is refused by the listener, and counts no peer copies itself;
* case 2: a new journal under a known name waits for its predecessor's takeover before writing its record, and its
  empty journal's holdings and forgets never touch the predecessor's replicas.
The same cases on real daemons: tests/integration/test_peers_identity.py.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
import trio
import xxhash

from ckptfs.config import MiB, load_config
from ckptfs.namespace.keys import Keys
from ckptfs.objects import SERVER
from ckptfs.peers.link import PeerError, PeerLink
from ckptfs.peers.listener import Listener
from ckptfs.peers.membership import Membership
from ckptfs.peers.records import LIVE, TAKEN_OVER
from ckptfs.peers.replicas import ReplicaStore
from ckptfs.peers.sweep import Sweep
from ckptfs.peers.takeover import Takeover
from tests.support.memstore import MemoryStore
from tests.support.replicas import hold

SECRET = b"s" * 40
PREFIX = "p/"
TTL = 3.0


def config(cache_dir: Path, **over: Any) -> Any:
    return load_config(environ={}, overrides=dict(
        bucket="ckpt", prefix="p", mountpoint="/m", cache_dir=str(cache_dir), multipart_threshold=5 * MiB, part_size=5 * MiB,
        max_parts_in_flight=3, peer_lease_ttl=TTL, peer_addr="127.0.0.1:0", peer_timeout=10.0, cache_min_free=0, **over))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def member(store: MemoryStore, name: str, at: float, journal: str = "", incarnation: str | None = None) -> Membership:
    clock = Clock(at)
    return Membership(config(Path("/tmp")), store, lambda path: PREFIX + path, name, incarnation or f"{name}-1",
                      "127.0.0.1:7470", clock=clock, monotonic=clock, journal_id=journal)


@pytest.fixture
def shm() -> Any:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as d:
        yield Path(d)


def meta(key: str, size: int, seq: int) -> dict[str, Any]:
    return {"key": key, "version": 1, "size": size, "copy_from": None, "marker": False, "seq": seq, "mtime": 1.0,
            "checkpoint": None}


async def send_file(link: PeerLink, path: Path, ino: int, key: str, seq: int) -> None:
    """One file replicated as the sender does it: entry, bytes, seal (which the peer answers)."""
    data = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        await link.entry(ino, meta(key, len(data), seq))
        await link.write(ino, fd, 0, len(data))
        await link.seal(ino, 1, len(data), xxhash.xxh3_128_hexdigest(data))
    finally:
        os.close(fd)


def with_holder(cache_dir: Path, holder: Membership, body: Callable[[Listener, str], Awaitable[None]]) -> None:
    """`body` against node b's real listener, which takes replicas as its membership `holder` judges."""
    async def main() -> None:
        store = ReplicaStore(config(cache_dir), str(cache_dir))
        try:
            listener = Listener(config(cache_dir), store, SECRET, "b")
            listener.judge = holder.owners
            async with trio.open_nursery() as nursery:
                port = await nursery.start(listener.run)
                with trio.fail_after(120):
                    await body(listener, f"127.0.0.1:{port}")
                nursery.cancel_scope.cancel()
        finally:
            store.close()
    trio.run(main)


# -- case 8 -----------------------------------------------------------------------------------------------

def test_an_owner_taken_over_that_goes_on_sending_has_its_seal_refused_and_the_takeover_keeps_what_it_claimed(shm: Path) -> None:
    """a (paused past its lease, then resumed) sends a file after b claimed and took it over: on main b acknowledged
    it (a counted it replicated) and the takeover or the sweep dropped it. Now the seal fails: a's fsync degrades."""
    store = MemoryStore()
    a = member(store, "a", time.time() - 10 * TTL, journal="ja")
    b = member(store, "b", time.time(), journal="jb")
    trio.run(a.announce)
    trio.run(b.announce)
    trio.run(b.refresh)
    cache = shm / "b"
    cache.mkdir()
    f1, f2 = shm / "f1", shm / "f2"
    f1.write_bytes(os.urandom(MiB))
    f2.write_bytes(os.urandom(MiB))
    cfg = config(cache)

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(cfg, "a", "a-1", "b", addr, SECRET, "ja")
        await send_file(link, f1, 2, "p/run/f1", 1)  # before the claim: acknowledged, and taken over
        takeover = Takeover(cfg, store, listener.store, b, Keys(PREFIX))  # type: ignore[arg-type]
        reports = await takeover.round()
        assert [r.owner for r in reports] == ["a"] and reports[0].uploaded == ["p/run/f1"]
        assert store.objects["p/run/f1"].body == f1.read_bytes()
        # a resumes: its next file's seal must not be acknowledged (nobody would ever upload it)
        with pytest.raises(PeerError, match="taken over|refused|lost|closed"):
            await send_file(link, f2, 3, "p/run/f2", 2)
        assert listener.store.entry("a", 3) is None, "the claimed incarnation's frames were kept"
        assert listener.refused_owners >= 1
        # and a connection it opens again is refused with the reason
        again = await PeerLink.open(cfg, "a", "a-1", "b", addr, SECRET, "ja")
        with pytest.raises(PeerError, match="taken over"):
            await again.holdings()

    with_holder(cache, b, body)


def test_the_takeover_and_the_sweep_drop_only_what_the_claimed_journal_sent(shm: Path) -> None:
    """Replicas of a's successor journal held beside the claimed one's: the takeover neither uploads nor drops them."""
    store = MemoryStore()
    a = member(store, "a", time.time() - 10 * TTL, journal="old")
    b = member(store, "b", time.time(), journal="jb")
    trio.run(a.announce)
    trio.run(b.announce)
    trio.run(b.refresh)
    replicas = ReplicaStore(config(shm), str(shm))
    old = hold(replicas, "a", 2, "p/run/old", b"old bytes", seq=1, mtime=1.0)
    replicas.put_entry("a", 2, {"key": old.key, "version": 1, "size": old.size, "copy_from": None, "marker": False,
                                "seq": 1, "mtime": 1.0, "checkpoint": None}, "old", "a-1")
    replicas.seal("a", 2, 1, old.size, old.xxh3 or "")
    data = b"a successor's bytes"
    replicas.put_entry("a", 9, meta("p/run/new", len(data), 5), "new", "a-2")
    os.pwrite(replicas.reserve("a", 9, len(data)), data, 0)
    replicas.seal("a", 9, 1, len(data), xxhash.xxh3_128_hexdigest(data))
    takeover = Takeover(config(shm), store, replicas, b, Keys(PREFIX))  # type: ignore[arg-type]
    reports = trio.run(takeover.round)
    assert reports[0].uploaded == ["p/run/old"]
    assert "p/run/new" not in store.objects
    assert [e.key for e in replicas.entries("a")] == ["p/run/new"], "the successor's replica was dropped"
    replicas.close()


# -- case 9 -----------------------------------------------------------------------------------------------

def test_an_owner_without_a_record_is_refused_and_counts_no_peer_copies(shm: Path) -> None:
    store = MemoryStore()
    b = member(store, "b", time.time(), journal="jb")
    trio.run(b.announce)
    a = member(store, "a", time.time(), journal="ja")
    store.fail("put_bytes", SERVER, times=100, key=PREFIX + ".ckptfs/nodes/a.json")
    with pytest.raises(Exception):
        trio.run(a.announce)
    why = a.copies_uncounted()
    assert why is not None and "could not be written" in why and a.status()["copies_uncounted"] == why
    assert a.status()["state"] == "unannounced"
    cache = shm / "b"
    cache.mkdir()
    f1 = shm / "f1"
    f1.write_bytes(os.urandom(MiB))

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(config(cache), "a", "a-1", "b", addr, SECRET, "ja")
        with pytest.raises(PeerError, match="no node record"):
            await send_file(link, f1, 2, "p/run/f1", 1)
        assert listener.store.entries("a") == []

    with_holder(cache, b, body)


# -- case 2 -----------------------------------------------------------------------------------------------

def test_a_new_journal_under_a_known_name_waits_for_its_predecessors_takeover(shm: Path) -> None:
    store = MemoryStore()
    now = time.time()
    old = member(store, "a", now, journal="old")
    trio.run(old.announce)
    new = member(store, "a", now + 1, journal="new", incarnation="a-2")
    trio.run(new.announce)
    rec = new.record_of("a")
    assert new.state() == "waiting_predecessor" and not new.lease_valid() and new.copies_uncounted() is not None
    written = store.objects[PREFIX + ".ckptfs/nodes/a.json"].body
    assert b'"old"' in written and b'"new"' not in written, "the predecessor's record was written over"
    # a holder claims the predecessor and finishes: then the new journal announces at its next renewal
    b = member(store, "b", now + 2 * TTL, journal="jb")
    trio.run(b.announce)
    trio.run(b.refresh)
    assert trio.run(b.claim, "a") and trio.run(b.mark_takeover_done, "a")
    new.clock.now = now + 2 * TTL  # type: ignore[attr-defined]
    trio.run(new.renew)
    assert new.state() == LIVE and new.copies_uncounted() is None
    assert rec is None or rec.journal_id != "new"


def test_a_new_journal_never_sees_nor_forgets_its_predecessors_replicas(shm: Path) -> None:
    replicas = ReplicaStore(config(shm), str(shm))
    data = b"predecessor bytes"
    replicas.put_entry("a", 2, meta("p/run/f1", len(data), 1), "old", "a-1")
    os.pwrite(replicas.reserve("a", 2, len(data)), data, 0)
    replicas.seal("a", 2, 1, len(data), xxhash.xxh3_128_hexdigest(data))
    assert replicas.holdings("a", "new") == []
    replicas.forget("a", 2, None, "new")  # what channel.learn sends for a held file the new journal does not list
    assert [e.key for e in replicas.entries("a")] == ["p/run/f1"]
    replicas.forget("a", 2, None, "old")
    assert replicas.entries("a") == []
    replicas.close()


def test_an_index_of_an_earlier_release_gets_the_journal_columns_and_keeps_its_replicas(shm: Path) -> None:
    (shm / "peers").mkdir()
    db = sqlite3.connect(shm / "peers" / "replicas.db")
    db.executescript("""
        CREATE TABLE replicas (owner TEXT NOT NULL, ino INTEGER NOT NULL, key TEXT NOT NULL, version INTEGER NOT NULL,
            size INTEGER NOT NULL, sealed INTEGER NOT NULL DEFAULT 0, xxh3 TEXT, copy_from TEXT, marker INTEGER NOT NULL DEFAULT 0,
            seq INTEGER NOT NULL DEFAULT 0, mtime REAL NOT NULL DEFAULT 0, checkpoint TEXT, PRIMARY KEY (owner, ino));
        CREATE TABLE deletes (owner TEXT NOT NULL, op_id INTEGER NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL,
            PRIMARY KEY (owner, op_id));
        INSERT INTO replicas (owner, ino, key, version, size, sealed, xxh3) VALUES ('a', 2, 'p/run/f1', 1, 0, 1, 'x');
        INSERT INTO deletes VALUES ('a', 1, 'p/run/gone', 3);
    """)
    db.commit()
    db.close()
    replicas = ReplicaStore(config(shm), str(shm))
    [e] = replicas.entries("a", "any-journal")  # untagged: it matches whatever journal the owner's record names
    assert (e.key, e.journal, e.incarnation) == ("p/run/f1", "", "")
    assert [d.key for d in replicas.deletes("a", "any-journal")] == ["p/run/gone"]
    replicas.close()


def test_a_taken_over_record_keeps_the_journal_it_was_claimed_with() -> None:
    store = MemoryStore()
    a = member(store, "a", time.time() - 10 * TTL, journal="ja")
    trio.run(a.announce)
    b = member(store, "b", time.time(), journal="jb")
    trio.run(b.announce)
    trio.run(b.refresh)
    assert trio.run(b.claim, "a")
    rec = b.record_of("a")
    assert rec is not None and rec.state == TAKEN_OVER and rec.journal_id == "ja"
    assert b.owners.owner_refused("a", "a-1", "ja") is not None
    assert [(p.node, p.state) for p in b.peers()] == [("a", TAKEN_OVER)]  # `ckptfs status`: taken_over until it rejoins



def test_the_sweep_drops_what_the_claimed_incarnation_sent_not_what_one_admitted_since(shm: Path) -> None:
    """c holds a's replicas; b took a over and finished. a rejoined (incarnation a-2, same journal) and c admitted it:
    a sweep acting on the record c read before the rejoin drops a-1's replicas only."""
    store = MemoryStore()
    a = member(store, "a", time.time() - 10 * TTL, journal="ja")
    trio.run(a.announce)
    b = member(store, "b", time.time(), journal="jb")
    c = member(store, "c", time.time(), journal="jc")
    for m in (b, c):
        trio.run(m.announce)
        trio.run(m.refresh)
    assert trio.run(b.claim, "a") and trio.run(b.mark_takeover_done, "a")
    trio.run(c.refresh)
    replicas = ReplicaStore(config(shm), str(shm))
    for ino, incarnation in ((2, "a-1"), (3, "a-2")):
        data = f"bytes of {ino}".encode()
        replicas.put_entry("a", ino, meta(f"p/run/f{ino}", len(data), ino), "ja", incarnation)
        os.pwrite(replicas.reserve("a", ino, len(data)), data, 0)
        replicas.seal("a", ino, 1, len(data), xxhash.xxh3_128_hexdigest(data))
    c.admitted["a"] = "a-2"  # what the listener records when it admits the rejoined incarnation
    report = trio.run(Sweep(config(shm), store, replicas, c).once)  # type: ignore[arg-type]
    assert report.owners_dropped == ["a"]
    assert [e.ino for e in replicas.entries("a")] == [3], "the rejoined incarnation's replica was dropped"
    replicas.close()
