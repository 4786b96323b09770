"""The peer transport (issue 36): the handshake, the frames' MACs, and a real Listener and PeerLink over loopback
moving a file from a tmpfs cache file into a ReplicaStore."""

from __future__ import annotations

import functools
import os
import socket
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Awaitable, Callable

import pytest
import trio
import trio.testing
import xxhash

from ckptfs.peers.link import PeerBusy, PeerError, PeerFull, PeerLink, SealMismatch
from ckptfs.peers.listener import Listener
from ckptfs.peers.replicas import ReplicaStore
from ckptfs.peering import PeerOptionError
from ckptfs.peers.wire import Kind, Reader, Session, WireError, client_handshake, server_handshake

SECRET = b"s" * 40
OTHER_SECRET = b"t" * 40
MiB = 1 << 20


def config(**over: Any) -> SimpleNamespace:
    values = {"peer_addr": "127.0.0.1:0", "peer_timeout": 10.0, "peer_capacity": 0, "cache_min_free": 0}
    values.update(over)
    return SimpleNamespace(**values)


@pytest.fixture
def shm() -> Any:
    """Files on tmpfs (/dev/shm when there is one): the cache file and the peer's cache directory."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as d:
        yield Path(d)


def entry_meta(key: str, version: int, size: int, seq: int = 1, **over: Any) -> dict[str, Any]:
    meta = {"key": key, "version": version, "size": size, "copy_from": None, "marker": False, "seq": seq,
            "mtime": 1.0, "checkpoint": None}
    meta.update(over)
    return meta


def with_listener(cfg: SimpleNamespace, cache_dir: Path, body: Callable[[Listener, str], Awaitable[None]],
                  secret: bytes | list[bytes] = SECRET) -> None:
    async def main() -> None:
        store = ReplicaStore(cfg, str(cache_dir))
        try:
            listener = Listener(cfg, store, secret, "node-b")
            async with trio.open_nursery() as nursery:
                port = await nursery.start(listener.run)
                with trio.fail_after(120):
                    await body(listener, f"127.0.0.1:{port}")
                nursery.cancel_scope.cancel()
        finally:
            store.close()
    trio.run(main)


async def wait_for(condition: Callable[[], bool]) -> None:
    with trio.fail_after(30):
        while not condition():
            await trio.sleep(0.02)


# -- the handshake and the frames ------------------------------------------------------------------------

async def _pair() -> tuple[trio.abc.Stream, trio.abc.Stream]:
    return trio.testing.memory_stream_pair()


def test_the_handshake_gives_both_ends_the_same_session_and_frames_pass() -> None:
    async def main() -> None:
        c, s = await _pair()
        out: dict[str, Session] = {}

        async def server() -> None:
            out["s"] = await server_handshake(s, Reader(s), SECRET, "node-b")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server)
            out["c"] = await client_handshake(c, Reader(c), SECRET, "node-a", "inc1", "node-b")
        assert out["s"].peer == "node-a" and out["s"].peer_incarnation == "inc1" and out["c"].peer == "node-b"
        assert out["s"].key == out["c"].key
        await c.send_all(out["c"].encode(Kind.ENTRY, {"ino": 5}))
        frame = await out["s"].receive(Reader(s))
        assert frame.kind is Kind.ENTRY and frame.meta == {"ino": 5}
    trio.run(main)


def test_a_client_with_the_wrong_secret_is_refused_by_the_server() -> None:
    async def main() -> None:
        c, s = await _pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: client_handshake(c, Reader(c), OTHER_SECRET, "node-a", "i", None))
            with pytest.raises(WireError, match="did not prove the shared secret"):
                await server_handshake(s, Reader(s), SECRET, "node-b")
            nursery.cancel_scope.cancel()
    trio.run(main)


def test_a_server_with_the_wrong_secret_is_refused_by_the_client() -> None:
    """A server that does not know the secret (it skips checking the client) cannot prove it back."""
    async def fake_server(s: trio.abc.Stream) -> None:
        await server_handshake(s, Reader(s), OTHER_SECRET, "node-b")

    async def main() -> None:
        c, s = await _pair()
        async with trio.open_nursery() as nursery:
            # the fake server refuses the client's proof: make it answer anyway with its own (wrong) one
            import ckptfs.peers.wire as wire
            real = wire.hmac.compare_digest
            calls = {"n": 0}

            def lenient(a: bytes, b: bytes) -> bool:
                calls["n"] += 1
                return True if calls["n"] == 1 else real(a, b)  # the server's check passes, the client's is real
            wire.hmac.compare_digest = lenient  # type: ignore[assignment]
            try:
                nursery.start_soon(fake_server, s)
                with pytest.raises(WireError, match="did not prove the shared secret"):
                    await client_handshake(c, Reader(c), SECRET, "node-a", "i", "node-b")
            finally:
                wire.hmac.compare_digest = real  # type: ignore[assignment]
            nursery.cancel_scope.cancel()
    trio.run(main)


class _Recorder(trio.abc.Stream):
    """A stream that records what is sent on it."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner, self.sent = inner, bytearray()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sent += data
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_replayed_handshake_is_refused() -> None:
    async def main() -> None:
        c, s = await _pair()
        recorder = _Recorder(c)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: server_handshake(s, Reader(s), SECRET, "node-b"))
            await client_handshake(recorder, Reader(recorder), SECRET, "node-a", "i", "node-b")
        recorded = bytes(recorder.sent)
        # an eavesdropper replays the client's bytes to a new connection: the new challenge is not the one proven
        c2, s2 = await _pair()
        await c2.send_all(recorded)
        with pytest.raises(WireError, match="did not prove"):
            await server_handshake(s2, Reader(s2), SECRET, "node-b")
    trio.run(main)


def test_a_tampered_replayed_or_foreign_frame_is_refused() -> None:
    key = os.urandom(32)
    sender = Session(key, is_server=False, peer="node-b")

    async def receive(raw: bytes, session: Session) -> Any:
        c, s = await _pair()
        await c.send_all(raw)
        return await session.receive(Reader(s))

    async def main() -> None:
        good = sender.encode(Kind.ENTRY, {"ino": 5, "meta": {"key": "a"}})
        tampered = bytearray(good)
        tampered[good.index(b'"a"') + 1] = ord("b")
        with pytest.raises(WireError, match="wrong MAC"):
            await receive(bytes(tampered), Session(key, is_server=True, peer="node-a"))
        receiver = Session(key, is_server=True, peer="node-a")
        assert (await receive(good, receiver)).meta["ino"] == 5
        with pytest.raises(WireError, match="wrong MAC"):  # the same frame again: its number is past
            await receive(good, receiver)
        with pytest.raises(WireError, match="wrong MAC"):  # another session's key
            await receive(good, Session(os.urandom(32), is_server=True, peer="node-a"))
        with pytest.raises(WireError, match="wrong MAC"):  # reflected back to the client that sent it
            await receive(good, Session(key, is_server=False, peer="node-a"))
    trio.run(main)


# -- the listener under clients that are not peers ---------------------------------------------------------

