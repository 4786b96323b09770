"""The owner's replication policy (peers/sender.py) on a real namespace (journal and cache in tmp_path), with
fake peers: a fake link keeps each file's replica in memory as the listener keeps it on disk, and checks
the seal's xxh3 as the real peer does. The transport itself is tested with real sockets elsewhere.
"""

from __future__ import annotations

import errno
import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import xxhash

from ckptfs.journal import ROOT_INODE
from ckptfs.namespace import Namespace
from ckptfs.peers.link import Held, PeerBusy, PeerError, SealMismatch
from ckptfs.peers.bandwidth import TokenBucket
from ckptfs.peers.sealhash import SealDigest, seal_digest
from ckptfs.peers.sender import Sender

from tests.unit.test_journal import make_ns


def trio_test(fn: Any) -> Any:
    """Run an async test under trio (the project has no pytest-trio)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        trio.run(functools.partial(fn, *args, **kwargs))

    return run


@dataclass
class Replica:
    data: bytearray = field(default_factory=bytearray)
    meta: dict[str, Any] = field(default_factory=dict)
    sealed: tuple[int, int, str] | None = None  # (version, size, xxh3)


class FakePeer:
    """One peer node: its replicas survive the links to it (a restart of the owner reconnects)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.addr = f"{node}:1"
        self.replicas: dict[int, Replica] = {}
        self.forgotten: list[tuple[int, int | None]] = []
        self.deletes: dict[int, str] = {}
        self.after: dict[int, int | None] = {}  # delete id -> the file it waits for
        self.etags: dict[int, str | None] = {}  # delete id -> the object it removes, as the owner saw it
        self.frames: list[tuple[str, Any]] = []  # entries, deletes and barriers, in the order they arrived
        self.written = 0  # data bytes received
        self.mismatches = 0  # seals whose xxh3 differed from this copy's
        self.fail_at: str | None = None  # an operation that raises PeerError
        self.lose_at: str | None = None  # an operation whose connection the peer closes (once: the peer is still there)
        self.hang_at: str | None = None  # an operation that never answers
        self.silent = trio.Event()  # set: the peer died silently; a link's idle ping goes unanswered (PeerLink.watch)
        self.links = 0
        self.closed = 0  # links to it closed by the owner
        self.busy = False  # its share of owners taken (spread.py): it redirects us unless we insist
        self.asked: list[bool] = []  # each HOLDINGS: whether we insisted

    def held(self) -> dict[int, Held]:
        return {ino: Held(ino, r.sealed[0], r.sealed[1], True, r.sealed[2]) if r.sealed else Held(ino, 0, len(r.data), False, None)
                for ino, r in self.replicas.items()}


class FakeLink:
    def __init__(self, peer: FakePeer) -> None:
        self.peer = peer
        self.node = peer.node
        self.connection_lost = False

    async def _op(self, name: str) -> None:
        await trio.sleep(0)
        if self.peer.silent.is_set():
            await trio.sleep_forever()
        if self.peer.fail_at == name:
            raise PeerError(f"{name}: connection reset")
        if self.peer.lose_at == name:
            self.peer.lose_at, self.connection_lost = None, True
            raise PeerError(f"{name}: connection lost")
        if self.peer.hang_at == name:
            await trio.sleep_forever()

    async def holdings(self, insist: bool = False) -> dict[int, Held]:
        await self._op("holdings")
        self.peer.asked.append(insist)
        if self.peer.busy and not insist:
            raise PeerBusy(f"peer {self.node}: takes replicas from 2 owners already")
        return self.peer.held()

    async def entry(self, ino: int, meta: dict[str, Any]) -> None:
        await self._op("entry")
        self.peer.frames.append(("entry", ino))
        r = self.peer.replicas.setdefault(ino, Replica())
        r.meta = dict(meta)
        if meta.get("copy_from") and meta.get("sealed"):
            r.data, r.sealed = bytearray(), (meta["version"], meta["size"], meta["xxh3"])  # as the ReplicaStore: its bytes are the bucket's
        elif r.sealed and r.sealed[0] != meta["version"]:
            r.sealed = None  # as the ReplicaStore: a new version is not sealed until the owner seals it

    async def write(self, ino: int, fd: int, offset: int, length: int) -> None:
        await self._op("write")
        data = os.pread(fd, length, offset)
        r = self.peer.replicas.setdefault(ino, Replica())
        if len(r.data) < offset + len(data):
            r.data.extend(b"\0" * (offset + len(data) - len(r.data)))
        r.data[offset:offset + len(data)] = data
        r.sealed = None
        self.peer.written += len(data)

    async def truncate(self, ino: int, size: int) -> None:
        await self._op("truncate")
        r = self.peer.replicas.setdefault(ino, Replica())
        del r.data[size:]
        r.data.extend(b"\0" * (size - len(r.data)))
        r.sealed = None

    async def seal(self, ino: int, version: int, size: int, digest: SealDigest) -> None:
        await self._op("seal")
        r = self.peer.replicas.setdefault(ino, Replica())
        if len(r.data) != size or seal_digest(bytes(r.data)) != digest:  # the owner sends both: xxh3 and BLAKE3
            self.peer.mismatches += 1
            raise SealMismatch("digest differs")
        r.sealed = (version, size, digest.xxh3)

    async def forget(self, ino: int, version: int | None) -> None:
        await self._op("forget")
        self.peer.forgotten.append((ino, version))
        self.peer.replicas.pop(ino, None)

    async def delete(self, op_id: int, key: str, seq: int, after_ino: int | None = None, etag: str | None = None) -> None:
        self.peer.frames.append(("delete", key))
        self.peer.etags[op_id] = etag
        self.peer.deletes[op_id] = key
        self.peer.after[op_id] = after_ino

    async def delete_done(self, op_id: int) -> None:
        self.peer.deletes.pop(op_id, None)

    async def barrier(self) -> None:
        await self._op("barrier")
        self.peer.frames.append(("barrier", None))

    async def watch(self) -> None:
        """As PeerLink.watch, told rather than timed (that one is tested on a real link): a silent peer fails it."""
        await self.peer.silent.wait()
        raise PeerError(f"peer {self.node}: no answer to a ping")

    async def aclose(self) -> None:
        self.peer.closed += 1


