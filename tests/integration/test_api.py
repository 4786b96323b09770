"""The Python API (`import ckptfs`, docs/training.md) against a real mount: commit with metadata, the
newest committed checkpoint, durability, protection, errors as exceptions, the async twins."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import trio

import ckptfs
from tests.conftest import Mount, write_random

# store-side logic behind the control socket: the FUSE transport changes nothing here
pytestmark = pytest.mark.one_transport

# a checkpoint is committed only by the calls under test, never because it went quiet
QUIET = {"checkpoint_quiet_seconds": 3600}


def save(step_dir: Path, seed: int) -> None:
    step_dir.mkdir(parents=True)
    write_random(step_dir / "model.bin", 64 << 10, seed=seed)
    (step_dir / "config.json").write_text(json.dumps({"step": seed}))


def test_commit_then_latest_returns_it_and_skips_a_newer_uncommitted_one(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(**QUIET)
    run = m.path / "run"
    for step in (100, 200):
        save(run / f"step_{step}", step)
        done = ckptfs.commit(run / f"step_{step}", {"eval_loss": 1 / step, "git_commit": "abc123", "config": {"lr": 3e-4}})
        assert (done.path, done.step, done.written, done.files) == (run / f"step_{step}", step, True, 2)
    save(run / "step_300", 300)  # written, never committed: a job killed before its commit

    ck = ckptfs.latest(run)
    assert ck is not None and (ck.path, ck.step) == (run / "step_200", 200)
    assert ck.metadata == {"eval_loss": 1 / 200, "git_commit": "abc123", "config": {"lr": 3e-4}}
    assert ckptfs.latest(run, committed=False).step == 300  # type: ignore[union-attr]
    assert ckptfs.state(run / "step_200") == "committed" and ckptfs.state(run / "step_300") in ("writing", "draining")
    assert [(c.step, c.committed) for c in ckptfs.checkpoints(run)] == [(100, True), (200, True), (300, False)]

    again = ckptfs.commit(run / "step_200", {"eval_loss": 1 / 200, "git_commit": "abc123", "config": {"lr": 3e-4}})
    assert not again.written  # already committed with this content and metadata


def test_metadata_is_read_back_by_another_node(make_mount) -> None:  # type: ignore[no-untyped-def]
    a: Mount = make_mount("a", **QUIET)
    save(a.path / "run" / "checkpoint-5", 5)
    ckptfs.commit(a.path / "run" / "checkpoint-5", {"dataset": "s3://data/snap-7"})
    b: Mount = make_mount("b", metadata_ttl=0, **QUIET)
    ck = ckptfs.latest(b.path / "run")
    assert ck is not None and ck.path == b.path / "run" / "checkpoint-5" and ck.metadata == {"dataset": "s3://data/snap-7"}
    proc = b.cli("checkpoints", str(b.path / "run"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [e["metadata"] for e in json.loads(proc.stdout)] == [{"dataset": "s3://data/snap-7"}]


def test_wait_durable_and_the_state_of_a_file(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(upload_delay=0.2)
    (m.path / "a").mkdir()
    write_random(m.path / "a" / "w.bin", 2 << 20, seed=1)
    ckptfs.wait_durable(m.path / "a", timeout=300)
    assert ckptfs.state(m.path / "a" / "w.bin") == "durable"


def test_protect_refuses_changes(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(**QUIET)
    save(m.path / "step_1", 1)
    ckptfs.commit(m.path / "step_1")
    assert "protected" in ckptfs.protect(m.path / "step_1", "golden: the release candidate")
    assert ckptfs.state(m.path / "step_1") == "protected"
    with pytest.raises(PermissionError):
        os.unlink(m.path / "step_1" / "model.bin")
    ckptfs.unprotect(m.path / "step_1", "test over")
    assert ckptfs.state(m.path / "step_1") == "committed"


def test_errors_are_exceptions_with_the_clis_line(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(**QUIET)
    (m.path / "plain").mkdir()
    cases = [
        (lambda: ckptfs.latest(tmp_path), ["checkpoints", str(tmp_path)]),  # not in a mount
        (lambda: ckptfs.commit(m.path / "plain"), ["checkpoint", "commit", str(m.path / "plain")]),  # not a checkpoint
        (lambda: ckptfs.protect(m.path / "nope" / "step_1", "why"), ["protect", str(m.path / "nope" / "step_1"), "--reason", "why"]),
    ]
    for call, argv in cases:
        with pytest.raises(ckptfs.CkptfsError) as caught:
            call()
        proc = m.cli(*argv)
        assert proc.returncode == 1 and proc.stderr == f"ckptfs: error: {caught.value}\n", (argv, proc.stderr)
        assert "\n" not in str(caught.value)
    with pytest.raises(ckptfs.CkptfsError, match="is a directory but not a checkpoint"):
        ckptfs.state(m.path / "plain")


def test_async_twins_under_asyncio_and_trio(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(**QUIET)
    save(m.path / "run" / "step_1", 1)
    save(m.path / "run" / "step_2", 2)

    async def commit_and_find(step: int) -> ckptfs.Checkpoint | None:
        await ckptfs.wait_durable_async(m.path / "run" / f"step_{step}")
        await ckptfs.commit_async(m.path / "run" / f"step_{step}", {"by": "async"})
        assert await ckptfs.state_async(m.path / "run" / f"step_{step}") == "committed"
        return await ckptfs.latest_async(m.path / "run")

    ck = asyncio.run(commit_and_find(1))
    assert ck is not None and ck.step == 1
    ck = trio.run(commit_and_find, 2)
    assert ck is not None and ck.step == 2 and ck.metadata == {"by": "async"}

    async def not_a_checkpoint() -> None:
        await ckptfs.commit_async(m.path / "run")

    with pytest.raises(ckptfs.CkptfsError, match="is not a checkpoint"):
        asyncio.run(not_a_checkpoint())
    with pytest.raises(ckptfs.CkptfsError, match="is not a checkpoint"):
        trio.run(not_a_checkpoint)