def test_the_listener_refuses_the_wrong_secret_garbage_and_silence_and_still_serves(shm: Path) -> None:
    cfg = config(peer_timeout=2.0)

    async def body(listener: Listener, addr: str) -> None:
        with pytest.raises(PeerError, match="refused the connection during the handshake"):
            await PeerLink.open(config(), "node-a", "i", "node-b", addr, OTHER_SECRET)
        await wait_for(lambda: listener.refused_connections == 1)
        garbage = await trio.open_tcp_stream("127.0.0.1", listener.port)
        await garbage.send_all(b"GET / HTTP/1.1\r\n\r\n" + os.urandom(4000))
        await wait_for(lambda: listener.refused_connections == 2)
        await garbage.aclose()
        silent = await trio.open_tcp_stream("127.0.0.1", listener.port)  # never says a word: peer_timeout
        await wait_for(lambda: listener.refused_connections == 3)
        assert await silent.receive_some(1 << 16)  # the challenge, and then the end: nothing else
        assert await silent.receive_some(1 << 16) == b""
        await silent.aclose()
        with pytest.raises(PeerError, match="is node 'node-b', not 'node-c'"):
            await PeerLink.open(config(), "node-a", "i", "node-c", addr, SECRET)
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        assert await link.holdings() == {}
        await link.aclose()
        assert listener.accepted_connections == 2 and listener.dropped_connections == 0

    (shm / "b").mkdir()
    with_listener(cfg, shm / "b", body)


def test_during_a_rotation_the_listener_takes_either_secret_and_proves_the_one_used(shm: Path) -> None:
    """Issue 43: rotation without an outage. A listener given the new and the previous secret authenticates a node
    that has only the old one and a node that has the new one (each session under the secret it proved); any other
    secret is refused."""
    new = b"n" * 48

    async def body(listener: Listener, addr: str) -> None:
        for secret in (new, SECRET):
            link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, secret)
            await link.barrier()  # frames MACed under the session of the secret it proved: accepted
            await link.aclose()
        with pytest.raises(PeerError, match="peer_secret_file"):
            await PeerLink.open(config(), "node-a", "i", "node-b", addr, OTHER_SECRET)
        assert listener.accepted_connections == 2 and listener.refused_connections == 1

    (shm / "b").mkdir()
    with_listener(config(), shm / "b", body, secret=[new, SECRET])


async def _relay(listen_port: int, to_port: int, captured: bytearray, flip_at: int | None,
                 task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A TCP proxy in front of the listener that keeps what the owner sends (and flips its byte `flip_at`, once)."""
    async def handle(client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream("127.0.0.1", to_port)

        async def up() -> None:
            try:
                while chunk := await client.receive_some(1 << 16):
                    start = len(captured)
                    captured.extend(chunk)
                    if flip_at is not None and start <= flip_at < len(captured) and not _relay.flipped:  # type: ignore[attr-defined]
                        _relay.flipped = True  # type: ignore[attr-defined]
                        chunk = bytearray(chunk)
                        chunk[flip_at - start] ^= 0x01
                    await server.send_all(bytes(chunk))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            await server.aclose()
            await client.aclose()

        async def down() -> None:
            try:
                while chunk := await server.receive_some(1 << 16):
                    await client.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            await client.aclose()
            await server.aclose()

        async with trio.open_nursery() as nursery:  # either side gone: both closed, the relay goes on serving
            nursery.start_soon(up)
            nursery.start_soon(down)

    listeners = await trio.open_tcp_listeners(listen_port, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


@pytest.mark.parametrize("encryption", ["none", "aes-gcm"])
def test_what_crosses_the_wire_with_and_without_peer_encryption(shm: Path, encryption: str) -> None:
    """Issue 43: with peer_encryption = aes-gcm nothing of the file crosses the wire readable (a proxy captures the
    stream and greps it for a pattern of the file); without it the pattern is there. Either way the replica is the
    owner's bytes, sealed with both digests."""
    from ckptfs.peers.sealhash import seal_digest

    data = b"CHECKPOINT-PATTERN-0123456789" * 80000 + os.urandom(3 * MiB)  # ~5 MiB: several AES-GCM chunks
    src = shm / "src"
    src.write_bytes(data)
    captured = bytearray()
    cfg = config(peer_encryption=encryption)

    async def body(listener: Listener, addr: str) -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_relay, 0, listener.port, captured, None)
            link = await PeerLink.open(cfg, "node-a", "i", "node-b", f"127.0.0.1:{port}", SECRET)
            fd = os.open(src, os.O_RDONLY)
            try:
                await link.entry(5, entry_meta("k", 1, len(data)))
                await link.write(5, fd, 0, len(data))
                await link.seal(5, 1, len(data), seal_digest(data))
            finally:
                os.close(fd)
            await link.aclose()
            nursery.cancel_scope.cancel()
        entry = listener.store.entries("node-a")[0]
        assert entry.sealed and Path(entry.path).read_bytes() == data

    (shm / "b").mkdir()
    with_listener(cfg, shm / "b", body)
    assert len(captured) > len(data)
    assert (b"CHECKPOINT-PATTERN" in captured) == (encryption == "none")


def test_a_data_byte_flipped_on_the_wire_is_refused_and_the_owner_sends_again(shm: Path) -> None:
    """Issue 43's tampering test: one byte of a WRITE frame's data flipped by a proxy. In clear the seal refuses the
    copy (its digests differ) and the owner sends the file again whole; encrypted, the chunk fails its tag and the
    connection drops before a byte of it is written. Nothing altered is ever sealed."""
    from ckptfs.peers.sealhash import seal_digest

    data = os.urandom(2 * MiB)
    src = shm / "src"
    src.write_bytes(data)
    for encryption in ("none", "aes-gcm"):
        captured = bytearray()
        _relay.flipped = False  # type: ignore[attr-defined]
        cfg = config(peer_encryption=encryption)

        async def body(listener: Listener, addr: str) -> None:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(_relay, 0, listener.port, captured, 1 * MiB)  # well inside the data
                fd = os.open(src, os.O_RDONLY)
                try:
                    link = await PeerLink.open(cfg, "node-a", "i", "node-b", f"127.0.0.1:{port}", SECRET)
                    await link.entry(5, entry_meta("k", 1, len(data)))
                    with pytest.raises((SealMismatch, PeerError)):  # encrypted: dropped while the data is still sent
                        await link.write(5, fd, 0, len(data))
                        await link.seal(5, 1, len(data), seal_digest(data))
                    await link.aclose()
                    assert not [e for e in listener.store.entries("node-a") if e.sealed]
                    link = await PeerLink.open(cfg, "node-a", "i", "node-b", f"127.0.0.1:{port}", SECRET)  # sent again
                    await link.entry(5, entry_meta("k", 1, len(data)))
                    await link.write(5, fd, 0, len(data))
                    await link.seal(5, 1, len(data), seal_digest(data))
                    await link.aclose()
                finally:
                    os.close(fd)
                nursery.cancel_scope.cancel()
            entry = listener.store.entries("node-a")[0]
            assert entry.sealed and Path(entry.path).read_bytes() == data

        d = shm / f"b-{encryption}"
        d.mkdir()
        with_listener(cfg, d, body)
        assert _relay.flipped  # type: ignore[attr-defined]