class Cluster:
    def __init__(self, *peers: FakePeer) -> None:
        self.peers = {p.node: p for p in peers}
        self.down: set[str] = set()
        self.records_down: set[str] = set()  # what Membership.down() says

    def targets(self) -> list[FakePeer]:
        return [p for p in self.peers.values() if p.node not in self.down]

    async def open(self, node: str, addr: str) -> FakeLink:
        peer = self.peers[node]
        peer.links += 1
        await trio.sleep(0)
        if peer.fail_at == "open":
            raise PeerError("connection refused")
        return FakeLink(peer)


def sender_for(ns: Namespace, cluster: Cluster, **opts: Any) -> Sender:
    ns.cfg.peer_timeout = opts.get("peer_timeout", 5.0)
    ns.cfg.peer_replicas = opts.get("peer_replicas", 1)
    ns.cfg.on_no_peer = opts.get("on_no_peer", "degrade")
    ns.cfg.peer_lease_ttl = opts.get("peer_lease_ttl", 0.0)  # 0: no start-up wait for a first peer (tested on its own)
    return Sender(ns.cfg, ns, cluster.open, cluster.targets, down=lambda: set(cluster.records_down))


def create(ns: Namespace, name: str, parent: int = ROOT_INODE) -> tuple[int, int]:
    row = ns.tree.create(parent, name, 0o644, 0, 0)
    return row.ino, ns.files.open(row.ino, write=True, created=row)


def close(ns: Namespace, ino: int, fd: int) -> None:
    os.close(fd)
    ns.files.release(ino, write=True)


async def wait_for(cond: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.01)


def file_bytes(ns: Namespace, ino: int) -> bytes:
    return Path(ns.cache.path(ino)).read_bytes()


@trio_test
async def test_bytes_stream_while_written_and_fsync_waits_for_the_seal(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "shard.pt")
        first = os.urandom(3 << 20)
        ns.files.write(ino, fd, 0, first)
        # streamed without anyone waiting: the peer has the bytes before any fsync, not yet sealed
        await wait_for(lambda: ino in b.replicas and bytes(b.replicas[ino].data) == first)
        assert b.replicas[ino].sealed is None and not sender.is_replicated(ino)
        assert b.replicas[ino].meta["key"] == "p/shard.pt" and b.replicas[ino].meta["marker"] is False
        ns.files.write(ino, fd, len(first), b"tail")
        ns.files.write(ino, fd, 0, b"head")  # a rewrite in place
        await sender.replicated(ino)  # what fsync awaits
        assert sender.is_replicated(ino)
        assert bytes(b.replicas[ino].data) == file_bytes(ns, ino)
        assert b.replicas[ino].sealed[0] == ns.files.live[ino].version
        assert b.written < 2 * len(first)  # the body went once
        ns.files.write(ino, fd, 10, b"x")
        assert not sender.is_replicated(ino)  # a new version: single-copy again until sealed
        assert sender.single_copy()[0] == len(file_bytes(ns, ino))
        close(ns, ino, fd)
        # closed: sealed without an fsync asking
        await wait_for(lambda: sender.is_replicated(ino))
        assert bytes(b.replicas[ino].data) == file_bytes(ns, ino)
        assert sender.single_copy() == (0, 0.0)
        nursery.cancel_scope.cancel()


