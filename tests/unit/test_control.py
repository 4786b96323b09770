"""The control server answers every request, even one whose handler fails, and keeps serving (gateway/control.py).

A real Unix socket served by `ControlServer`; the daemon behind it is a stand-in whose `status` fails the
first time, as a bug would (the integration tests show the same with a real daemon and a malformed request).
And what a user sees of peer durability through the socket: `flush --level replicated` (over a fake of the `Peers`
facade), the status's peers and single-copy window.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from ckptfs.control import ControlServer
from ckptfs.daemon import peer_fields, peer_status
from ckptfs.supervisor import Supervisor


class FlakyDaemon:
    def __init__(self) -> None:
        self.calls = 0
        self.supervisor = Supervisor()

    def status(self) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            raise ZeroDivisionError("division by zero\nsecond line")
        return {"pid": 1}


async def request(path: Path, raw: bytes) -> list[dict[str, Any]]:
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        await stream.send_all(raw)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_a_failing_handler_is_answered_with_one_line_and_the_server_keeps_serving(tmp_path: Path) -> None:
    sock = tmp_path / "control.sock"
    daemon = FlakyDaemon()
    server = ControlServer(sock, daemon)  # type: ignore[arg-type]
    answers: list[list[dict[str, Any]]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            for raw in (b'{"cmd": "status"}\n', b"[1]\n", b'{"cmd": "inject_fault", "service": "drainer"}\n', b'{"cmd": "status"}\n'):
                answers.append(await request(sock, raw))
            answers.append([await server.ask({"cmd": "status"})])
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert answers[0] == [{"ok": False, "error": "internal error: ZeroDivisionError: division by zero"}]
    assert answers[1] == [{"ok": False, "error": "bad request: a request is a JSON object, not list"}]
    assert answers[2] == [{"ok": False, "error": "unknown command 'inject_fault'"}]  # no CKPTFS_TEST_FAULTS: no such command
    assert answers[3] == [{"ok": True, "status": {"pid": 1}}]
    assert answers[4] == [{"ok": True, "status": {"pid": 1}}]


# ------------------------------------------------- flush --level replicated, over the Peers facade
class FakePeers:
    """The part of `ckptfs.peers.service.Peers` the control socket reaches: what under a path is neither durable nor
    on peers' disks, and the wait for it (which a test releases, or fails as on_no_peer = fail does)."""

    def __init__(self, left: tuple[int, int]) -> None:
        self.left = left
        self.release = trio.Event()
        self.fail: OSError | None = None
        self.asked: list[str] = []
        self.cancelled = False

    def unreplicated_under(self, path: str) -> tuple[int, int]:
        return self.left

    async def wait_replicated_under(self, path: str) -> None:
        self.asked.append(path)
        try:
            await self.release.wait()
        except trio.Cancelled:
            self.cancelled = True
            raise
        if self.fail is not None:
            raise self.fail
        self.left = (0, 0)


class PeerDaemon:
    """What the control socket asks of the daemon for a flush: its `peers` (the facade, None without) and `exists`."""

    def __init__(self, peers: FakePeers | None) -> None:
        self.peers = peers
        self.supervisor = Supervisor()

    def exists(self, path: str) -> bool:
        return path != "missing"


def flush_lines(daemon: PeerDaemon, request: dict[str, Any], during: Any = None, lines_before: int = 2) -> list[dict[str, Any]]:
    """The lines a flush request gets; `during()` runs once `lines_before` progress lines arrived."""
    server = ControlServer(Path("unused"), daemon)  # type: ignore[arg-type]
    got: list[dict[str, Any]] = []

    async def main() -> None:
        async def send(obj: Any) -> None:
            got.append(obj)
            if during is not None and len(got) == lines_before:
                during()

        await server._dispatch(request, send)

    trio.run(main)
    return got


def test_flush_replicated_reports_what_is_not_replicated_until_the_peers_hold_it() -> None:
    peers = FakePeers((2, 3 << 20))
    lines = flush_lines(PeerDaemon(peers), {"cmd": "flush", "path": "/run/step_1/", "level": "replicated"}, during=peers.release.set)
    assert lines[0] == {"ok": True, "files": 2, "bytes": 3 << 20, "deletes": 0}
    assert lines[-1] == {"ok": True, "done": True}
    assert peers.asked == ["run/step_1"]


def test_flush_replicated_on_a_mount_without_peers_is_one_line() -> None:
    lines = flush_lines(PeerDaemon(None), {"cmd": "flush", "path": "run", "level": "replicated"})
    assert lines == [{"ok": False, "error": "level replicated needs durability = peer, and this mount has durability = local (no peer "
                                            "holds copies): wait for level durable, or mount with durability = peer (docs/peers.md)"}]


def test_flush_with_an_unknown_level_or_path_is_one_line() -> None:
    assert flush_lines(PeerDaemon(FakePeers((0, 0))), {"cmd": "flush", "path": "run", "level": "on-tape"}) == [
        {"ok": False, "error": "flush: unknown level 'on-tape': give durable (in the bucket) or replicated (on peers' disks too)"}]
    assert flush_lines(PeerDaemon(FakePeers((0, 0))), {"cmd": "flush", "path": "missing", "level": "replicated"}) == [
        {"ok": False, "error": "missing: no such file or directory in the mount"}]


