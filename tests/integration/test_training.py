"""Real training clients end to end: PyTorch DCP across ranks, torch.save, safetensors, tmp-dir
rename, and a training loop killed and resumed. Checkpoints come back through a fresh mount
(empty cache) on the same bucket, bit-identical."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
import pytest

from tests.conftest import ROOT, Mount, sha256_file, wait_for
from tests.support.extras import need

torch = need("torch", "train")

MiB = 1 << 20


def durable_order(m: Mount) -> list[str]:
    """Keys in the order this node made them durable (its log)."""
    return re.findall(r"durable: (\S+) \(", (m.cache_dir / "ckptfs.log").read_text())


def python(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_dcp_four_ranks_save_flush_and_load_on_a_fresh_mount(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a: Mount = make_mount("a")
    step = a.path / "run" / "step_100"
    digests = tmp_path / "digests.json"
    python("-m", "tests.support.dcp_job", "save", str(step), str(digests))
    proc = a.cli("flush", str(step), "--timeout", "600", timeout=700)
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in step.iterdir())
    shards = [f for f in files if f.endswith(".distcp")]
    assert ".metadata" in files and len(shards) == 4
    total = sum((step / f).stat().st_size for f in files)
    assert total >= 256 * MiB
    # the commit marker reached the bucket only after every shard of the step
    order = durable_order(a)
    marker = order.index(a.key("run/step_100/.metadata"))
    assert all(order.index(a.key(f"run/step_100/{s}")) < marker for s in shards)
    heads = {f: a.head(f"run/step_100/{f}")["LastModified"] for f in files}
    assert heads[".metadata"] >= max(heads[s] for s in shards)
    for f in files:
        assert a.object_sha256(f"run/step_100/{f}") == sha256_file(step / f)

    b: Mount = make_mount("b")  # another node: empty cache, same bucket
    python("-m", "tests.support.dcp_job", "load", str(b.path / "run" / "step_100"), str(digests))
    st = b.status()
    assert st["fetched_bytes_total"] >= total - 1 * MiB  # every shard came from the bucket
    assert st["checksum_mismatches_total"] == 0

    # the step is a checkpoint: committed on the writing node, seen whole from the other one
    proc = a.cli("checkpoint", "commit", str(step))
    assert proc.returncode == 0, proc.stderr
    proc = b.cli("checkpoints", str(b.path / "run"), "--json")
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(proc.stdout)
    assert (entry["path"], entry["step"], entry["state"], entry["files"], entry["bytes"]) == ("run/step_100", 100, "committed", len(files), total)
    proc = b.cli("verify", str(b.path / "run" / "step_100"), "--deep")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_torch_save_tmp_fsync_rename_then_load_on_a_fresh_mount(make_mount) -> None:  # type: ignore[no-untyped-def]
    a: Mount = make_mount("a")
    torch.manual_seed(3)
    state = {"w": torch.randn(1024, 1024), "b": torch.randn(1024), "step": torch.tensor(7)}
    tmp, final = a.path / "model.pt.tmp", a.path / "model.pt"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, final)
    a.flush()
    assert a.keys() == [a.key("model.pt")]
    assert all(not k.endswith(".tmp") for k in durable_order(a))  # the tmp key never reached the bucket
    assert a.status()["uploaded_bytes_total"] == final.stat().st_size
    b: Mount = make_mount("b")
    loaded = torch.load(b.path / "model.pt")
    assert loaded.keys() == state.keys()
    for k in state:
        assert torch.equal(loaded[k], state[k])


def test_safetensors_round_trip_through_a_fresh_mount(make_mount) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file, save_file

    a: Mount = make_mount("a")
    torch.manual_seed(4)
    tensors = {f"layer{i}.weight": torch.randn(512, 512) for i in range(8)}
    tensors["embed"] = torch.randn(4096, 64).to(torch.bfloat16)
    save_file(tensors, str(a.path / "model.safetensors"), metadata={"format": "pt"})
    a.flush()
    assert a.keys() == [a.key("model.safetensors")]
    b: Mount = make_mount("b")
    loaded = load_file(str(b.path / "model.safetensors"))
    assert loaded.keys() == tensors.keys()
    for k, v in tensors.items():
        assert torch.equal(loaded[k], v)
    assert sha256_file(b.path / "model.safetensors") == sha256_file(a.path / "model.safetensors")


def test_step_tmp_directory_renamed_whole(make_mount) -> None:  # type: ignore[no-untyped-def]
    a: Mount = make_mount("a", upload_delay=1)
    tmp = a.path / "step_5.tmp"
    tmp.mkdir()
    sizes = {}
    for rank in range(4):
        with open(tmp / f"shard_{rank}.pt", "wb") as f:
            torch.save({"t": torch.full((256, 1024), float(rank))}, f)
            f.flush()
            os.fsync(f.fileno())
        sizes[f"shard_{rank}.pt"] = (tmp / f"shard_{rank}.pt").stat().st_size
    os.rename(tmp, a.path / "step_5")
    a.flush()
    assert a.keys() == sorted(a.key(f"step_5/{n}") for n in sizes)
    assert all("step_5.tmp" not in k for k in durable_order(a))  # nothing was ever published under the tmp name
    assert "copied from" not in (a.cache_dir / "ckptfs.log").read_text()  # no object was copied
    assert a.status()["uploaded_bytes_total"] == sum(sizes.values())  # every byte sent once


def read_losses(path: Path) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out.setdefault(rec["step"], []).append(rec["loss"])
    return out


def test_train_loop_killed_resumes_from_newest_committed_checkpoint(make_mount) -> None:  # type: ignore[no-untyped-def]
    """examples/train_loop.py as docs/training.md says: it commits each step with ckptfs.commit and resumes
    from ckptfs.latest, the newest committed checkpoint, even with a newer directory (written, never
    committed) beside it; the loss curve continues exactly.

    Before: it resumed from the newest directory whose files were durable (xattrs), committed or not,
    and deleted every newer directory at start."""
    import ckptfs

    steps, every = 60, 10
    # checkpoint_quiet_seconds: the job commits its own checkpoints; the daemon does not commit the others
    a: Mount = make_mount("a", checkpoint_quiet_seconds=3600)
    loop = [sys.executable, str(ROOT / "examples" / "train_loop.py"), "--steps", str(steps), "--every", str(every)]
    # the reference: the same run, uninterrupted
    done = subprocess.run([*loop, "--dir", str(a.path / "reference")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    reference = read_losses(a.path / "reference" / "loss.jsonl")
    assert sorted(reference) == list(range(1, steps + 1))
    assert done.stdout.strip().endswith(f"done at step {steps} (committed step_{steps})"), done.stdout
    assert ckptfs.latest(a.path / "reference").step == steps  # type: ignore[union-attr]

    run = a.path / "run"
    proc = subprocess.Popen([*loop, "--dir", str(run), "--step-seconds", "0.05"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("a committed step_30", lambda: (ck := ckptfs.latest(run)) is not None and ck.step >= 30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    a.flush()  # what the killed job wrote drains; what it did not commit stays uncommitted
    newest = ckptfs.latest(run)
    assert newest is not None and newest.metadata["step"] == newest.step and newest.metadata["loss"] == reference[newest.step][0]
    # a step written after it whose commit never came (the job killed between its rename and its commit)
    unfinished = run / f"step_{newest.step + every}"
    if not unfinished.exists():
        shutil.copytree(newest.path, unfinished)
    a.flush()
    assert ckptfs.state(unfinished) != "committed" and os.getxattr(unfinished / "model.pt", "user.ckptfs.state") == b"durable"

    out = subprocess.run([*loop, "--dir", str(run)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"resumed from step_{newest.step} "), out.stdout
    losses = read_losses(run / "loss.jsonl")
    assert sorted(losses) == list(range(1, steps + 1))
    for step, values in losses.items():
        assert all(v == reference[step][0] for v in values), step  # the curve continues exactly
    assert len(losses[newest.step + 1]) == 2  # steps after the checkpoint were run twice, identically
    # every step is committed now, the unfinished one written again, with the loss of its step
    committed = {ck.step: ck for ck in ckptfs.checkpoints(run) if ck.committed}
    assert sorted(committed) == list(range(every, steps + 1, every))
    assert committed[newest.step + every].metadata["loss"] == reference[newest.step + every][0]


def test_train_loop_sigterm_writes_and_commits_an_emergency_checkpoint(make_mount) -> None:  # type: ignore[no-untyped-def]
    import ckptfs

    a: Mount = make_mount("a")
    run = a.path / "run"
    loop = [sys.executable, str(ROOT / "examples" / "train_loop.py"), "--dir", str(run), "--steps", "1000", "--every", "100",
            "--step-seconds", "0.05"]
    proc = subprocess.Popen(loop, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for("step 15", lambda: (run / "loss.jsonl").exists() and max(read_losses(run / "loss.jsonl"), default=0) >= 15)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    saved = int(re.search(r"saved step_(\d+)", out).group(1))  # type: ignore[union-attr]
    assert f"(committed step_{saved})" in out, out
    assert os.getxattr(run / f"step_{saved}" / "model.pt", "user.ckptfs.state") == b"durable"
    assert a.object_sha256(f"run/step_{saved}/model.pt") == sha256_file(run / f"step_{saved}" / "model.pt")
    latest = ckptfs.latest(run)
    assert latest is not None and latest.step == saved and ckptfs.state(run / f"step_{saved}") == "committed"


def test_train_loop_outside_a_mount_says_so_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "train_loop.py"), "--dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().startswith("train_loop.py: ") and "is not inside a ckptfs mount" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