@trio_test
async def test_truncate_empty_files_and_markers_reach_the_peer(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "model.pt")
        ns.files.write(ino, fd, 0, b"a" * 1000)
        ns.files.truncate(ino, 10)
        ns.files.write(ino, fd, 20, b"b")  # a hole at 10..20
        await sender.replicated(ino)
        assert bytes(b.replicas[ino].data) == file_bytes(ns, ino) == b"a" * 10 + b"\0" * 10 + b"b"
        marker, mfd = create(ns, ".metadata")
        await sender.replicated(marker)  # the FLUSH of an empty commit marker
        assert b.replicas[marker].sealed is not None and b.replicas[marker].data == b""
        assert b.replicas[marker].meta["marker"] is True
        close(ns, ino, fd)
        close(ns, marker, mfd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_rename_sends_the_new_key_and_unlink_forgets(tmp_path: Path) -> None:
    ns = make_ns(tmp_path, checkpoint_patterns=["step_{step}"])
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        d = ns.tree.mkdir(ROOT_INODE, "step_7", 0o755, 0, 0)
        ino, fd = create(ns, "w.tmp", d.ino)
        ns.files.write(ino, fd, 0, b"weights")
        close(ns, ino, fd)
        await sender.replicated(ino)
        ns.tree.rename(d.ino, "w.tmp", d.ino, "w.pt", False)
        await wait_for(lambda: b.replicas[ino].meta["key"] == "p/step_7/w.pt")
        assert b.replicas[ino].meta["checkpoint"] == "step_7"
        ns.tree.unlink(d.ino, "w.pt")
        await wait_for(lambda: ino not in b.replicas)
        assert (ino, None) in b.forgotten
        nursery.cancel_scope.cancel()


@trio_test
async def test_durable_files_are_forgotten_by_their_peers(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, b"data")
        close(ns, ino, fd)
        await sender.replicated(ino)
        ticket = ns.uploads.begin_upload(ino)
        assert ticket is not None and ns.uploads.finish_upload(ticket, "etag", "h")
        await wait_for(lambda: ino not in b.replicas)
        assert b.forgotten == [(ino, ticket.version)]
        await sender.replicated(ino)  # durable: returns at once
        assert sender.files == set()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("fail_at", ["open", "write", "seal"])
@trio_test
async def test_a_failing_peer_is_replaced_by_the_next_candidate(tmp_path: Path, fail_at: str) -> None:
    ns = make_ns(tmp_path)
    a, b = FakePeer("a"), FakePeer("b")
    a.fail_at = fail_at
    sender = sender_for(ns, Cluster(a, b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        older, ofd = create(ns, "older")
        ns.files.write(older, ofd, 0, b"o" * 5000)
        close(ns, older, ofd)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, os.urandom(100_000))
        await sender.replicated(ino)
        assert "a" not in sender.channels and "b" in sender.channels
        assert bytes(b.replicas[ino].data) == file_bytes(ns, ino)
        # the next candidate got every file not yet durable, not only the one waited for
        await wait_for(lambda: sender.is_replicated(older))
        assert bytes(b.replicas[older].data) == b"o" * 5000
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_peer_at_its_share_of_owners_sends_us_on_and_when_every_one_is_we_insist_on_the_first(tmp_path: Path) -> None:
    """spread.py: a peer that takes replicas from its share of owners redirects a new one (PeerBusy): the owner goes
    down its order, not to single-copy; when every candidate redirects it, it asks the best one again, insisting."""
    ns = make_ns(tmp_path)
    a, b, c = FakePeer("a"), FakePeer("b"), FakePeer("c")
    a.busy = True
    sender = sender_for(ns, Cluster(a, b, c))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, os.urandom(10_000))
        await sender.replicated(ino)
        assert list(sender.channels) == ["b"] and a.asked == [False] and b.asked == [False]
        assert sender.degraded_writes == 0
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()
    (tmp_path / "2").mkdir()
    ns2 = make_ns(tmp_path / "2")
    for p in (a, b, c):
        p.busy, p.asked = True, []
    sender = sender_for(ns2, Cluster(a, b, c))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns2, "g")
        ns2.files.write(ino, fd, 0, os.urandom(10_000))
        await sender.replicated(ino)
        assert list(sender.channels) == ["a"] and a.asked == [False, True] and b.asked == [False] and c.asked == [False]
        assert sender.degraded_writes == 0 and sender.is_replicated(ino)
        close(ns2, ino, fd)
        nursery.cancel_scope.cancel()


class Listing:
    """The holders our record lists (holders.HolderListing as the sender sees it): written when `write` says."""

    def __init__(self) -> None:
        self.listed: frozenset[str] = frozenset()
        self.asked: list[list[str]] = []
        self.writes = True

    def ask(self, nodes: list[str]) -> None:
        self.asked.append(list(nodes))
        if self.writes:
            self.listed = frozenset(nodes)