def test_flush_replicated_when_no_peer_takes_a_copy_is_one_error_line() -> None:
    import errno

    peers = FakePeers((1, 10))
    peers.fail = OSError(errno.EIO, "no peer answered within peer_timeout")

    lines = flush_lines(PeerDaemon(peers), {"cmd": "flush", "path": "run", "level": "replicated"}, during=peers.release.set)
    assert lines[-1] == {"ok": False, "error": "run: not replicated: no peer answered within peer_timeout"}


def test_a_client_that_goes_away_ends_the_wait_for_replicas(tmp_path: Path) -> None:
    """The client's timeout closes the socket: the next progress line finds it gone, and the peers' wait is cancelled."""
    sock = tmp_path / "control.sock"
    peers = FakePeers((1, 10))
    server = ControlServer(sock, PeerDaemon(peers))  # type: ignore[arg-type]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            stream = await trio.open_unix_socket(str(sock))
            await stream.send_all(b'{"cmd": "flush", "path": "run", "level": "replicated"}\n')
            first = await stream.receive_some(65536)
            assert json.loads(first.splitlines()[0]) == {"ok": True, "files": 1, "bytes": 10, "deletes": 0}
            await stream.aclose()
            with trio.fail_after(30):
                while not peers.cancelled:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert peers.cancelled and not peers.release.is_set()


def test_the_status_lists_the_peers_and_the_single_copy_window() -> None:
    # durability = local: no peer, every byte not yet durable is single-copy since its file's close
    assert peer_fields(None, 5 << 20, 12.5) == {
        "peers": [], "peer_state": None, "peer_copies_uncounted": None, "peer_holders": [], "membership": None, "peer_addr": None, "failure_domain": None,
        "peer_replica_bytes": 0, "peer_conditional_writes": None, "peer_conditional_deletes": None,
        "single_copy_bytes": 5 << 20, "single_copy_oldest_age_seconds": 12.5,
        "peer_replicated_bytes_total": 0, "peer_degraded_writes_total": 0, "peer_takeovers_total": 0,
        "peer_replicas_refused_total": 0, "peer_handshake_refused_total": 0, "peer_unclaimed_nodes": [],
        "peer_owners_redirected_total": 0, "peer_refused_writes_total": 0, "peer_keys_refused_total": 0}
    # durability = peer: what Peers.status() says, the window included
    peer = {"node": "node-b", "addr": "10.0.0.6:7470", "state": "live", "failure_domain": "rack2", "lag_seconds": 0.2,
            "replicated_bytes": 1 << 30, "connected": True}
    down = {"node": "node-c", "addr": "10.0.0.7:7470", "state": "down", "failure_domain": "rack3", "lag_seconds": None,
            "replicated_bytes": 0, "connected": False}
    fields = peer_fields({"node": "node-a", "incarnation": "ab12", "state": "fenced", "failure_domain": "rack1",
                          "peer_addr": "10.0.0.5:7470", "peers": [peer, down], "single_copy_bytes": 7,
                          "single_copy_oldest_age_seconds": 3.0, "replica_bytes_held": 11, "takeovers": 1, "degraded_writes": 2,
                          "replicated_bytes": 1 << 30, "replicas_refused": 4, "conditional_writes": True, "conditional_deletes": False,
                          "copies_uncounted": "this node was taken over and has not rejoined", "refused_writes": 3,
                          "unclaimed_nodes": ["node-c"], "holders": ["node-b"], "owners_redirected": 6,
                          "membership": {"backend": "bucket", "stale_seconds": 1.5, "requests": {"list": 3, "get": 4, "put": 5, "delete": 0}}},
                         5 << 20, 12.5)
    assert fields == {"peers": [peer, down], "peer_state": "fenced", "peer_addr": "10.0.0.5:7470", "failure_domain": "rack1",
                      "peer_copies_uncounted": "this node was taken over and has not rejoined", "peer_holders": ["node-b"],
                      "membership": {"backend": "bucket", "stale_seconds": 1.5, "requests": {"list": 3, "get": 4, "put": 5, "delete": 0}},
                      "peer_replica_bytes": 11, "peer_conditional_writes": True, "peer_conditional_deletes": False,
                      "single_copy_bytes": 7, "single_copy_oldest_age_seconds": 3.0,
                      "peer_replicated_bytes_total": 1 << 30, "peer_degraded_writes_total": 2, "peer_takeovers_total": 1,
                      "peer_replicas_refused_total": 4, "peer_handshake_refused_total": 0, "peer_unclaimed_nodes": ["node-c"],
                      "peer_owners_redirected_total": 6, "peer_refused_writes_total": 3, "peer_keys_refused_total": 0}


def test_a_failing_peers_status_leaves_the_status_answered_with_the_worst_case(caplog: Any) -> None:
    class BrokenPeers:
        def status(self) -> dict[str, Any]:
            raise KeyError("node-b")

    fields = peer_fields(peer_status(BrokenPeers()), 5 << 20, 12.5)
    assert fields["peer_state"] == "unknown" and fields["peers"] == []
    assert fields["single_copy_bytes"] == 5 << 20 and fields["single_copy_oldest_age_seconds"] == 12.5  # nothing known to be on a peer
    assert "could not read the peers' status" in caplog.text
