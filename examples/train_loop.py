"""A small CPU training loop that checkpoints into a ckptfs mount the way production jobs should.

    .venv/bin/pip install torch==2.13.0    # PyTorch (CPU), which `make run`'s venv does not have;
                                           # or: pip install -e '.[train]' from the checkout
    .venv/bin/python examples/train_loop.py --dir mnt/run1 --steps 200 --every 20

* Every `--every` steps it writes `step_N.tmp/{model.pt,optim.pt}`, fsyncs each file, then renames
  the directory to `step_N/`: the step appears whole or not at all, and only `step_N/...` keys ever
  reach the bucket. Then it commits the step with `ckptfs.commit` (its loss in the manifest) in a
  background thread: the commit waits until the files are durable in the bucket, and training goes
  on meanwhile.
* On SIGTERM (a preemption notice) it writes an emergency checkpoint of the current step, waits for
  its commit and exits.
* On start it resumes from `ckptfs.latest(--dir)`: the newest *committed* checkpoint. A newer
  directory (written, but killed before its commit) is not a checkpoint to resume from; it is left
  as it is until training reaches that step again and writes it anew.
* The loss of every step is appended to `--dir/loss.jsonl`; training is deterministic (fixed
  seeds, one thread, data drawn per step from a seeded generator), so a resumed run continues
  the loss curve exactly.

--dir must be in a ckptfs mount (docs/training.md). Since this job commits its own checkpoints,
mount with a long `checkpoint_quiet_seconds` if the daemon should not commit the others.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

try:
    import torch
    from torch import nn
except ImportError:
    sys.exit("train_loop.py needs PyTorch, which is not installed here: .venv/bin/pip install torch==2.13.0 "
             "(or pip install -e '.[train]' from the checkout)")

import ckptfs


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of step `step`, the same whenever it is drawn (so a resumed run sees the same data)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(128, 64, generator=g)
    return x, x[:, :8].sum(dim=1, keepdim=True).sin()


def write_file(path: Path, write) -> None:  # type: ignore[no-untyped-def]
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def save(run_dir: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> Path:
    tmp, final = run_dir / f"step_{step}.tmp", run_dir / f"step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while writing it
    tmp.mkdir()
    write_file(tmp / "model.pt", lambda f: torch.save(model.state_dict(), f))
    write_file(tmp / "optim.pt", lambda f: torch.save(opt.state_dict(), f))
    if final.exists():
        shutil.rmtree(final)  # this step of an earlier attempt, never committed (we resumed from an older one)
    os.rename(tmp, final)
    return final


def train(args: argparse.Namespace, commits: ThreadPoolExecutor) -> int:
    run_dir: Path = args.dir
    model, opt = model_and_optimizer()
    start = 0
    resume = ckptfs.latest(run_dir)  # the newest committed checkpoint, or None
    if resume is not None:
        model.load_state_dict(torch.load(resume.path / "model.pt"))
        opt.load_state_dict(torch.load(resume.path / "optim.pt"))
        start = resume.step
        print(f"resumed from {resume.path.name} (loss {resume.metadata.get('loss')})", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)

    pending: list[Future[ckptfs.Commit]] = []

    def checkpoint(step: int, loss: float) -> None:
        for done in [f for f in pending if f.done()]:
            done.result()  # a commit that failed stops the job (its CkptfsError says why)
            pending.remove(done)
        path = save(run_dir, step, model, opt)
        pending.append(commits.submit(ckptfs.commit, path, {"step": step, "loss": loss}))

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
            if step % args.every == 0 or step == args.steps or stop["asked"]:
                checkpoint(step, loss.item())  # at SIGTERM: the emergency checkpoint
            if stop["asked"]:
                break
    for f in pending:
        last = f.result()  # every checkpoint committed before the job says it is done
    what = f"SIGTERM: saved step_{step}, exiting" if stop["asked"] else f"done at step {step}"
    print(f"{what} (committed {last.path.name})" if pending else what, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, type=Path, help="run directory (in a ckptfs mount)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=20, help="checkpoint every N steps")
    ap.add_argument("--step-seconds", type=float, default=0.0, help="pretend each step takes this long")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="commit") as commits:  # commits in order
            return train(args, commits)
    except ckptfs.CkptfsError as e:
        print(f"train_loop.py: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