@trio_test
async def test_a_holder_counts_only_once_our_record_lists_it_and_a_replaced_one_is_dropped_from_the_list(tmp_path: Path) -> None:
    """holders.py: a copy counts only on a node that may claim this one, and the holder the owner stopped sending to
    (a, failing) leaves the list when the next (b) joins it, not before."""
    ns = make_ns(tmp_path)
    a, b = FakePeer("a"), FakePeer("b")
    listing = Listing()
    sender = sender_for(ns, Cluster(a, b), peer_timeout=0.5)
    sender.listed, sender.ask_listing = lambda: listing.listed, listing.ask
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, b"first")
        await sender.replicated(ino)
        assert listing.asked == [["a"]] and sender.is_replicated(ino) and sender.degraded_writes == 0
        a.fail_at = "write"
        listing.writes = False  # the record cannot be written (the store is cut): b's copy does not count
        ns.files.write(ino, fd, 0, b"second")
        await sender.replicated(ino)  # held by b after peer_timeout, but not listed: acknowledged single-copy
        assert "a" not in sender.channels and b.replicas[ino].sealed is not None
        assert listing.listed == {"a"} and listing.asked[-1] == ["b"]
        assert sender.degraded_writes == 1 and "does not list the peers holding it" in (sender.last_error or "")
        assert not sender.is_replicated(ino) and sender.single_copy()[0] == len(b"second")
        ns.tree.rename(ROOT_INODE, "f", ROOT_INODE, "g", False)
        await sender.names.replicated()  # b confirms the rename, unlisted: returns after peer_timeout, degraded
        assert b.replicas[ino].meta["key"] == "p/g" and sender.degraded_writes == 2
        listing.writes = True
        sender.notify()
        await wait_for(lambda: sender.is_replicated(ino))  # asked again (housekeeping), written: b counts
        assert listing.listed == {"b"}
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_connection_the_peer_closed_is_opened_again_at_once_not_degraded(tmp_path: Path) -> None:
    """The peer's listener restarted (its supervisor): the connection that worked is lost at the next write. The
    fsync waiting on it is not acknowledged single-copy: the same peer, the only candidate, is connected again
    at once (not rested for peer_timeout) and holds the file."""
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b), peer_timeout=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        first, ffd = create(ns, "first")
        ns.files.write(first, ffd, 0, b"f" * 3000)
        await sender.replicated(first)
        assert b.links == 1
        b.lose_at = "write"
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, os.urandom(50_000))
        await sender.replicated(ino)  # a rest would wait out peer_timeout, then degrade: counted below
        assert sender.degraded_writes == 0 and sender.is_replicated(ino)
        assert b.links == 2 and bytes(b.replicas[ino].data) == file_bytes(ns, ino)
        close(ns, first, ffd)
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_peer_that_does_not_answer_is_replaced_after_peer_timeout(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a, b = FakePeer("a"), FakePeer("b")
    a.hang_at = "seal"
    sender = sender_for(ns, Cluster(a, b), peer_timeout=0.3)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, b"z" * 70_000)
        await sender.replicated(ino)
        assert b.replicas[ino].sealed is not None and "a" not in sender.channels
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_files_whose_only_holder_went_silent_are_single_copy_until_the_next_candidate_holds_them(tmp_path: Path) -> None:
    """The holder stops answering while the channel is idle (its link's ping fails): from that moment its files are
    counted single-copy and not `replicated`; once another candidate is there they are sent to it, sealed, and
    `replicated` again."""
    ns = make_ns(tmp_path)
    a, b = FakePeer("a"), FakePeer("b")
    cluster = Cluster(a, b)
    cluster.down.add("b")  # not a candidate yet
    sender = sender_for(ns, cluster, peer_timeout=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        inos = []
        for name, size in (("s0", 70_000), ("s1", 5_000)):
            ino, fd = create(ns, name)
            ns.files.write(ino, fd, 0, os.urandom(size))
            close(ns, ino, fd)
            await sender.replicated(ino)
            inos.append(ino)
        assert all(sender.is_replicated(i) for i in inos) and sender.single_copy()[0] == 0
        a.silent.set()  # power lost on a: nothing more is answered
        await wait_for(lambda: "a" not in sender.channels)
        assert not any(sender.is_replicated(i) for i in inos)
        assert sender.single_copy()[0] == 75_000
        assert sender.channel_status() == {}
        cluster.down.discard("b")  # a candidate appears
        await wait_for(lambda: all(sender.is_replicated(i) for i in inos))
        assert sender.single_copy()[0] == 0 and list(sender.channels) == ["b"]
        for i in inos:
            assert bytes(b.replicas[i].data) == file_bytes(ns, i)
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_channel_to_a_node_whose_record_is_down_is_closed_and_its_files_go_to_the_next(tmp_path: Path) -> None:
    """The peer answers nothing and its record ran out: its channel is closed (not kept because nothing timed out),
    whatever it was waiting for, and the next candidate gets the files."""
    ns = make_ns(tmp_path)
    a, b = FakePeer("a"), FakePeer("b")
    cluster = Cluster(a, b)
    sender = sender_for(ns, cluster, peer_timeout=3600)  # no timeout would notice in the test's time
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, os.urandom(40_000))
        close(ns, ino, fd)
        await sender.replicated(ino)
        holder, other = (a, b) if "a" in sender.channels else (b, a)
        holder.hang_at = "seal"  # and the next seal waits for ever: a close cancels it too
        ino2, fd2 = create(ns, "g")
        ns.files.write(ino2, fd2, 0, os.urandom(9_000))
        close(ns, ino2, fd2)
        cluster.down.add(holder.node)
        cluster.records_down.add(holder.node)
        await wait_for(lambda: holder.node not in sender.channels)
        assert holder.closed == 1
        await sender.replicated(ino2)
        await wait_for(lambda: sender.is_replicated(ino))
        assert list(sender.channels) == [other.node] and sender.single_copy()[0] == 0
        assert bytes(other.replicas[ino].data) == file_bytes(ns, ino) and bytes(other.replicas[ino2].data) == file_bytes(ns, ino2)
        nursery.cancel_scope.cancel()


