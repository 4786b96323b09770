"""A small CPU training loop that checkpoints into a ckptfs mount the way production jobs should.

    python examples/train_loop.py --dir /mnt/ckpt/run1 --steps 200 --every 20

* Every `--every` steps it writes `step_N.tmp/{model.pt,optim.pt,meta.json}`, fsyncs each file,
  then renames the directory to `step_N/`: the step appears whole or not at all, and (with
  ckptfs) only `step_N/...` keys ever reach the bucket. Training goes on at once while ckptfs
  drains the checkpoint in the background.
* On SIGTERM (a preemption notice) it writes an emergency checkpoint of the current step and exits.
* On start it resumes from the newest *durable* checkpoint: one whose every file has
  `user.ckptfs.state == durable`, i.e. is in the bucket and survives the loss of this node. A
  newer checkpoint still draining is ignored (and removed), since another node could not see it.
* The loss of every step is appended to `--dir/loss.jsonl`; training is deterministic (fixed
  seeds, one thread, data drawn per step from a seeded generator), so a resumed run continues
  the loss curve exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

STATE_XATTR = "user.ckptfs.state"


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of step `step`, the same whenever it is drawn (so a resumed run sees the same data)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(128, 64, generator=g)
    return x, x[:, :8].sum(dim=1, keepdim=True).sin()


def durable(path: Path) -> bool:
    """True if ckptfs reports every file under `path` durable (no xattr: not on ckptfs, trust the disk)."""
    for f in path.rglob("*"):
        if f.is_file():
            try:
                if os.getxattr(f, STATE_XATTR) != b"durable":
                    return False
            except OSError:
                return True
    return True


def newest_durable(run_dir: Path) -> Path | None:
    steps = sorted((int(m.group(1)), p) for p in run_dir.glob("step_*")
                   if (m := re.fullmatch(r"step_(\d+)", p.name)) and p.is_dir())
    for _, path in reversed(steps):
        if (path / "meta.json").exists() and durable(path):
            return path
    return None


def write_file(path: Path, write) -> None:  # type: ignore[no-untyped-def]
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def save(run_dir: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> Path:
    tmp, final = run_dir / f"step_{step}.tmp", run_dir / f"step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_file(tmp / "model.pt", lambda f: torch.save(model.state_dict(), f))
    write_file(tmp / "optim.pt", lambda f: torch.save(opt.state_dict(), f))
    write_file(tmp / "meta.json", lambda f: f.write(json.dumps({"step": step}).encode()))
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, type=Path, help="run directory (on the ckptfs mount)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=20, help="checkpoint every N steps")
    ap.add_argument("--step-seconds", type=float, default=0.0, help="pretend each step takes this long")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    run_dir: Path = args.dir
    run_dir.mkdir(parents=True, exist_ok=True)
    model, opt = model_and_optimizer()
    start = 0
    resume = newest_durable(run_dir)
    if resume is not None:
        model.load_state_dict(torch.load(resume / "model.pt"))
        opt.load_state_dict(torch.load(resume / "optim.pt"))
        start = json.loads((resume / "meta.json").read_text())["step"]
        print(f"resumed from {resume.name}", flush=True)
    for stale in run_dir.glob("step_*"):  # newer but not durable, or half written: not a checkpoint
        if stale.is_dir() and stale != resume and (not re.fullmatch(r"step_\d+", stale.name) or int(stale.name[5:]) > start):
            shutil.rmtree(stale)

    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    loss_fn = nn.MSELoss()
    with open(run_dir / "loss.jsonl", "a") as losses:
        step = start
        while step < args.steps:
            step += 1
            x, y = batch(step)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            losses.flush()
            if args.step_seconds:
                time.sleep(args.step_seconds)
            if step % args.every == 0 or step == args.steps:
                save(run_dir, step, model, opt)
            if stop["asked"]:
                if step % args.every:
                    save(run_dir, step, model, opt)  # the emergency checkpoint
                print(f"SIGTERM: saved step_{step}, exiting", flush=True)
                return 0
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