def test_nodes_with_different_peer_encryption_refuse_each_other_naming_the_option(shm: Path) -> None:
    async def body(listener: Listener, addr: str) -> None:
        with pytest.raises(PeerError, match="peer_encryption differs: none on this node, aes-gcm on the peer"):
            await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        await wait_for(lambda: listener.refused_connections == 1)

    (shm / "b").mkdir()
    with_listener(config(peer_encryption="aes-gcm"), shm / "b", body)


def test_keys_outside_the_mounts_prefix_are_refused_and_counted(shm: Path) -> None:
    """Issue 43: keys in ENTRY and DELETE frames (a takeover writes or deletes them) confined to the mount's prefix:
    another prefix's key, a node record, a path climbing out: the frame is refused, the connection dropped, counted."""
    from ckptfs.peers.listener import confined

    assert confined("ckpt/run/step_1/a.pt", "ckpt") and confined("ckpt/run/", "ckpt/") and confined("x/y", "")
    for key in ("other/run/a.pt", "ckpt", "ckpt/", "ckptx/a", "ckpt/.ckptfs/nodes/a.json", "ckpt/run/../../x",
                "ckpt//a", ".ckptfs/nodes/a.json"):
        assert not confined(key, "ckpt"), key
    assert not confined(".ckptfs/nodes/a.json", "")

    async def body(listener: Listener, addr: str) -> None:
        for i, send in enumerate((lambda link: link.entry(1, entry_meta("other/step_1/a.pt", 1, 0)),
                                  lambda link: link.entry(2, entry_meta("ckpt/a.pt", 1, 0, copy_from="ckpt/.ckptfs/nodes/b.json")),
                                  lambda link: link.delete(3, "ckpt/.ckptfs/nodes/b.json", 1))):
            link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
            await send(link)
            with pytest.raises(PeerError):
                await link.barrier()
            await link.aclose()
            assert listener.keys_refused == i + 1
        assert listener.store.entries("node-a") == [] and listener.store.deletes("node-a") == []
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        await link.entry(4, entry_meta("ckpt/step_1/a.pt", 1, 0))  # its own prefix: taken
        await link.barrier()
        await link.aclose()
        assert [e.key for e in listener.store.entries("node-a")] == ["ckpt/step_1/a.pt"]

    (shm / "b").mkdir()
    with_listener(config(prefix="ckpt"), shm / "b", body)


def test_an_authenticated_peer_sending_a_malformed_forged_or_stalled_frame_is_dropped(shm: Path) -> None:
    async def body(listener: Listener, addr: str) -> None:
        for bad in ("malformed", "forged", "stalled"):
            stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
            reader = Reader(stream)
            session = await client_handshake(stream, reader, SECRET, "node-a", "i", "node-b")
            if bad == "malformed":
                await stream.send_all(session.encode(Kind.ENTRY, {"ino": 1, "meta": {"key": 7}}))
            elif bad == "forged":
                await stream.send_all(Session(os.urandom(32), False, "x").encode(Kind.BARRIER, {"id": 1}))
            else:  # half a frame, then nothing for longer than peer_timeout
                await stream.send_all(session.encode(Kind.WRITE, {"ino": 1, "offset": 0}, 1000) + b"x" * 10)
            assert await stream.receive_some(100) == b""  # closed, no answer
            await stream.aclose()
        await wait_for(lambda: listener.dropped_connections == 3)
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        await link.barrier()
        await link.aclose()

    (shm / "b").mkdir()
    with_listener(config(peer_timeout=2.0), shm / "b", body)


# -- a real file over loopback ---------------------------------------------------------------------------------