@trio_test
async def test_no_peer_degrade_counts_and_acknowledges(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ns = make_ns(tmp_path)
    a = FakePeer("a")
    a.fail_at = "open"
    sender = sender_for(ns, Cluster(a))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, b"alone")
        await sender.replicated(ino)
        await sender.replicated(ino)  # its fsync, then its close: one file acknowledged alone, counted once (issue 43)
        assert sender.degraded_writes == 1
        assert "acknowledged with 0 of 1 peer copies" in (sender.last_error or "") and sender.last_error_at
        assert not sender.is_replicated(ino)
        assert len([r for r in caplog.records if "single-copy" in r.getMessage()]) == 1  # once per file
        assert sender.single_copy()[0] == 5
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_node_mounted_first_waits_for_its_first_peer_rather_than_degrade(tmp_path: Path) -> None:
    """Issue 43: the first node mounted said `no peer known` for about 10 s after the others started (until its next
    read of the records), so a save right after start was acknowledged single-copy. In its first 2 x ttl an fsync
    that knows no peer reads the records (find_peers) and waits up to peer_timeout for one."""
    ns = make_ns(tmp_path)
    late = FakePeer("b")
    cluster = Cluster()
    sender = sender_for(ns, cluster, peer_lease_ttl=30.0, peer_timeout=30.0)
    looked = []

    async def find_peers() -> None:  # the records read now: the second read finds b, mounted meanwhile
        looked.append(1)
        if len(looked) == 2:
            cluster.peers["b"] = late

    sender.find_peers = find_peers
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, b"saved at start")
        await sender.replicated(ino)
        assert sender.degraded_writes == 0 and sender.is_replicated(ino) and len(looked) == 2
        assert bytes(late.replicas[ino].data) == b"saved at start"
        # once a peer was reached, a node that finds none again degrades at once, as before
        del cluster.peers["b"]
        late.silent.set()
        await wait_for(lambda: "b" not in sender.channels)
        ino2, fd2 = create(ns, "g")
        ns.files.write(ino2, fd2, 0, b"later")
        await sender.replicated(ino2)
        assert sender.degraded_writes == 1 and len(looked) == 2
        close(ns, ino, fd)
        close(ns, ino2, fd2)
        nursery.cancel_scope.cancel()


