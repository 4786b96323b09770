"""The framework integrations (ckptfs.integrations, docs/training.md) with the real trainers on the CPU and
a real mount: a run saves three times and is killed (SIGKILL) while its fourth save is being written;
the next run resumes from the third, the newest *committed* checkpoint, never from the half-written
fourth; every commit carries the trainer's metadata, which another node reads back.

Each run is a subprocess (it must be killable), with a tiny model built from a config: nothing is
downloaded. The kill is deterministic: a callback ahead of ckptfs's, at the fourth save, leaves that
checkpoint's weights half-written and kills its own process before ckptfs's callback could commit it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ckptfs
from tests.conftest import Mount
from tests.support.extras import need

# store-side logic behind the control socket: the FUSE transport changes nothing here
pytestmark = pytest.mark.one_transport

# checkpoints are committed by the callbacks only, never because they went quiet
QUIET = {"checkpoint_quiet_seconds": 3600}

HALF_WRITE = '''
def half_write(path):
    """What a SIGKILL in the middle of writing `path` leaves: its first half."""
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    os.kill(os.getpid(), signal.SIGKILL)
'''

TRANSFORMERS_RUN = '''
import json, os, signal, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from ckptfs.integrations.transformers import CkptfsCallback, resume_checkpoint
''' + HALF_WRITE + '''
out, kill_at_save = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.tensor([(i + j) % 64 for j in range(16)])
        return {"input_ids": ids, "labels": ids}


class KillDuringSave(TrainerCallback):
    saves = 0

    def on_save(self, args, state, control, **kwargs):
        self.saves += 1
        if self.saves == kill_at_save:
            half_write(os.path.join(args.output_dir, f"checkpoint-{state.global_step}", "model.safetensors"))


# --- the recipe (docs/training.md) ---
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
args = TrainingArguments(output_dir=out, max_steps=8, save_steps=2, eval_strategy="steps", eval_steps=2,
                         logging_steps=1, per_device_train_batch_size=8, use_cpu=True, report_to="none", disable_tqdm=True)
committer = CkptfsCallback(metadata={"dataset": "tokens-v1"}, protect_best="eval_loss")
trainer = Trainer(model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(), callbacks=[KillDuringSave(), committer])
resume = resume_checkpoint(out)  # the newest committed checkpoint-N, or None
trainer.train(resume_from_checkpoint=resume)
# ---
print(json.dumps({"resumed_from": resume, "global_step": trainer.state.global_step, "commits": [c.step for c in committer.commits]}))
'''

LIGHTNING_RUN = '''
import json, os, signal, sys
import torch
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset
from ckptfs.integrations.lightning import CkptfsCallback, ckpt_path
''' + HALF_WRITE + '''
run_dir, kill_at_step = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)


class Tiny(pl.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class KillDuringSave(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == kill_at_step:
            trainer.save_checkpoint(os.path.join(run_dir, f"step_{kill_at_step}", "model.ckpt"))
            half_write(os.path.join(run_dir, f"step_{kill_at_step}", "model.ckpt"))


data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
# --- the recipe (docs/training.md) ---
committer = CkptfsCallback(run_dir, every_n_train_steps=2, metadata={"dataset": "random-v1"})
trainer = pl.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[KillDuringSave(), committer])
resume = ckpt_path(run_dir)  # RUN_DIR/step_N/model.ckpt of the newest committed step, or None
trainer.fit(Tiny(), data, ckpt_path=resume)
# ---
print(json.dumps({"resumed_from": resume, "global_step": trainer.global_step, "commits": [c.step for c in committer.commits]}))
'''

DCP_RUN = '''
import json, os, signal, sys
import torch
import torch.distributed.checkpoint
from ckptfs.integrations import dcp
''' + HALF_WRITE + '''
run_dir, kill_at_step = sys.argv[1], int(sys.argv[2])
model = torch.nn.Linear(4, 2)
# --- the recipe (docs/training.md) ---
state = {"model": model.state_dict(), "step": torch.tensor(0)}
resumed = dcp.load(state, run_dir)  # in place; the newest committed checkpoint (path, step, metadata), or None
for step in range(int(state["step"]) + 1, 5):
    with torch.no_grad():
        model.weight.add_(1.0)  # "training"
    if step == kill_at_step:
        torch.distributed.checkpoint.save({"model": model.state_dict(), "step": torch.tensor(step)}, checkpoint_id=f"{run_dir}/step_{step}")
        half_write(f"{run_dir}/step_{step}/__0_0.distcp")
    dcp.save({"model": model.state_dict(), "step": torch.tensor(step)}, f"{run_dir}/step_{step}",
             metadata={"weight_sum": float(model.weight.sum()), "lr": 1.0})
# ---
print(json.dumps({"resumed_from": str(resumed.path) if resumed else None, "resumed_metadata": resumed.metadata if resumed else None,
                  "weight_sum": float(model.weight.sum())}))
'''


def run(m: Mount, script: str, tmp_path: Path, *args: Any) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "run.py"
    path.write_text(script)
    env = {**m.env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


def killed(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def finished(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_transformers_trainer_resumes_from_the_newest_committed_checkpoint(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    need("transformers", "test")
    m: Mount = make_mount(**QUIET)
    out = m.path / "hf-run"
    killed(run(m, TRANSFORMERS_RUN, tmp_path, out, 4))  # saves at steps 2, 4, 6; killed writing step 8's
    assert ckptfs.latest(out, committed=False).step == 8  # type: ignore[union-attr]  # the newest by name: half-written
    assert [(c.step, c.committed) for c in ckptfs.checkpoints(out)] == [(2, True), (4, True), (6, True), (8, False)]

    result = finished(run(m, TRANSFORMERS_RUN, tmp_path, out, 0))
    assert result == {"resumed_from": str(out / "checkpoint-6"), "global_step": 8, "commits": [8]}

    other: Mount = make_mount("other", metadata_ttl=0, **QUIET)  # another node reads the metadata from the bucket
    proc = other.cli("checkpoints", str(other.path / "hf-run"), "--json")
    assert proc.returncode == 0, proc.stderr
    entries = {e["step"]: e for e in json.loads(proc.stdout)}
    assert sorted(entries) == [2, 4, 6, 8] and all(e["committed"] for e in entries.values())
    for step, e in entries.items():
        meta = e["metadata"]
        assert meta["trainer"] == "transformers" and meta["global_step"] == step and meta["dataset"] == "tokens-v1"
        assert meta["args"]["save_steps"] == 2 and meta["args"]["output_dir"] == str(out)
        assert {"loss", "learning_rate", "eval_loss"} <= set(meta["metrics"])
    best = min(entries.values(), key=lambda e: e["metadata"]["metrics"]["eval_loss"])
    assert [e["step"] for e in entries.values() if e["protected"]] == [best["step"]]


def test_lightning_resumes_from_the_newest_committed_checkpoint(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    need("lightning", "test")
    m: Mount = make_mount(**QUIET)
    run_dir = m.path / "pl-run"
    killed(run(m, LIGHTNING_RUN, tmp_path, run_dir, 8))  # saves at steps 2, 4, 6; killed writing step 8's
    assert [(c.step, c.committed) for c in ckptfs.checkpoints(run_dir)] == [(2, True), (4, True), (6, True), (8, False)]

    result = finished(run(m, LIGHTNING_RUN, tmp_path, run_dir, 0))
    assert result == {"resumed_from": str(run_dir / "step_6" / "model.ckpt"), "global_step": 8, "commits": [8]}
    for ck in ckptfs.checkpoints(run_dir):
        assert ck.committed and ck.metadata["trainer"] == "lightning" and ck.metadata["global_step"] == ck.step
        assert ck.metadata["hparams"] == {"lr": 0.05} and ck.metadata["dataset"] == "random-v1"
        assert isinstance(ck.metadata["metrics"]["train_loss"], float)


def test_dcp_loads_the_newest_committed_checkpoint(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    need("torch", "train")
    m: Mount = make_mount(**QUIET)
    run_dir = m.path / "dcp-run"
    killed(run(m, DCP_RUN, tmp_path, run_dir, 4))  # saves steps 1, 2, 3; killed writing step 4's
    assert [(c.step, c.committed) for c in ckptfs.checkpoints(run_dir)] == [(1, True), (2, True), (3, True), (4, False)]

    result = finished(run(m, DCP_RUN, tmp_path, run_dir, 0))
    assert result["resumed_from"] == str(run_dir / "step_3")
    step_3 = result["resumed_metadata"]
    assert step_3["lr"] == 1.0
    # resumed from step 3's weights (not re-initialised, not step 4's), then one step of training
    assert result["weight_sum"] == pytest.approx(step_3["weight_sum"] + 8.0)
    assert ckptfs.latest(run_dir).step == 4  # type: ignore[union-attr]
