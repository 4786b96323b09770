"""Hugging Face `Trainer`: commit each checkpoint it saves, resume from the newest committed one.

    trainer = Trainer(model, args, ..., callbacks=[CkptfsCallback(protect_best="eval_loss")])
    trainer.train(resume_from_checkpoint=resume_checkpoint(args.output_dir))

The Trainer names its checkpoints `checkpoint-N` (one of ckptfs's default checkpoint_patterns) and,
told `resume_from_checkpoint=True`, picks the newest directory by name, whether or not it was
written whole. `resume_checkpoint` gives it the newest *committed* one instead.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ckptfs.api import Commit, latest
from ckptfs.integrations.committer import Committer, require

transformers = require("transformers", "transformers", "ckptfs.integrations.transformers")
PREFIX_CHECKPOINT_DIR = require("transformers.trainer_utils", "transformers", "ckptfs.integrations.transformers").PREFIX_CHECKPOINT_DIR


class CkptfsCallback(transformers.TrainerCallback):  # type: ignore[misc, name-defined]
    """Commits every checkpoint the Trainer saves, with the run's metrics and arguments as its metadata.

    The metadata: `metrics` (the latest value of each logged metric: loss, learning_rate, eval_*),
    `global_step`, `epoch`, `best_metric`, `best_model_checkpoint`, `args` (the TrainingArguments),
    plus `metadata` given here (a dataset snapshot, the code's git commit...). The commit waits until
    the checkpoint's files are durable in the bucket. With `protect_best="eval_loss"` the best
    checkpoint by that metric stays protected (`ckptfs protect`; lower is better for a loss, else
    higher, unless `greater_is_better` says).
    """

    def __init__(self, metadata: Mapping[str, Any] | None = None, protect_best: str | None = None,
                 greater_is_better: bool | None = None) -> None:
        self.metadata = dict(metadata or {})
        self.committer = Committer(protect_best, greater_is_better)

    @property
    def commits(self) -> list[Commit]:
        """What each commit of this run wrote, in order."""
        return self.committer.commits

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        metrics: dict[str, Any] = {}
        for entry in state.log_history:  # oldest first: the latest value of each metric wins
            if entry.get("step", 0) <= state.global_step:
                metrics.update({k: v for k, v in entry.items() if k not in ("step", "epoch")})
        self.committer.commit(path, {
            "trainer": "transformers",
            "global_step": state.global_step,
            "epoch": state.epoch,
            "metrics": metrics,
            "best_metric": state.best_metric,
            "best_model_checkpoint": state.best_model_checkpoint,
            "args": args.to_dict(),
            **self.metadata,
        })


def resume_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest committed checkpoint under `output_dir`, for `Trainer.train(resume_from_checkpoint=...)`;
    None (start afresh) if there is none."""
    ck = latest(output_dir)
    return str(ck.path) if ck is not None else None
