"""Real trainers saving three checkpoints each on the CPU, run by tests/integration/test_trainers.py as a subprocess.

    python -m tests.support.trainers KIND ROOT OUT.json     (KIND: orbax | transformers | lightning | dcp)

Every model is tiny and built from a config: nothing is downloaded. After each save the job waits
until the mount holds it durable (`ckptfs.wait_durable`), so a file the trainer later rotates away
(max_to_keep, save_total_limit) was uploaded once like every other; then it records each file under
ROOT that is new or changed since the last look, with its size. OUT.json holds those bytes written
and, for the newest checkpoint, every file's sha256 (what a second mount must read back).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import ckptfs

SAVES = 3


class Ledger:
    """What the job wrote through the mount, looked at after each save."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) at the last look
        self.written = 0

    def after_save(self) -> None:
        ckptfs.wait_durable(self.root, timeout=300)
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                st = p.stat()
                rel = str(p.relative_to(self.root))
                if self.seen.get(rel) != (st.st_size, st.st_mtime_ns):
                    self.seen[rel] = (st.st_size, st.st_mtime_ns)
                    self.written += st.st_size


def digests(path: Path) -> dict[str, str]:
    """sha256 of every file at or under `path` (a checkpoint directory, or one file), by path relative to its parent."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def orbax(root: Path, ledger: Ledger) -> Path:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(root / "jax", options=options) as manager:
        params = {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64), "b": jnp.zeros(64)}
        for step in range(1, SAVES + 1):
            params = {k: v + step for k, v in params.items()}
            manager.save(step, args=ocp.args.StandardSave(params))
            manager.wait_until_finished()
            ledger.after_save()
    return root / "jax" / str(SAVES)


def transformers(root: Path, ledger: Ledger) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 24

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.tensor([(i + j) % 64 for j in range(16)])
            return {"input_ids": ids, "labels": ids}

    class Durable(TrainerCallback):  # type: ignore[misc]
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ledger.after_save()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    out = root / "hf"
    args = TrainingArguments(output_dir=str(out), max_steps=2 * SAVES, save_steps=2, save_total_limit=2, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Durable()]).train()
    return out / f"checkpoint-{2 * SAVES}"


def lightning(root: Path, ledger: Ledger) -> Path:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 32)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)


    class AfterSave(pl.callbacks.ModelCheckpoint):
        # Lightning runs ModelCheckpoint after every other callback, so no plain callback sees its file saved:
        # the ledger looks right after the save itself
        def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
            super()._save_checkpoint(trainer, filepath)
            ledger.after_save()

    torch.manual_seed(0)
    dirpath = root / "lightning_logs" / "version_0" / "checkpoints"  # Lightning's own layout, without a logger
    saver = AfterSave(dirpath=dirpath, every_n_train_steps=1, save_top_k=-1)
    data = DataLoader(TensorDataset(torch.randn(SAVES * 4, 32), torch.randn(SAVES * 4, 32)), batch_size=4)
    trainer = pl.Trainer(max_steps=SAVES, accelerator="cpu", logger=False, callbacks=[saver], enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Tiny(), data)
    return dirpath / f"epoch=0-step={SAVES}.ckpt"


def _dcp_rank(rank: int, world: int, port: int, root: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = torch.nn.Linear(128, 128)
    ledger = Ledger(Path(root))
    for step in range(1, SAVES + 1):
        with torch.no_grad():
            model.weight.add_(1.0)
        dcp.save({f"rank{rank}": model.state_dict()}, checkpoint_id=f"{root}/step_{step}")
        dist.barrier()
        if rank == 0:
            ledger.after_save()
        dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"written": ledger.written}))
    dist.destroy_process_group()


def dcp(root: Path, ledger: Ledger) -> Path:
    import torch.multiprocessing as mp

    from tests.support.seaweed import free_port

    with tempfile.TemporaryDirectory() as tmp:  # rank 0's ledger, off the mount
        part = Path(tmp) / "ledger.json"
        mp.spawn(_dcp_rank, args=(2, free_port(), str(root), str(part)), nprocs=2)
        ledger.written = json.loads(part.read_text())["written"]
    return root / f"step_{SAVES}"


KINDS: dict[str, Callable[[Path, Ledger], Path]] = {"orbax": orbax, "transformers": transformers, "lightning": lightning, "dcp": dcp}


def main() -> None:
    kind, root, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    root.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(root)
    newest = KINDS[kind](root, ledger)
    out.write_text(json.dumps({"written": ledger.written, "newest": str(newest.relative_to(root)), "digests": digests(newest)}))


if __name__ == "__main__":
    main()