@trio_test
async def test_no_peer_fail_answers_eio_logs_it_once_and_says_it_in_status(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 43: with on_no_peer = fail and no peer, fsync and close got EIO, but the log had no line and status said
    `errors none`."""
    ns = make_ns(tmp_path)
    sender = sender_for(ns, Cluster(), on_no_peer="fail")
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, b"alone")
        for _ in range(2):  # its fsync, then its close
            with pytest.raises(OSError) as e:
                await sender.replicated(ino)
            assert e.value.errno == errno.EIO and "on_no_peer = fail" in str(e.value)
        assert sender.refused_writes == 2 and sender.degraded_writes == 0
        assert "refused (EIO)" in (sender.last_error or "") and "on_no_peer = fail" in (sender.last_error or "")
        lines = [r for r in caplog.records if r.levelname == "ERROR" and "refused (EIO)" in r.getMessage()]
        assert len(lines) == 1, caplog.text  # once per file
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_two_replicas_need_two_peers(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a, b, c = FakePeer("a"), FakePeer("b"), FakePeer("c")
    b.fail_at = "seal"
    sender = sender_for(ns, Cluster(a, b, c), peer_replicas=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "f")
        ns.files.write(ino, fd, 0, b"twice")
        await sender.replicated(ino)
        assert {p.node for p in (a, b, c) if ino in p.replicas and p.replicas[ino].sealed} == {"a", "c"}
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_after_a_restart_what_peers_hold_sealed_is_not_sent_again(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    cluster = Cluster(b)
    sender = sender_for(ns, cluster)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "kept")
        ns.files.write(ino, fd, 0, os.urandom(50_000))
        close(ns, ino, fd)
        other, ofd = create(ns, "changed")
        ns.files.write(other, ofd, 0, b"v1")
        close(ns, other, ofd)
        await sender.replicated(ino)
        await sender.replicated(other)
        nursery.cancel_scope.cancel()
    ns.journal.close()
    # the daemon restarts on the same cache directory; one file changed while the peer was not told
    ns = make_ns(tmp_path)
    fd = ns.files.open(other, write=True)
    ns.files.write(other, fd, 0, b"v2!")
    close(ns, other, fd)
    written = b.written
    sender = sender_for(ns, cluster)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        await sender.replicated(ino)
        await sender.replicated(other)
        assert sender.is_replicated(ino) and sender.is_replicated(other)
        assert b.written - written == 3  # only the changed file's bytes went again
        assert bytes(b.replicas[other].data) == b"v2!"
        nursery.cancel_scope.cancel()


@trio_test
async def test_bandwidth_cap_spaces_the_bytes() -> None:
    now = [0.0]
    bucket = TokenBucket(1000, clock=lambda: now[0])
    await bucket.take(1000)  # a second of burst
    with trio.move_on_after(0.05) as waited:
        await bucket.take(10)  # nothing left until time passes
    assert waited.cancelled_caught
    now[0] += 0.5
    await bucket.take(10)
    assert TokenBucket(0).rate == 0  # no cap
    await TokenBucket(0).take(1 << 40)


@trio_test
async def test_queued_deletes_reach_the_peer_in_order_and_are_retired(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "old.pt")
        ns.files.write(ino, fd, 0, b"bytes")
        close(ns, ino, fd)
        ticket = ns.uploads.begin_upload(ino)
        assert ticket is not None and ns.uploads.finish_upload(ticket, "etag", "h")
        ns.tree.unlink(ROOT_INODE, "old.pt")  # a durable file removed: its object's delete is queued
        await wait_for(lambda: list(b.deletes.values()) == ["p/old.pt"])
        (delete_id, key), = ns.uploads.ready_deletes(set())
        assert b.etags[delete_id] == "etag"  # the object the owner deleted: a takeover's delete is conditional on it
        ns.uploads.delete_done(delete_id, key)  # the drain deleted it
        await wait_for(lambda: not b.deletes, timeout=10)
        nursery.cancel_scope.cancel()


@trio_test
async def test_passthrough_writes_are_polled_and_a_close_without_new_bytes_needs_no_new_seal(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    writing: set[int] = set()
    sender.passthrough_inos = lambda: list(writing)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "pt.bin")
        writing.add(ino)
        ns.files.changed_behind(ino, None, None)  # fs.py: a passthrough writer opened it
        data = os.urandom(200_000)
        os.pwrite(fd, data, 0)  # the kernel writes the cache file itself: no callback
        await wait_for(lambda: ino in b.replicas and len(b.replicas[ino].data) == len(data))  # the size poll streamed it
        st = os.fstat(fd)
        ns.files.changed_behind(ino, st.st_size, st.st_mtime_ns)  # fs.py at fsync/FLUSH
        await sender.replicated(ino)
        assert sender.is_replicated(ino) and bytes(b.replicas[ino].data) == data
        ns.files.changed_behind(ino, st.st_size, st.st_mtime_ns + 1)  # a new version counted, no byte changed
        assert sender.is_replicated(ino)
        time.sleep(0.05)  # past the coarse clock's tick, so the rewrite gets a new mtime
        os.pwrite(fd, b"X" * 10, 100)  # rewritten in place by the kernel: same size, no callback
        assert not sender.is_replicated(ino)  # its state no longer says replicated
        st = os.fstat(fd)
        ns.files.changed_behind(ino, st.st_size, st.st_mtime_ns)
        await sender.replicated(ino)  # the peer's copy differs at the seal: sent again whole
        assert bytes(b.replicas[ino].data) == file_bytes(ns, ino)
        writing.discard(ino)
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_rewrite_in_place_within_the_mtime_tick_of_the_seal_is_sealed_again_on_a_coarse_clock(tmp_path: Path) -> None:
    """Issue 42 case 10: on a kernel whose mtimes come from a coarse clock (before multigrain timestamps), a passthrough
    rewrite in place of the same size within the tick of the seal's hash leaves size and mtime unchanged. A version
    counted afterwards (fs.py: the recorded mtime was too young to prove anything) must be sealed again, not taken
    as the bytes the peer holds."""
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    sender.digests.fine_mtimes = False  # as on Linux before 6.13 (this machine's kernel gives fine mtimes after a stat)
    writing: set[int] = set()
    sender.passthrough_inos = lambda: list(writing)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "pt.bin")
        writing.add(ino)
        ns.files.changed_behind(ino, None, None)
        os.pwrite(fd, os.urandom(100_000), 0)
        st = os.fstat(fd)
        ns.files.changed_behind(ino, st.st_size, st.st_mtime_ns)  # fs.py at fsync
        await sender.replicated(ino)
        assert sender.is_replicated(ino)
        os.pwrite(fd, b"rewritten", 500)  # the kernel rewrites in place, same size ...
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... within the same coarse tick: the mtime as it was
        ns.files.changed_behind(ino, st.st_size, st.st_mtime_ns + 1)  # fs.py at close: a new version (mtime too young)
        assert not sender.is_replicated(ino)  # the peer's sealed copy is not proven to hold these bytes
        await sender.replicated(ino)
        assert bytes(b.replicas[ino].data) == file_bytes(ns, ino)
        writing.discard(ino)
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


def test_this_kernel_is_probed_for_fine_mtimes(tmp_path: Path) -> None:
    """The probe leaves nothing in the directory it is given; where it cannot tell, it assumes the coarse clock."""
    from ckptfs.cache import mtimes_change_after_stat

    mtimes_change_after_stat(tmp_path)
    assert mtimes_change_after_stat(tmp_path / "missing") is False  # cannot tell: the coarse clock assumed
    assert list(tmp_path.iterdir()) == []


@trio_test
async def test_a_file_made_by_mknod_is_replicated(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        row = ns.tree.create(ROOT_INODE, "COMMIT", 0o644, 0, 0, closed=True)
        await wait_for(lambda: sender.is_replicated(row.ino))
        assert b.replicas[row.ino].meta["key"] == "p/COMMIT"
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_version_counted_without_a_byte_changed_keeps_the_peers_copy_sealed(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "x.tmp")
        ns.files.write(ino, fd, 0, b"shard")
        close(ns, ino, fd)
        await sender.replicated(ino)
        sealed, written = b.replicas[ino].sealed, b.written
        ns.files.abandon_upload(ino)  # a new version, no byte changed (as a passthrough writer's close counts one)
        ns.tree.rename(ROOT_INODE, "x.tmp", ROOT_INODE, "x", False)  # the entry goes again, under its new key
        await wait_for(lambda: b.replicas[ino].meta["key"] == "p/x")
        await sender.replicated(ino)
        # still sealed at the version the peer checked: a survivor uploads it under x (an entry of the new version
        # would have unsealed it, and a takeover skips an unsealed replica as never acknowledged)
        assert b.replicas[ino].sealed == sealed and b.written == written
        assert sender.is_replicated(ino)
        nursery.cancel_scope.cancel()


@trio_test
async def test_repeated_fsyncs_of_a_growing_file_seal_the_right_bytes(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "log.bin")
        size = 0
        with trio.fail_after(30):  # a seal that never matched would send the file again and again
            for i in range(5):  # append and fsync, as a writer that fsyncs every few MiB does
                chunk = os.urandom(300_000 + i)
                ns.files.write(ino, fd, size, chunk)
                size += len(chunk)
                await sender.replicated(ino)
            ns.files.write(ino, fd, 5, b"rewritten")  # below what was hashed: the next seal hashes from byte 0
            await sender.replicated(ino)
            ns.files.truncate(ino, size - 1000)
            ns.files.write(ino, fd, size - 1000, b"end")
            await sender.replicated(ino)
        assert b.mismatches == 0 and b.written == size + len(b"rewritten") + len(b"end")  # nothing sent twice
        assert bytes(b.replicas[ino].data) == file_bytes(ns, ino)
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


@trio_test
async def test_files_written_at_once_are_sealed_at_once_and_their_waiters_do_not_wake_each_other(tmp_path: Path) -> None:
    """Four fsyncs waiting at once on a peer slow to seal: every seal is asked of the peer before any is answered
    (a pump that sealed one file after another made each fsync wait for the others' seals), and the waiters sleep
    while nothing changes (two waiters that woke each other at every wake spun the event loop for as long as they
    waited: the sender's CPU doubled with 4 writers)."""
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    b.hang_at = "seal"
    sender = sender_for(ns, Cluster(b), peer_timeout=30.0)
    wakes = 0
    notify = sender.notify

    def counting() -> None:
        nonlocal wakes
        wakes += 1
        notify()

    sender.notify = counting  # type: ignore[method-assign]
    asked: list[int] = []
    seal = FakeLink.seal

    async def slow_seal(self: FakeLink, ino: int, version: int, size: int, xxh3: str) -> None:
        asked.append(ino)
        await seal(self, ino, version, size, xxh3)

    FakeLink.seal = slow_seal  # type: ignore[method-assign]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sender.run)
            files = [create(ns, f"w{i}.bin") for i in range(4)]
            for ino, fd in files:
                ns.files.write(ino, fd, 0, os.urandom(1 << 20))
            for ino, _ in files:
                nursery.start_soon(sender.replicated, ino)
            await wait_for(lambda: sorted(asked) == sorted(ino for ino, _ in files))
            # nothing changes meanwhile (the peer holds every seal): every task comes to rest. Waiters that woke each
            # other would keep one runnable for ever, and this would not return (the guard is for a hang, not a bound)
            with trio.fail_after(120):
                await trio.testing.wait_all_tasks_blocked()
            before = wakes
            await trio.sleep(0.2)  # the sender's own loop goes round a few times
            with trio.fail_after(120):
                await trio.testing.wait_all_tasks_blocked()  # and all is at rest again, no waiter woken meanwhile
            assert wakes == before, f"{wakes - before} wakes of the fsync waiters while nothing changed"
            # at rest while the seals still wait on the peer (a pump that woke itself at every look at the seals it
            # waits for came to rest only once peer_timeout failed the channel)
            assert "b" in sender.channels and not sender.channels["b"].failed
            assert not any(sender.is_replicated(ino) for ino, _ in files)
            for ino, fd in files:
                close(ns, ino, fd)
            nursery.cancel_scope.cancel()
    finally:
        FakeLink.seal = seal  # type: ignore[method-assign]


@trio_test
async def test_bytes_streamed_in_order_are_hashed_as_they_go_and_a_rewrite_below_them_is_hashed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copy mode (every write reported): what was sent in order is hashed as it goes, so the seal at the fsync
    hashes only the bytes after it; a write below what was hashed throws that away, and the seal's xxh3 is the
    file's (the peer finds no mismatch)."""
    import ckptfs.peers.digests as sender_module

    hashed: list[tuple[int, int]] = []
    hash_range = sender_module.hash_range

    def recording(h: Any, fd: int, start: int, end: int) -> int:
        hashed.append((start, end))
        return hash_range(h, fd, start, end)

    monkeypatch.setattr(sender_module, "hash_range", recording)
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "shard.pt")
        body = os.urandom(3 << 20)
        ns.files.write(ino, fd, 0, body)
        # sent, then hashed (and the hash kept: `(0, len(body)) in hashed` alone is true while the thread still runs)
        await wait_for(lambda: (0, len(body)) in hashed and sender.digests.prefix.get(ino, (0, None))[0] == len(body))
        ns.files.write(ino, fd, len(body), b"tail")
        hashed.clear()
        await sender.replicated(ino)
        assert hashed and all(start >= len(body) for start, _ in hashed), hashed  # only the tail, hashed again
        assert b.replicas[ino].sealed[2] == xxhash.xxh3_128_hexdigest(file_bytes(ns, ino))

        ns.files.write(ino, fd, 100, b"rewritten below what was hashed")
        ns.files.write(ino, fd, len(body) + 4, b"more")
        await sender.replicated(ino)
        assert b.replicas[ino].sealed[2] == xxhash.xxh3_128_hexdigest(file_bytes(ns, ino))
        assert b.mismatches == 0
        close(ns, ino, fd)
        nursery.cancel_scope.cancel()


def test_a_refused_connection_is_tried_again_until_the_deadline_a_refused_handshake_is_not() -> None:
    """A peer's listener restarting refuses connections for a moment (its supervisor waits 0.5 s and more): the
    channel tries again within peer_timeout rather than resting the peer, which would acknowledge the waiting
    fsyncs single-copy. A handshake the peer refused (another secret) is an answer: not tried again."""
    from ckptfs.peers.link import PeerError, PeerUnreachable
    from ckptfs.peers.sender import connect

    calls: list[str] = []

    async def refused_twice(node: str, addr: str) -> Any:
        calls.append(node)
        if len(calls) < 3:
            raise PeerUnreachable(f"peer {node} at {addr} cannot be reached: Connection refused")
        return "link"

    async def wrong_secret(node: str, addr: str) -> Any:
        calls.append(node)
        raise PeerError(f"peer {node} at {addr} refused the connection during the handshake")

    async def main() -> None:
        with trio.fail_after(10):
            assert await connect(refused_twice, "b", "127.0.0.1:1") == "link"
        assert calls == ["b", "b", "b"]
        calls.clear()
        with pytest.raises(PeerError, match="handshake"):
            await connect(wrong_secret, "b", "127.0.0.1:1")
        assert calls == ["b"]

    trio.run(main)


@trio_test
async def test_a_durable_file_renamed_reaches_the_peer_sealed_before_the_rename_returns(tmp_path: Path) -> None:
    """Issue 42, case 1: what `rename` awaits (`names.replicated`) returns once the peer holds the renamed durable
    file's entry, sealed (its bytes are the bucket's, under the old key), and then the delete of the old key, naming
    the file it waits for; the file counts as replicated, not single-copy."""
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "w.tmp")
        ns.files.write(ino, fd, 0, b"weights")
        close(ns, ino, fd)
        ticket = ns.uploads.begin_upload(ino)
        digest = xxhash.xxh3_128_hexdigest(b"weights")
        assert ticket is not None and ns.uploads.finish_upload(ticket, "etag", digest)  # durable under p/w.tmp
        await wait_for(lambda: ino not in b.replicas)  # forgotten once durable
        b.frames.clear()
        ns.tree.rename(ROOT_INODE, "w.tmp", ROOT_INODE, "w.pt", False)
        await sender.names.replicated()  # what the FUSE rename awaits
        r = b.replicas[ino]
        assert (r.meta["key"], r.meta["copy_from"]) == ("p/w.pt", "p/w.tmp")
        assert r.sealed == (ns.files.live[ino].version, 7, digest)
        [(delete_id, key)] = list(b.deletes.items())
        assert key == "p/w.tmp" and b.after[delete_id] == ino
        assert b.frames == [("entry", ino), ("delete", "p/w.tmp"), ("barrier", None)], b.frames
        assert sender.is_replicated(ino) and sender.single_copy() == (0, 0.0)
        await sender.names.replicated()  # nothing new: no round trip
        assert b.frames.count(("barrier", None)) == 1
        nursery.cancel_scope.cancel()


@trio_test
async def test_an_unlink_returns_once_the_peer_forgot_the_file(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "gone.pt")
        ns.files.write(ino, fd, 0, b"bytes")
        close(ns, ino, fd)
        await sender.replicated(ino)
        ns.tree.unlink(ROOT_INODE, "gone.pt")
        await sender.names.replicated()
        assert ino not in b.replicas and (ino, None) in b.forgotten
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_rename_with_no_peer_returns_degraded_even_under_on_no_peer_fail(tmp_path: Path) -> None:
    """The rename is applied on this node already: an EIO would tell the writer it failed. Counted as degraded."""
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    cluster = Cluster(b)
    cluster.down.add("b")
    sender = sender_for(ns, cluster, on_no_peer="fail")
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        ino, fd = create(ns, "w.tmp")
        ns.files.write(ino, fd, 0, b"weights")
        close(ns, ino, fd)
        ns.tree.rename(ROOT_INODE, "w.tmp", ROOT_INODE, "w.pt", False)
        await sender.names.replicated()
        assert sender.degraded_writes == 1
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_rename_goes_ahead_of_another_files_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rename waits for its own entry and one barrier, not for the bytes another writer is streaming (the pump
    sends name changes before each chunk): it returns while most of the other file is still to be sent."""
    import ckptfs.peers.channel as channel_module

    monkeypatch.setattr(channel_module, "CHUNK", 64 << 10)
    ns = make_ns(tmp_path)
    b = FakePeer("b")
    write = FakeLink.write
    size = 1 << 20
    slow_inos: set[int] = set()

    async def slow(self: FakeLink, ino: int, fd: int, offset: int, length: int) -> None:
        await write(self, ino, fd, offset, length)
        if ino in slow_inos:
            await trio.sleep(0.05)  # a slow network: 16 chunks of the big file take a while

    monkeypatch.setattr(FakeLink, "write", slow)
    sender = sender_for(ns, Cluster(b))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        small, sfd = create(ns, "w.tmp")
        ns.files.write(small, sfd, 0, b"weights")
        close(ns, small, sfd)
        await sender.replicated(small)
        big, bfd = create(ns, "big.pt")
        slow_inos.add(big)
        ns.files.write(big, bfd, 0, os.urandom(size))
        await wait_for(lambda: big in b.replicas and len(b.replicas[big].data) > 0)
        ns.tree.rename(ROOT_INODE, "w.tmp", ROOT_INODE, "w.pt", False)
        await sender.names.replicated()
        assert b.replicas[small].meta["key"] == "p/w.pt"
        assert len(b.replicas[big].data) < size, "the rename waited for the other file's bytes"
        await sender.replicated(big)
        close(ns, big, bfd)
        nursery.cancel_scope.cancel()