def _cache_file(path: Path, size: int) -> str:
    data = os.urandom(MiB)
    with open(path, "wb") as f:
        for _ in range(size // MiB):
            f.write(data)
            data = data[1:] + data[:1]
    return xxhash.xxh3_128_hexdigest(path.read_bytes())


def test_a_64_mib_file_is_replicated_byte_identical_and_survives_a_restart_of_the_peer(shm: Path) -> None:
    src = shm / "a-cache-file"
    digest = _cache_file(src, 64 * MiB)
    peer_dir = shm / "b"
    peer_dir.mkdir()
    cfg = config()

    async def send(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(cfg, "node-a", "inc1", "node-b", addr, SECRET)
        fd = os.open(src, os.O_RDONLY)
        try:
            await link.entry(7, entry_meta("ckpt/step1/shard0", 3, 64 * MiB, checkpoint="ckpt/step1"))
            for offset in range(0, 64 * MiB, 16 * MiB):  # pipelined: nothing waits until the seal
                await link.write(7, fd, offset, 16 * MiB)
            await link.seal(7, 3, 64 * MiB, digest)
        finally:
            os.close(fd)
        assert link.bytes_sent == 64 * MiB
        [entry] = listener.store.entries("node-a")
        assert (entry.key, entry.version, entry.size, entry.sealed, entry.xxh3) == ("ckpt/step1/shard0", 3, 64 * MiB, True, digest)
        assert entry.checkpoint == "ckpt/step1"
        assert entry.path == str(peer_dir / "peers" / "node-a" / "7")
        assert xxhash.xxh3_128_hexdigest(Path(entry.path).read_bytes()) == digest
        assert Path(entry.path).read_bytes() == src.read_bytes()
        assert listener.store.held_bytes("node-a") == 64 * MiB
        await link.aclose()

    with_listener(cfg, peer_dir, send)

    async def after_restart(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(cfg, "node-a", "inc2", "node-b", addr, SECRET)
        held = await link.holdings()
        assert set(held) == {7}
        assert (held[7].version, held[7].size, held[7].sealed, held[7].xxh3) == (3, 64 * MiB, True, digest)
        [entry] = listener.store.entries("node-a")
        assert await trio.to_thread.run_sync(listener.store.verify, entry)
        assert listener.store.held_bytes() == 64 * MiB
        await link.forget(7, 3)
        await link.barrier()
        assert listener.store.entries("node-a") == [] and listener.store.held_bytes() == 0
        assert not Path(entry.path).exists()
        await link.aclose()

    with_listener(cfg, peer_dir, after_restart)


def test_a_replica_that_differs_from_the_owners_copy_fails_its_seal_and_is_sent_again(shm: Path) -> None:
    """The owner's file rewritten in place after its bytes went (what no size poll sees under passthrough): the
    seal's xxh3, of the new bytes, differs from the peer's, hashed as the old ones arrived; the whole file sent
    again seals. A replica altered on the peer's disk after it arrived is not the seal's to find (it hashes the
    bytes as they are received): the takeover's check of each replica's xxh3 refuses it."""
    src = shm / "a-cache-file"
    old_digest = _cache_file(src, 4 * MiB)
    (shm / "b").mkdir()

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        fd = os.open(src, os.O_RDONLY)
        await link.entry(9, entry_meta("f", 1, 4 * MiB))
        await link.write(9, fd, 0, 4 * MiB)
        with open(src, "r+b") as f:  # rewritten in place once sent
            f.seek(MiB)
            f.write(b"\1" * 10)
        digest = xxhash.xxh3_128_hexdigest(src.read_bytes())
        with pytest.raises(SealMismatch, match="xxh3 of inode 9"):
            await link.seal(9, 1, 4 * MiB, digest)
        assert not listener.store.entries("node-a")[0].sealed
        await link.write(9, fd, 0, 4 * MiB)  # the whole file again: the link goes on
        await link.seal(9, 1, 4 * MiB, digest)
        entry = listener.store.entries("node-a")[0]
        assert entry.sealed and entry.xxh3 == digest != old_digest
        assert await trio.to_thread.run_sync(listener.store.verify, entry)
        replica = shm / "b" / "peers" / "node-a" / "9"
        with open(replica, "r+b") as f:  # the peer's disk alters it after the seal
            f.seek(2 * MiB)
            f.write(b"\0" * 10)
        assert not await trio.to_thread.run_sync(listener.store.verify, entry)
        with pytest.raises(SealMismatch, match="holds 4194304 bytes of inode 9, the owner sealed 5000000"):
            await link.seal(9, 2, 5000000, digest)
        os.close(fd)
        await link.aclose()

    with_listener(config(), shm / "b", body)


def test_past_peer_capacity_the_seal_answers_peer_full_and_the_link_goes_on(shm: Path) -> None:
    src = shm / "a-cache-file"
    digest = _cache_file(src, 3 * MiB)
    (shm / "b").mkdir()
    cfg = config(peer_capacity=4 * MiB)

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(cfg, "node-a", "i", "node-b", addr, SECRET)
        fd = os.open(src, os.O_RDONLY)
        await link.entry(1, entry_meta("one", 1, 3 * MiB, seq=1))
        await link.write(1, fd, 0, 3 * MiB)
        await link.seal(1, 1, 3 * MiB, digest)
        await link.entry(2, entry_meta("two", 1, 3 * MiB, seq=2))
        await link.write(2, fd, 0, 3 * MiB)
        with pytest.raises(PeerFull, match="peer_capacity"):
            await link.seal(2, 1, 3 * MiB, digest)
        assert listener.full_answers == 1 and listener.store.held_bytes() == 3 * MiB
        await link.forget(1, None)  # durable: its room is free again
        await link.forget(2, None)  # a replica that failed here is dropped all the same
        await link.barrier()
        assert listener.store.entries("node-a") == [] and listener.store.held_bytes() == 0
        assert os.listdir(shm / "b" / "peers" / "node-a") == []
        await link.entry(2, entry_meta("two", 1, 3 * MiB, seq=2))
        await link.write(2, fd, 0, 3 * MiB)
        await link.seal(2, 1, 3 * MiB, digest)
        os.close(fd)
        assert [e.key for e in listener.store.entries("node-a")] == ["two"]
        assert listener.dropped_connections == 0
        await link.aclose()

    with_listener(cfg, shm / "b", body)


def test_past_its_share_of_owners_a_peer_redirects_a_new_one_unless_it_insists(shm: Path) -> None:
    """spread.py: with peer_replicas = 1 a node holds for 2 owners; a third that sends it a file is told at its seal
    to go to its next candidate (PeerBusy, counted, nothing of it kept). Idle connections take no place; an owner that
    insists (every other candidate said the same), one whose replicas it holds, and an owner of an earlier release
    (that knows no redirect) are taken all the same."""
    src = shm / "a-cache-file"
    digest = _cache_file(src, 1 * MiB)
    (shm / "b").mkdir()
    cfg = config(peer_replicas=1)

    async def send(link: PeerLink, ino: int) -> None:
        fd = os.open(src, os.O_RDONLY)
        try:
            await link.entry(ino, entry_meta(f"file-{ino}", 1, 1 * MiB))
            await link.write(ino, fd, 0, 1 * MiB)
            await link.seal(ino, 1, 1 * MiB, digest)
        finally:
            os.close(fd)

    async def body(listener: Listener, addr: str) -> None:
        idle = await PeerLink.open(cfg, "idle", "i", "node-b", addr, SECRET)
        assert await idle.holdings() == {}  # connected, sends nothing: takes no place
        links = {}
        for owner in ("owner-1", "owner-2", "owner-3"):
            links[owner] = await PeerLink.open(cfg, owner, "i", "node-b", addr, SECRET)
            assert await links[owner].holdings() == {}
        await send(links["owner-1"], 1)
        await send(links["owner-2"], 2)
        with pytest.raises(PeerBusy, match="next candidate"):
            await send(links["owner-3"], 3)
        assert listener.owners_redirected == 1 and "owner-3" not in listener.store.owners()
        insisting = await PeerLink.open(cfg, "owner-3", "i", "node-b", addr, SECRET)
        assert await insisting.holdings(insist=True) == {}
        await send(insisting, 3)
        old = await PeerLink.open(cfg, "owner-4", "i", "node-b", addr, SECRET)  # an earlier release: no may_redirect
        assert (await old._request(Kind.HOLDINGS, {})).kind is Kind.HELD
        await send(old, 4)
        await links["owner-1"].aclose()  # back: its replicas are here, taken though 3 others send now
        again = await PeerLink.open(cfg, "owner-1", "i", "node-b", addr, SECRET)
        assert set(await again.holdings()) == {1}
        await send(again, 5)
        assert listener.owners_redirected == 1
        assert sorted(listener.store.owners()) == ["owner-1", "owner-2", "owner-3", "owner-4"]
        for link in (idle, links["owner-2"], links["owner-3"], insisting, old, again):
            await link.aclose()

    with_listener(cfg, shm / "b", body)


def test_truncate_deletes_and_drops_reach_the_replica_store_in_order(shm: Path) -> None:
    src = shm / "a-cache-file"
    _cache_file(src, 2 * MiB)
    (shm / "b").mkdir()

    async def body(listener: Listener, addr: str) -> None:
        store = listener.store
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        fd = os.open(src, os.O_RDONLY)
        await link.entry(4, entry_meta("t", 1, 2 * MiB))
        await link.write(4, fd, 0, 2 * MiB)
        await link.truncate(4, 1000)
        await link.seal(4, 1, 1000, xxhash.xxh3_128_hexdigest(src.read_bytes()[:1000]))
        assert store.entries("node-a")[0].sealed
        with open(src, "r+b") as f:
            f.write(b"rewritten!")
        await link.write(4, fd, 0, 10)  # the sealed replica changes: recorded unsealed before its bytes are
        await link.barrier()
        [entry] = store.entries("node-a")
        assert not entry.sealed and not await trio.to_thread.run_sync(store.verify, entry)
        await link.seal(4, 1, 1000, xxhash.xxh3_128_hexdigest(src.read_bytes()[:1000]))
        [entry] = store.entries("node-a")
        assert entry.sealed and await trio.to_thread.run_sync(store.verify, entry)
        os.close(fd)
        await link.delete(11, "old/a", 5)
        await link.delete(10, "old/b", 6)
        await link.barrier()
        assert [(d.op_id, d.key, d.seq) for d in store.deletes("node-a")] == [(11, "old/a", 5), (10, "old/b", 6)]
        await link.delete_done(11)
        await link.entry(4, entry_meta("t", 2, 1000))  # a newer version, no byte changed: still sealed; a forget of the older keeps it
        await link.forget(4, 1)
        await link.barrier()
        assert [d.op_id for d in store.deletes("node-a")] == [10]
        assert [(e.version, e.sealed) for e in store.entries("node-a")] == [(2, True)]
        assert store.owners() == ["node-a"]
        store.drop_owner("node-a")
        assert store.owners() == [] and store.held_bytes() == 0
        assert not (shm / "b" / "peers" / "node-a").exists()
        await link.aclose()

    with_listener(config(), shm / "b", body)


def test_a_lost_or_silent_peer_is_a_peer_error_within_peer_timeout(shm: Path) -> None:
    async def main() -> None:
        with pytest.raises(PeerError, match="cannot be reached"):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            await PeerLink.open(config(), "node-a", "i", "node-b", f"127.0.0.1:{port}", SECRET)
        mute = trio.socket.socket()
        await mute.bind(("127.0.0.1", 0))
        mute.listen()
        port = mute.getsockname()[1]
        with pytest.raises(PeerError, match="did not answer within peer_timeout"):
            await PeerLink.open(config(peer_timeout=0.3), "node-a", "i", "node-b", f"127.0.0.1:{port}", SECRET)
        mute.close()
    trio.run(main)


def test_a_peer_addr_in_use_is_one_line_naming_it(shm: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cfg = config(peer_addr=f"127.0.0.1:{taken.getsockname()[1]}")
    (shm / "b").mkdir()
    store = ReplicaStore(cfg, str(shm / "b"))

    async def main() -> None:
        await Listener(cfg, store, SECRET, "node-b").run()  # raised as it is, not in a group: the supervisor's start shows it

    with pytest.raises(PeerOptionError, match=f"peer_addr = {cfg.peer_addr} cannot be listened on"):
        trio.run(main)
    taken.close()
    store.close()


def test_the_throttle_is_given_every_byte_sent(shm: Path) -> None:
    src = shm / "a-cache-file"
    digest = _cache_file(src, 20 * MiB)
    (shm / "b").mkdir()
    counted: list[int] = []

    async def throttle(n: int) -> None:
        counted.append(n)
        await trio.sleep(0)

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        link.throttle = throttle
        fd = os.open(src, os.O_RDONLY)
        await link.entry(1, entry_meta("x", 1, 20 * MiB))
        await link.write(1, fd, 0, 20 * MiB)
        await link.seal(1, 1, 20 * MiB, digest)
        os.close(fd)
        assert sum(counted) == 20 * MiB
        await link.aclose()

    with_listener(config(), shm / "b", body)


def test_replicas_keep_the_cache_disk_reserve_free(shm: Path) -> None:
    src = shm / "a-cache-file"
    digest = _cache_file(src, MiB)
    (shm / "b").mkdir()
    cfg = config(cache_min_free=1 << 62)  # more than the disk has: no byte may be added

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(cfg, "node-a", "i", "node-b", addr, SECRET)
        fd = os.open(src, os.O_RDONLY)
        await link.entry(1, entry_meta("one", 1, MiB))
        await link.write(1, fd, 0, MiB)
        with pytest.raises(PeerFull, match="reserve"):
            await link.seal(1, 1, MiB, digest)
        os.close(fd)
        await link.aclose()

    with_listener(cfg, shm / "b", body)


def test_bytes_altered_under_a_matching_xxh3_fail_the_seal_and_the_takeovers_check(shm: Path) -> None:
    """Issue 43: the seal compared xxh3-128, which is not cryptographic: bytes altered on the wire with the edit
    compensated kept the owner's xxh3, were sealed, and a takeover uploaded them. The owner's BLAKE3 (in the MACed
    seal frame) must match what the holder wrote, and the takeover's check reads both again from the disk. The
    compensated edit is stood in for by an owner digest whose xxh3 is the altered bytes' own."""
    from ckptfs.peers.replicas import ReplicaMismatch
    from ckptfs.peers.sealhash import seal_digest

    store = ReplicaStore(config(), str(shm))
    sent, arrived = b"import os  # the owner's", b"os.system('evil')  # 24!"
    assert len(sent) == len(arrived)
    forged = seal_digest(arrived)._replace(blake3=seal_digest(sent).blake3)  # xxh3 "compensated", BLAKE3 the owner's
    store.put_entry("node-a", 3, entry_meta("k", 1, len(arrived)))
    os.pwrite(store.reserve("node-a", 3, len(arrived)), arrived, 0)
    with pytest.raises(ReplicaMismatch, match="BLAKE3"):
        store.seal("node-a", 3, 1, len(arrived), forged.xxh3, forged.blake3)
    assert [e.sealed for e in store.entries("node-a")] == [False]  # never uploaded by a takeover: not acknowledged
    # the owner re-sends it whole: sealed with both digests, and the takeover's check holds
    store.wrote("node-a", 3, 0)  # as a write frame does: what was hashed of it is forgotten
    os.pwrite(store.reserve("node-a", 3, len(sent)), sent, 0)
    store.seal("node-a", 3, 1, len(sent), seal_digest(sent).xxh3, seal_digest(sent).blake3)
    entry = store.entries("node-a")[0]
    assert entry.sealed and entry.blake3 == seal_digest(sent).blake3 and store.verify(entry)
    # altered on this disk afterwards, its xxh3 kept (stood in for, as above): the takeover's verify refuses it
    os.pwrite(os.open(entry.path, os.O_WRONLY), arrived, 0)
    store.db.execute("UPDATE replicas SET xxh3 = ? WHERE owner = 'node-a' AND ino = 3", (seal_digest(arrived).xxh3,))
    assert not store.verify(store.entries("node-a")[0])
    store.close()


def test_the_caches_clean_up_of_files_no_inode_owns_leaves_replicas_alone(shm: Path) -> None:
    from ckptfs.cache import Cache
    store = ReplicaStore(config(), str(shm))
    store.put_entry("node-a", 3, entry_meta("k", 1, 5))
    os.pwrite(store.reserve("node-a", 3, 5), b"hello", 0)
    store.seal("node-a", 3, 1, 5, xxhash.xxh3_128_hexdigest(b"hello"))
    cache = Cache(shm, 0, 0)
    cache.scan(set())  # no inode owns anything: every file under data/ goes
    assert Path(store.path("node-a", 3)).read_bytes() == b"hello"
    assert [e.sealed for e in store.entries("node-a")] == [True]
    store.close()


def test_connections_past_the_handshake_limit_are_closed_at_once(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ckptfs.peers.listener as listener_module
    monkeypatch.setattr(listener_module, "MAX_HANDSHAKES", 2)
    (shm / "b").mkdir()

    async def body(listener: Listener, addr: str) -> None:
        silent = [await trio.open_tcp_stream("127.0.0.1", listener.port) for _ in range(2)]
        for s in silent:
            assert await s.receive_some(1 << 16)  # each got its challenge: both handshakes are under way
        third = await trio.open_tcp_stream("127.0.0.1", listener.port)
        assert await third.receive_some(1 << 16) == b""  # no challenge: closed
        assert listener.refused_connections == 1
        for s in silent:
            await s.aclose()
        await wait_for(lambda: listener.refused_connections == 3)
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)  # room again
        await link.barrier()
        await link.aclose()

    with_listener(config(peer_timeout=60.0), shm / "b", body)


def test_strangers_flooding_the_listener_never_keep_the_nodes_out(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43 item 3: connections that never authenticate, from an address no node announces (127.0.0.2 here),
    get a few slots per address and a short deadline; a node's own address has slots of its own and gets in."""
    import ckptfs.peers.listener as listener_module
    monkeypatch.setattr(listener_module, "STRANGER_HANDSHAKE_SECONDS", 0.5)
    (shm / "b").mkdir()

    async def body(listener: Listener, addr: str) -> None:
        listener.known_hosts = lambda: {"127.0.0.1"}
        flood = [await trio.open_tcp_stream("127.0.0.1", listener.port, local_address="127.0.0.2") for _ in range(12)]
        per_address = listener_module.MAX_HANDSHAKES_PER_ADDRESS
        await wait_for(lambda: listener.refused_connections >= len(flood) - per_address)
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)  # the strangers' slots are full
        await link.barrier()
        await link.aclose()
        challenged = 0
        for s in flood:  # each held one got its challenge, then was closed at its deadline (peer_timeout is 60 s)
            got = b""
            with trio.fail_after(30):
                while chunk := await s.receive_some(1 << 16):
                    got += chunk
            challenged += bool(got)
            await s.aclose()
        assert challenged == per_address
        assert listener.refused_connections == len(flood)

    with_listener(config(peer_timeout=60.0), shm / "b", body)


def test_a_cache_file_shorter_than_a_write_keeps_the_link_in_step(shm: Path) -> None:
    """The file was truncated between the sender's look at its size and the sendfile: the frame is filled up with
    zeros, the link goes on, and the truncate that follows makes the replica right."""
    src = shm / "a-cache-file"
    digest = _cache_file(src, MiB)
    (shm / "b").mkdir()

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        fd = os.open(src, os.O_RDONLY)
        await link.entry(1, entry_meta("short", 1, MiB))
        await link.write(1, fd, 0, 3 * MiB)
        await link.barrier()
        replica = Path(listener.store.path("node-a", 1))
        assert replica.read_bytes() == src.read_bytes() + bytes(2 * MiB)
        await link.truncate(1, MiB)
        await link.seal(1, 1, MiB, digest)
        assert replica.read_bytes() == src.read_bytes()
        os.close(fd)
        await link.aclose()

    with_listener(config(), shm / "b", body)


def test_files_sealed_at_once_by_many_tasks_on_one_link_each_get_their_own_answer(shm: Path) -> None:
    (shm / "b").mkdir()
    files = {}
    for i in range(8):
        path = shm / f"file{i}"
        data = os.urandom((i + 1) * 300_000)
        path.write_bytes(data)
        files[i] = (path, data)

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        results: dict[int, str] = {}

        async def one(i: int) -> None:
            path, data = files[i]
            fd = os.open(path, os.O_RDONLY)
            try:
                await link.entry(i, entry_meta(f"k{i}", 1, len(data), seq=i))
                for offset in range(0, len(data), 256 * 1024):
                    await link.write(i, fd, offset, min(256 * 1024, len(data) - offset))
                digest = xxhash.xxh3_128_hexdigest(data) if i != 5 else "0" * 32  # one of them wrong
                try:
                    await link.seal(i, 1, len(data), digest)
                    results[i] = "sealed"
                except SealMismatch:
                    results[i] = "mismatch"
            finally:
                os.close(fd)

        async with trio.open_nursery() as nursery:
            for i in files:
                nursery.start_soon(one, i)
        assert results == {i: "mismatch" if i == 5 else "sealed" for i in files}
        for entry in listener.store.entries("node-a"):
            assert Path(entry.path).read_bytes() == files[entry.ino][1]
            assert entry.sealed == (entry.ino != 5)
        await link.aclose()

    with_listener(config(), shm / "b", body)


def test_the_peer_hashes_bytes_streamed_in_order_as_they_arrive_and_anything_else_from_its_disk(
        shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seal of a file whose bytes arrived in order reads nothing back (hashed on arrival); out-of-order writes,
    a rewrite below what was hashed and a truncate mid-stream still give the seal the xxh3 of the bytes on the
    peer's disk: the right digest seals, the digest of what the file was before does not."""
    import ckptfs.peers.replicas as replicas

    read_back: list[tuple[int, int]] = []
    hash_range = replicas._hash_range

    def counting(fd: int, h: Any, start: int, end: int) -> None:
        read_back.append((start, end))
        hash_range(fd, h, start, end)

    monkeypatch.setattr(replicas, "_hash_range", counting)
    size = 8 * MiB
    first, second = shm / "first", shm / "second"
    _cache_file(first, size)
    with open(second, "wb") as f:  # other bytes at every offset
        f.write(os.urandom(size + MiB))
    data = {p: p.read_bytes() for p in (first, second)}
    (shm / "b").mkdir()

    def digest(*parts: bytes) -> str:
        return xxhash.xxh3_128_hexdigest(b"".join(parts))

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        fd1, fd2 = os.open(first, os.O_RDONLY), os.open(second, os.O_RDONLY)
        a, b = data[first], data[second]
        try:
            # in order, in three frames (the last one ragged): the seal reads nothing back
            await link.entry(1, entry_meta("in-order", 1, size))
            for start, end in ((0, 3 * MiB), (3 * MiB, 5 * MiB + 7), (5 * MiB + 7, size)):
                await link.write(1, fd1, start, end - start)
            read_back.clear()
            await link.seal(1, 1, size, digest(a))
            assert read_back == [] or all(s == e for s, e in read_back)
            # appended after a seal: only the new bytes are hashed, on arrival
            await link.entry(1, entry_meta("in-order", 2, size + MiB))
            await link.write(1, fd2, size, MiB)
            read_back.clear()
            with pytest.raises(SealMismatch):  # the digest of other bytes
                await link.seal(1, 2, size + MiB, digest(b[:size + MiB]))
            await link.seal(1, 2, size + MiB, digest(a, b[size:]))
            assert read_back == [] or all(s == e for s, e in read_back)

            # the second half before the first: the seal reads the part past the in-order prefix from its disk
            await link.entry(2, entry_meta("out-of-order", 1, size))
            await link.write(2, fd1, size // 2, size // 2)
            await link.write(2, fd1, 0, size // 2)
            with pytest.raises(SealMismatch):
                await link.seal(2, 1, size, digest(b))
            await link.seal(2, 1, size, digest(a))

            # a range below the hashed prefix rewritten: the old digest no longer seals, the new one does
            await link.entry(3, entry_meta("rewritten", 1, size))
            await link.write(3, fd1, size // 2, size // 2)
            await link.write(3, fd1, 0, size // 2)
            await link.write(3, fd2, 2 * MiB, MiB)
            rewritten = a[:2 * MiB] + b[2 * MiB:3 * MiB] + a[3 * MiB:]
            with pytest.raises(SealMismatch):
                await link.seal(3, 1, size, digest(a))
            await link.seal(3, 1, size, digest(rewritten))

            # truncated mid-stream below what was hashed, then written on with other bytes
            await link.entry(4, entry_meta("truncated", 1, 6 * MiB))
            await link.write(4, fd1, 0, 4 * MiB)
            await link.truncate(4, 3 * MiB)
            await link.write(4, fd2, 3 * MiB, 3 * MiB)
            with pytest.raises(SealMismatch):
                await link.seal(4, 1, 6 * MiB, digest(a[:6 * MiB]))
            await link.seal(4, 1, 6 * MiB, digest(a[:3 * MiB], b[3 * MiB:6 * MiB]))

            # started over at 0 after a seal: the new bytes alone are the file's
            await link.truncate(4, 0)
            await link.write(4, fd2, 0, 2 * MiB)
            await link.seal(4, 2, 2 * MiB, digest(b[:2 * MiB]))
            for entry in listener.store.entries("node-a"):
                assert entry.sealed and await trio.to_thread.run_sync(listener.store.verify, entry), entry.key
        finally:
            os.close(fd1)
            os.close(fd2)
            await link.aclose()

    with_listener(config(), shm / "b", body)


def test_a_listener_stopped_while_an_owner_is_silent_mid_write_stops_without_waiting_out_peer_timeout(shm: Path) -> None:
    """A WRITE frame's bytes are received by a worker thread, which a cancel cannot interrupt: the listener's stop
    reaches it (within a fraction of a second), so a daemon stops at once even with an owner silent mid-frame."""
    cfg = config(peer_timeout=300.0)
    (shm / "b").mkdir()

    async def main() -> float:
        store = ReplicaStore(cfg, str(shm / "b"))
        listener = Listener(cfg, store, SECRET, "node-b")
        try:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(listener.run)
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                reader = Reader(stream)
                session = await client_handshake(stream, reader, SECRET, "node-a", "i", "node-b")
                await stream.send_all(session.encode(Kind.ENTRY, {"ino": 1, "meta": entry_meta("f", 1, 8 * MiB)}))
                await stream.send_all(session.encode(Kind.WRITE, {"ino": 1, "offset": 0}, 8 * MiB) + b"x" * MiB)
                await wait_for(lambda: listener.store.held_bytes() == 8 * MiB)  # the frame is being received
                await trio.sleep(0.5)
                stopped = trio.current_time()
                nursery.cancel_scope.cancel()
            await stream.aclose()
            return trio.current_time() - stopped
        finally:
            store.close()

    took = trio.run(main)
    assert took < cfg.peer_timeout / 2, f"the stop waited {took:.0f} s for the silent owner"


def test_a_listener_run_again_keeps_its_port_or_takes_and_announces_another(shm: Path) -> None:
    """The supervisor runs the listener again after a failure: it binds the port its peers know; with port 0
    configured and that port taken meanwhile, it binds another rather than failing for ever, and hands it on
    (`on_listening`: the node record announces the address it listens on)."""
    (shm / "b").mkdir()
    cfg = config()
    store = ReplicaStore(cfg, str(shm / "b"))
    listener = Listener(cfg, store, SECRET, "node-b")
    announced: list[str] = []
    listener.on_listening = announced.append

    async def once() -> int:
        async with trio.open_nursery() as nursery:
            port: int = await nursery.start(listener.run)
            nursery.cancel_scope.cancel()
        return port

    try:
        first = trio.run(once)
        assert trio.run(once) == first  # run again: the same port
        taken = socket.socket()
        taken.bind(("127.0.0.1", first))
        taken.listen()
        try:
            third = trio.run(once)
        finally:
            taken.close()
        assert third != first
        assert announced == [f"127.0.0.1:{first}", f"127.0.0.1:{first}", f"127.0.0.1:{third}"]
    finally:
        store.close()


def test_a_real_enospc_on_the_replica_disk_answers_full_and_the_link_goes_on(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The room check before each write looks at the disk's free space, but another process (or another owner's
    connection) can take it before the bytes land: then the kernel's ENOSPC itself. The replica directory is a
    real 8 MiB tmpfs and the check is made to pass, so the write meets the full disk: the seal answers PeerFull
    (the owner takes another peer), the connection stays in step, and once the file is forgotten a file that
    fits is replicated on the same link."""
    from tests.support.smallfs import SmallFs, can_mount_tmpfs

    if not can_mount_tmpfs():
        pytest.skip("needs root to mount a small tmpfs as the replica disk")
    src = shm / "a-cache-file"
    digest = _cache_file(src, 12 * MiB)
    small = shm / "small"
    small.write_bytes(src.read_bytes()[:2 * MiB])
    small_digest = xxhash.xxh3_128_hexdigest(small.read_bytes())
    (shm / "b").mkdir()
    disk = SmallFs(shm / "b", 8 * MiB)
    monkeypatch.setattr(ReplicaStore, "room", lambda self: 1 << 40)  # the space taken after the check
    cfg = config(peer_capacity=1 << 30)

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(cfg, "node-a", "i", "node-b", addr, SECRET)
        fd = os.open(src, os.O_RDONLY)
        await link.entry(1, entry_meta("big", 1, 12 * MiB, seq=1))
        await link.write(1, fd, 0, 12 * MiB)
        with pytest.raises(PeerFull, match="No space left on device"):
            await link.seal(1, 1, 12 * MiB, digest)
        assert listener.full_answers == 1 and listener.dropped_connections == 0
        await link.forget(1, None)
        await link.barrier()
        sfd = os.open(small, os.O_RDONLY)
        await link.entry(2, entry_meta("small", 1, 2 * MiB, seq=2))
        await link.write(2, sfd, 0, 2 * MiB)
        await link.seal(2, 1, 2 * MiB, small_digest)
        os.close(sfd)
        os.close(fd)
        assert [e.key for e in listener.store.entries("node-a")] == ["small"]
        await link.aclose()

    try:
        with_listener(cfg, shm / "b", body)
    finally:
        disk.close()


def test_a_renamed_durable_files_entry_arrives_sealed_and_a_delete_names_the_file_it_waits_for(shm: Path) -> None:
    """Issue 42, case 1: a durable file renamed holds no bytes on the peer (they are the bucket's), so its entry goes
    sealed, with the object's xxh3, and a barrier puts it on the disk; the delete of its old key keeps `after_ino`."""
    src = shm / "a-cache-file"
    src.write_bytes(os.urandom(1000))
    (shm / "b").mkdir()

    async def body(listener: Listener, addr: str) -> None:
        store = listener.store
        link = await PeerLink.open(config(), "node-a", "i", "node-b", addr, SECRET)
        fd = os.open(src, os.O_RDONLY)
        await link.entry(5, entry_meta("run/w.tmp", 1, 1000))  # replicated before it was durable
        await link.write(5, fd, 0, 1000)
        os.close(fd)
        await link.seal(5, 1, 1000, xxhash.xxh3_128_hexdigest(src.read_bytes()))
        await link.forget(5, 1)  # durable: forgotten; then renamed
        await link.entry(5, entry_meta("run/w.pt", 2, 1000, seq=2, copy_from="run/w.tmp", sealed=True, xxh3="abc"))
        await link.delete(7, "run/w.tmp", 3, after_ino=5)
        await link.barrier()
        [entry] = store.entries("node-a")
        assert (entry.key, entry.copy_from, entry.sealed, entry.xxh3, entry.version) == ("run/w.pt", "run/w.tmp", True, "abc", 2)
        assert not os.path.exists(entry.path) and store.held_bytes("node-a") == 0
        assert [(d.key, d.after_ino) for d in store.deletes("node-a")] == [("run/w.tmp", 5)]
        # written since: its bytes are to be sent, the entry without copy_from is not sealed until the owner seals it
        await link.entry(5, entry_meta("run/w.pt", 3, 1000, seq=4))
        await link.barrier()
        assert not store.entries("node-a")[0].sealed
        await link.aclose()

    with_listener(config(), shm / "b", body)


def test_a_replica_index_of_an_older_version_gains_the_deletes_after_ino(shm: Path) -> None:
    import sqlite3

    (shm / "peers").mkdir()
    db = sqlite3.connect(shm / "peers" / "replicas.db")
    db.execute("CREATE TABLE deletes (owner TEXT NOT NULL, op_id INTEGER NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, "
               "PRIMARY KEY (owner, op_id))")
    db.execute("INSERT INTO deletes VALUES ('node-a', 1, 'k', 5)")
    db.commit()
    db.close()
    store = ReplicaStore(config(), str(shm))
    try:
        store.add_delete("node-a", 2, "k2", 6, 9)
        assert [(d.key, d.after_ino) for d in store.deletes("node-a")] == [("k", None), ("k2", 9)]
    finally:
        store.close()


# -- a peer that dies silently (issue 42) ----------------------------------------------------------------

def _socket_with_peer(addr: tuple[str, int]) -> socket.socket | None:
    """A copy of this process's socket whose other end is `addr` (the listener's side of a link, same process)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.getpeername() == addr:
                return s
        except OSError:
            pass
        s.close()
    return None


def test_both_ends_of_a_peer_connection_have_keepalive_and_a_user_timeout(shm: Path) -> None:
    """Power lost on either node sends nothing: the kernel ends the connection within about peer_timeout."""
    cfg = config(peer_timeout=10.0)

    async def body(listener: Listener, addr: str) -> None:
        link = await PeerLink.open(cfg, "node-a", "i", "node-b", addr, SECRET)
        await link.barrier()  # the listener has accepted and authenticated it
        ours = link.stream.socket
        theirs = _socket_with_peer(ours.getsockname())
        assert theirs is not None, "the listener's side of the connection"
        try:
            for s in (ours, theirs):
                assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10_000
                idle, interval, probes = (s.getsockopt(socket.IPPROTO_TCP, o)
                                          for o in (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT))
                assert idle + interval * probes <= 10, (idle, interval, probes)
        finally:
            theirs.close()
            await link.aclose()

    (shm / "b").mkdir()
    with_listener(cfg, shm / "b", body)


def test_an_idle_link_is_pinged_and_a_peer_that_stops_answering_is_noticed_within_peer_timeout() -> None:
    """Nothing to send, nothing awaited: `watch` pings the peer (a barrier it answers without an fsync), so one that
    died silently (its kernel may still acknowledge segments: a stopped daemon) breaks the link within peer_timeout
    of its last answer. Trio's MockClock: the times are the protocol's, not the machine's."""
    timeout = 8.0
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main() -> None:
        c, s = trio.testing.memory_stream_pair()
        answering = True
        answers: list[float] = []
        frames: list[dict[str, Any]] = []

        async def peer() -> None:
            reader = Reader(s)
            session = await server_handshake(s, reader, SECRET, "node-b")
            while True:
                frame = await session.receive(reader)
                frames.append(frame.meta)
                if not answering:
                    await trio.sleep_forever()  # stopped: reads nothing more, answers nothing
                await s.send_all(session.encode(Kind.ACK, {"id": frame.meta["id"]}))
                answers.append(trio.current_time())

        failed: list[tuple[float, PeerError]] = []

        async def watching(link: PeerLink) -> None:
            try:
                await link.watch()
            except PeerError as e:
                failed.append((trio.current_time(), e))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer)
            reader = Reader(c)
            session = await client_handshake(c, reader, SECRET, "node-a", "i", "node-b")
            link = PeerLink(config(peer_timeout=timeout), "node-b", "b:1", c, reader, session)  # type: ignore[arg-type]
            nursery.start_soon(watching, link)
            await trio.sleep(10 * timeout)
            # idle all along: pinged every quarter of peer_timeout, every ping answered, the link fine
            assert not failed and link.broken is None
            assert len(frames) == link.pings >= 35 and all(m.get("ping") is True for m in frames)
            await link.barrier()  # a real barrier is not a ping
            assert frames[-1].get("ping") is None
            answering = False
            await trio.sleep(2 * timeout)
            assert len(failed) == 1 and "no answer to a ping" in str(failed[0][1])
            assert failed[0][0] - answers[-1] <= timeout + 1e-6
            with pytest.raises(PeerError):
                await link.entry(1, {})  # broken: the sender takes the next candidate
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)


def test_a_connection_the_kernel_gave_up_on_is_not_connected_again_at_once() -> None:
    """A reset (the peer's listener restarted) is worth a new connection at once; ETIMEDOUT (keepalive or
    TCP_USER_TIMEOUT: the host stopped answering) is not, a new connection would only wait out peer_timeout."""
    import errno

    from ckptfs.peers.link import _reset

    def wrapped(code: int) -> BaseException:
        try:
            try:
                raise OSError(code, os.strerror(code))
            except OSError as e:
                raise trio.BrokenResourceError from e  # as trio's SocketStream raises it
        except trio.BrokenResourceError as b:
            return b

    assert _reset(wrapped(errno.ECONNRESET)) and _reset(OSError(errno.EPIPE, "broken pipe"))
    assert not _reset(wrapped(errno.ETIMEDOUT)) and not _reset(OSError(errno.EHOSTUNREACH, "no route"))


def test_a_peer_that_stops_reading_mid_write_breaks_the_link_and_later_calls_fail_at_once(shm: Path) -> None:
    """The in-flight case: a peer (authenticated) that stops reading while a file streams to it. The kernel's buffers
    fill, the link's sendfile thread finds no room for peer_timeout and the link breaks: a PeerError, not a hang, and
    every later frame is refused at once (the sender takes the next candidate)."""
    src = shm / "a-cache-file"
    _cache_file(src, 64 * MiB)
    cfg = config(peer_timeout=1.0)

    async def main() -> None:
        async def stopped_peer(stream: trio.SocketStream) -> None:
            await server_handshake(stream, Reader(stream), SECRET, "node-b")
            await trio.sleep_forever()  # reads nothing more

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(trio.serve_tcp, stopped_peer, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            link = await PeerLink.open(cfg, "node-a", "i", "node-b", f"127.0.0.1:{port}", SECRET)
            fd = os.open(src, os.O_RDONLY)
            try:
                with trio.fail_after(60):  # a hang would fail here, far past peer_timeout
                    with pytest.raises(PeerError, match="no progress sending"):
                        await link.write(1, fd, 0, 64 * MiB)
            finally:
                os.close(fd)
            assert link.broken is not None and link.bytes_sent < 64 * MiB
            with pytest.raises(PeerError):
                await link.barrier()
            await link.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)
