"""The Python API (`import ckptfs`) and its control-socket client against a fake daemon: the protocol's
edge cases (an error reply, a closed stream, a silent daemon), the async twins under asyncio and trio,
and that `import ckptfs` stays cheap. The real daemon is in tests/integration/test_api.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

import ckptfs
from ckptfs import api, client
from ckptfs.integrations.committer import Committer, jsonable, require
from tests.support.extras import need


class FakeDaemon:
    """A Unix socket that answers each request with the JSON lines queued for it (then closes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.replies: list[list[Any]] = []  # per connection: lines (dicts, or raw bytes), or "hang"
        self.requests: list[dict[str, Any]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            buf = b""
            while b"\n" not in buf:
                buf += conn.recv(65536)
            self.requests.append(json.loads(buf.split(b"\n")[0]))
            lines = self.replies.pop(0) if self.replies else []
            if lines == ["hang"]:
                self.held.append(conn)  # says nothing, keeps the connection open
                continue
            try:
                for line in lines:
                    conn.sendall(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")
            except BrokenPipeError:
                pass  # the client gave up first (the test of a timeout): what it was owed no longer matters
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDaemon]:
    """A fake daemon serving the 'mount' tmp_path/mnt: locating a path in it needs no FUSE."""
    mnt = tmp_path / "mnt"
    (mnt / "run" / "step_3").mkdir(parents=True)
    fake = FakeDaemon(tmp_path / "control.sock")
    monkeypatch.setattr(api, "locate", lambda path: (mnt, client.rel_path(mnt, path)))
    monkeypatch.setattr(api, "locate_above", lambda path: (mnt, client.rel_path(mnt, path)))
    monkeypatch.setattr(client, "control_socket", lambda root: str(fake.path))
    yield fake
    fake.close()


def entry(path: str, step: int, state: str = "committed", **extra: Any) -> dict[str, Any]:
    return {"path": path, "step": step, "state": state, "committed": state in ("committed", "protected"),
            "metadata": {}, **extra}


def test_import_ckptfs_loads_no_daemon_nor_heavy_library() -> None:
    code = ("import sys, ckptfs; heavy = ('trio', 'boto3', 'botocore', 'pyfuse3', 'typer', 'rich', 'ckptfs.daemon', "
            "'ckptfs.config', 'ckptfs.cli', 'asyncio', 'transformers', 'torch'); print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_error_reply_is_an_exception_with_its_line(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies.append([{"ok": False, "error": "run/step_3 is not committed (no manifest): nothing to verify against"}])
    with pytest.raises(ckptfs.CkptfsError, match=r"^run/step_3 is not committed \(no manifest\)"):
        ckptfs.checkpoints(tmp_path / "mnt" / "run")


def test_a_commit_stream_closed_before_done_is_stopped_early(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies.append([{"ok": True, "files": 2, "bytes": 10, "deletes": 0}])
    with pytest.raises(ckptfs.StoppedEarly, match="the daemon stopped before the commit finished"):
        ckptfs.commit(tmp_path / "mnt" / "run" / "step_3", {"loss": 0.5})


def test_commit_sends_the_metadata_and_reads_the_final_line(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies.append([{"ok": True, "files": 1, "bytes": 5, "deletes": 0},
                           {"ok": True, "done": True, "written": True, "path": "run/step_3", "step": 3, "generation": 1,
                            "changed": False, "files": 2, "bytes": 10}])
    done = ckptfs.commit(tmp_path / "mnt" / "run" / "step_3", {"loss": 0.5, "tags": ["a"]})
    assert daemon.requests[-1] == {"cmd": "checkpoint_commit", "path": "run/step_3", "metadata": {"loss": 0.5, "tags": ["a"]}}
    assert (done.path, done.step, done.generation, done.written) == (tmp_path / "mnt" / "run" / "step_3", 3, 1, True)


def test_metadata_that_is_not_json_is_refused_before_sending(daemon: FakeDaemon, tmp_path: Path) -> None:
    with pytest.raises(ckptfs.CkptfsError, match="metadata must be JSON"):
        ckptfs.commit(tmp_path / "mnt" / "run" / "step_3", {"model": object()})
    assert daemon.requests == []


def test_api_errors_are_one_clear_line_in_the_apis_words(daemon: FakeDaemon, tmp_path: Path) -> None:
    """Issue 35: a wrong argument is a CkptfsError naming the call and the fix, never a bare ValueError or TypeError,
    nor the CLI's wording (--reason TEXT); nothing is sent."""
    step = tmp_path / "mnt" / "run" / "step_3"
    with pytest.raises(ckptfs.CkptfsError, match=r"^commit: metadata must be a dict .*not str$"):
        ckptfs.commit(step, "notadict")  # type: ignore[arg-type]
    with pytest.raises(ckptfs.CkptfsError, match=r"^commit: metadata must be a dict .*not list$"):
        ckptfs.commit(step, [("loss", 1.0)])  # type: ignore[arg-type]
    for call in (ckptfs.protect, ckptfs.unprotect):
        for reason in ("", "   ", None):
            with pytest.raises(ckptfs.CkptfsError, match=rf"^{call.__name__} needs a non-empty reason") as e:
                call(step, reason)  # type: ignore[arg-type]
            assert "--reason" not in str(e.value)
    with pytest.raises(ckptfs.CkptfsError, match=r"^latest: the path must be a str or a pathlib.Path, not int$"):
        ckptfs.latest(7)  # type: ignore[arg-type]
    with pytest.raises(ckptfs.CkptfsError, match=r"^wait_durable: timeout '5': give a number of seconds"):
        ckptfs.wait_durable(step, "5")  # type: ignore[arg-type]
    assert daemon.requests == []


def test_non_finite_metadata_goes_as_null(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies.append([{"ok": True, "done": True, "written": True, "path": "run/step_3", "step": 3, "generation": 1,
                            "changed": False, "files": 2, "bytes": 10}])
    ckptfs.commit(tmp_path / "mnt" / "run" / "step_3", {"loss": float("nan"), "best": [float("inf"), 0.5]})
    assert daemon.requests[-1]["metadata"] == {"loss": None, "best": [None, 0.5]}


def test_latest_takes_the_newest_committed_checkpoint(daemon: FakeDaemon, tmp_path: Path) -> None:
    listing = [entry("run/step_1", 1), entry("run/step_3", 3, metadata={"loss": 0.3}), entry("run/step_4", 4, "writing"),
               entry("run/step_5", 5, "draining", committed=True), entry("run/step_2", 2, "protected")]
    daemon.replies += [[{"ok": True, "checkpoints": listing}]] * 2
    ck = ckptfs.latest(tmp_path / "mnt" / "run")
    assert ck is not None and (ck.path, ck.step, ck.metadata) == (tmp_path / "mnt" / "run" / "step_3", 3, {"loss": 0.3})
    newest = ckptfs.latest(tmp_path / "mnt" / "run", committed=False)
    assert newest is not None and newest.step == 5


def test_latest_of_a_run_without_checkpoints_is_none(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies.append([{"ok": True, "checkpoints": [entry("run/step_4", 4, "writing")]}])
    assert ckptfs.latest(tmp_path / "mnt" / "run") is None


def test_latest_of_a_run_not_started_yet_is_none(daemon: FakeDaemon, tmp_path: Path) -> None:
    assert ckptfs.latest(tmp_path / "mnt" / "new-run") is None
    assert daemon.requests == []


def test_state_of_a_directory_that_is_not_a_checkpoint(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies.append([{"ok": True, "checkpoints": [entry("run/step_3", 3)]}])
    with pytest.raises(ckptfs.CkptfsError, match="is a directory but not a checkpoint"):
        ckptfs.state(tmp_path / "mnt" / "run")


def test_wait_durable_past_its_timeout_says_what_is_left(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies.append([{"ok": True, "files": 3, "bytes": 3 << 20, "deletes": 1, "uploaded_bytes": 1 << 20}] * 50)
    with pytest.raises(ckptfs.TimedOut, match=r"timed out after 1e-06s: 3 files \(3\.0 MiB, 1\.0 MiB of it in the bucket already\) "
                                              r"and 1 deletion under .*/run are not durable yet; see `ckptfs status"):
        ckptfs.wait_durable(tmp_path / "mnt" / "run", timeout=1e-6)


def test_a_daemon_that_does_not_answer_times_out(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies.append(["hang"])
    with pytest.raises(ckptfs.TimedOut, match="timed out after 0.01s waiting for .*/run to become durable"):
        ckptfs.wait_durable(tmp_path / "mnt" / "run", timeout=0.01)


def test_async_twins_under_asyncio_and_trio(daemon: FakeDaemon, tmp_path: Path) -> None:
    import asyncio

    import trio

    run = tmp_path / "mnt" / "run"
    daemon.replies += [[{"ok": True, "checkpoints": [entry("run/step_3", 3)]}]] * 2
    assert asyncio.run(ckptfs.latest_async(run)).step == 3  # type: ignore[union-attr]
    assert trio.run(ckptfs.latest_async, run).step == 3  # type: ignore[union-attr]
    daemon.replies += [[{"ok": False, "error": "no"}]] * 2
    with pytest.raises(ckptfs.CkptfsError, match="^no$"):
        asyncio.run(ckptfs.checkpoints_async(run))
    with pytest.raises(ckptfs.CkptfsError, match="^no$"):
        trio.run(ckptfs.checkpoints_async, run)


def test_a_cancelled_async_call_returns_at_once(daemon: FakeDaemon, tmp_path: Path) -> None:
    """The thread stays blocked on a silent daemon; the caller's cancellation does not wait for it."""
    import asyncio

    import trio

    daemon.replies += [["hang"], ["hang"]]

    async def under_trio() -> None:
        with trio.move_on_after(0.2):
            await ckptfs.wait_durable_async(tmp_path / "mnt" / "run")
            raise AssertionError("a silent daemon answered")

    async def under_asyncio() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ckptfs.wait_durable_async(tmp_path / "mnt" / "run"), 0.2)

    trio.run(under_trio)
    asyncio.run(under_asyncio())


def test_jsonable_makes_metrics_plain() -> None:
    torch = need("torch", "train")
    doc = jsonable({"loss": torch.tensor(0.25), "nan": float("nan"), "n": 3, "path": Path("/x"), "t": (1, 2)})
    assert doc == {"loss": 0.25, "nan": None, "n": 3, "path": "/x", "t": [1, 2]}
    json.dumps(doc, allow_nan=False)


def test_committer_keeps_the_best_protected(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    before = ckptfs.Checkpoint(path=Path("/m/run/step_0"), step=0, state="protected", committed=True, protected=True,
                               metadata={"metrics": {"eval_loss": 0.6}}, info={"protection": {"reason": "best eval_loss so far: 0.6"}})
    monkeypatch.setattr("ckptfs.integrations.committer.checkpoints", lambda run_dir: [before] if run_dir == "/m/run" else [])
    monkeypatch.setattr("ckptfs.integrations.committer.commit", lambda path, metadata: ckptfs.Commit(Path(path), 1, 1, True, False, 1, 1))
    monkeypatch.setattr("ckptfs.integrations.committer.protect", lambda path, reason: calls.append(("protect", path)))
    monkeypatch.setattr("ckptfs.integrations.committer.unprotect", lambda path, reason: calls.append(("unprotect", path)))
    c = Committer(protect_best="eval_loss")
    for step, loss in ((1, 0.5), (2, 0.7), (3, 0.3), (4, None)):
        c.commit(f"/m/run/step_{step}", {"metrics": {"eval_loss": loss} if loss is not None else {}})
    # a run resumed after step_0 was protected as its best: one stays protected
    assert calls == [("protect", "/m/run/step_1"), ("unprotect", "/m/run/step_0"), ("protect", "/m/run/step_3"), ("unprotect", "/m/run/step_1")]
    assert Committer(protect_best="accuracy").greater_is_better


def test_a_missing_framework_says_what_to_install() -> None:
    with pytest.raises(ImportError, match="ckptfs.integrations.x needs no-such-framework, which is not installed here: pip install no-such-framework"):
        require("no_such_framework", "no-such-framework", "ckptfs.integrations.x")


def test_wait_durable_for_level_replicated_asks_the_daemon_for_it(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies += [[{"ok": True, "files": 1, "bytes": 5, "deletes": 0}, {"ok": True, "done": True}]] * 2
    ckptfs.wait_durable(tmp_path / "mnt" / "run", level="replicated")
    ckptfs.wait_durable(tmp_path / "mnt" / "run")
    assert daemon.requests == [{"cmd": "flush", "path": "run", "level": "replicated"},
                               {"cmd": "flush", "path": "run"}]  # durable: the request an older daemon understands too


def test_wait_durable_with_a_level_that_is_not_one_is_refused_before_sending(daemon: FakeDaemon, tmp_path: Path) -> None:
    with pytest.raises(ckptfs.CkptfsError, match=r"""^wait_durable: level 'on-peers': give "durable" \(in the bucket\) or "replicated" """
                                                 r"""\(on peers' disks too, with durability = peer\)$"""):
        ckptfs.wait_durable(tmp_path / "mnt" / "run", level="on-peers")  # type: ignore[arg-type]
    assert daemon.requests == []


def test_wait_replicated_past_its_timeout_says_what_is_not_replicated(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.replies.append([{"ok": True, "files": 2, "bytes": 2 << 20, "deletes": 0}] * 50)
    with pytest.raises(ckptfs.TimedOut, match=r"timed out after 1e-06s: 2 files \(2\.0 MiB\) under .*/run are not replicated yet; "
                                              r"see `ckptfs status"):
        ckptfs.wait_durable(tmp_path / "mnt" / "run", timeout=1e-6, level="replicated")


def test_a_mount_without_peers_refuses_level_replicated_in_one_line(daemon: FakeDaemon, tmp_path: Path) -> None:
    import asyncio

    line = "level replicated needs durability = peer, and this mount has durability = local (no peer holds copies): ..."
    daemon.replies += [[{"ok": False, "error": line}]] * 2
    with pytest.raises(ckptfs.CkptfsError, match="^level replicated needs durability = peer"):
        ckptfs.wait_durable(tmp_path / "mnt" / "run", level="replicated")
    with pytest.raises(ckptfs.CkptfsError, match="^level replicated needs durability = peer"):
        asyncio.run(ckptfs.wait_durable_async(tmp_path / "mnt" / "run", 60, "replicated"))
    assert daemon.requests[-1] == {"cmd": "flush", "path": "run", "level": "replicated"}
