"""PyTorch Lightning: save checkpoints as committed checkpoint directories, resume from the newest committed one.

    trainer = Trainer(..., callbacks=[CkptfsCallback(run_dir, every_n_train_steps=500)])
    trainer.fit(model, ckpt_path=ckpt_path(run_dir))

Lightning's `ModelCheckpoint` writes single files and its `ckpt_path="last"` takes the newest by
name. ckptfs commits directories (checkpoint_patterns), so this callback saves each checkpoint as
`RUN_DIR/step_N/model.ckpt` with `trainer.save_checkpoint` and commits the directory, and `ckpt_path`
finds the newest committed one.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ckptfs.api import Commit, latest
from ckptfs.integrations.committer import Committer, require

try:
    pl = require("lightning.pytorch", "lightning", "ckptfs.integrations.lightning")
except ImportError:  # the older distribution of the same code
    try:
        pl = require("pytorch_lightning", "lightning", "ckptfs.integrations.lightning")
    except ImportError:
        raise ImportError("ckptfs.integrations.lightning needs lightning (or pytorch-lightning), which is not installed here: "
                          "pip install lightning") from None

CHECKPOINT_FILE = "model.ckpt"


class CkptfsCallback(pl.Callback):  # type: ignore[misc, name-defined]
    """Saves a checkpoint every `every_n_train_steps` optimizer steps (else at the end of each epoch) into
    `dirpath/step_N/model.ckpt` and commits it, with the run's metrics and hyperparameters as metadata.

    The metadata: `metrics` (`trainer.callback_metrics`), `global_step`, `epoch`, `hparams` (the
    module's `save_hyperparameters()`), plus `metadata` given here. Every rank saves (Lightning's
    save is collective); global rank 0 commits, which waits until the files are durable. With
    `protect_best` the best checkpoint by that metric stays protected.
    """

    def __init__(self, dirpath: str | os.PathLike[str], every_n_train_steps: int | None = None,
                 metadata: Mapping[str, Any] | None = None, protect_best: str | None = None,
                 greater_is_better: bool | None = None) -> None:
        self.dirpath = os.fspath(dirpath)
        self.every_n_train_steps = every_n_train_steps
        self.metadata = dict(metadata or {})
        self.committer = Committer(protect_best, greater_is_better)
        self.saved_step: int | None = None  # on every rank: the step last saved (batches of one step share it)

    @property
    def commits(self) -> list[Commit]:
        """What each commit of this run wrote, in order."""
        return self.committer.commits

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        n = self.every_n_train_steps
        if n and trainer.global_step and trainer.global_step % n == 0 and trainer.global_step != self.saved_step:
            self.save(trainer, pl_module)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not self.every_n_train_steps and trainer.global_step != self.saved_step:
            self.save(trainer, pl_module)

    def save(self, trainer: Any, pl_module: Any) -> None:
        """Save a checkpoint of the current step now and commit it."""
        path = os.path.join(self.dirpath, f"step_{trainer.global_step}")
        trainer.save_checkpoint(os.path.join(path, CHECKPOINT_FILE))
        self.saved_step = trainer.global_step
        if not trainer.is_global_zero:
            return
        metrics = dict(trainer.callback_metrics)
        self.committer.commit(path, {
            "trainer": "lightning",
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "metrics": metrics,
            "hparams": dict(getattr(pl_module, "hparams", {}) or {}),
            **self.metadata,
        })


def ckpt_path(dirpath: str | os.PathLike[str]) -> str | None:
    """The checkpoint file of the newest committed checkpoint under `dirpath`, for `Trainer.fit(ckpt_path=...)`;
    None (start afresh) if there is none."""
    ck = latest(dirpath)
    return str(ck.path / CHECKPOINT_FILE) if ck is not None else None
