"""What the framework callbacks share: committing a saved checkpoint with its metadata, protecting the best.

A trainer's callback knows when a checkpoint is saved and what the run measured; `Committer` turns
that into `ckptfs.commit` (the manifest carries the metadata every node reads back) and, when asked
to keep the best checkpoint by a metric, protects it and lifts the protection of the one it beats,
so retention and the trainer's own rotation may delete the others.
"""

from __future__ import annotations

import importlib
import math
import os
from types import ModuleType
from typing import Any, Mapping

from ckptfs.api import Commit, checkpoints, commit, protect, unprotect


def require(module: str, package: str, integration: str) -> ModuleType:
    """Import a framework, or an ImportError saying what to install (ckptfs depends on none of them)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{integration} needs {package}, which is not installed here: pip install {package} ({e})") from e


def jsonable(value: Any) -> Any:
    """`value` as plain JSON for a manifest: tensors and numpy scalars as numbers, NaN and infinities as None, anything else unknown as text."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)  # a 0-d tensor or a numpy scalar
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


class Committer:
    """Commits each saved checkpoint; with `protect_best`, keeps the best one by that metric protected.

    The metadata's `metrics` holds the metric. A resumed run learns the best so far from the checkpoints
    this callback protected before (their protection reason names the metric), so one stays protected.
    """

    def __init__(self, protect_best: str | None = None, greater_is_better: bool | None = None) -> None:
        self.protect_best = protect_best
        # like the trainers' own default for `metric_for_best_model`: a loss is better lower
        self.greater_is_better = greater_is_better if greater_is_better is not None else not (protect_best or "").endswith("loss")
        self.best: tuple[float, str] | None = None  # (value, checkpoint path) of the protected one
        self.seeded = False
        self.commits: list[Commit] = []

    def commit(self, path: str | os.PathLike[str], metadata: Mapping[str, Any]) -> Commit:
        metadata = jsonable(metadata)
        done = commit(path, metadata)
        self.commits.append(done)
        if self.protect_best is not None:
            self._keep_best(str(done.path), (metadata.get("metrics") or {}).get(self.protect_best))
        return done

    def _reason(self, value: float) -> str:
        return f"best {self.protect_best} so far: {value:g}"

    def _better(self, value: float, than: float) -> bool:
        return value > than if self.greater_is_better else value < than

    def _keep_best(self, path: str, value: Any) -> None:
        if not self.seeded:
            self.seeded = True
            prefix = self._reason(0.0).rsplit(":", 1)[0] + ":"
            for ck in checkpoints(os.path.dirname(path)):
                reason = str((ck.info.get("protection") or {}).get("reason", ""))
                old = (ck.metadata.get("metrics") or {}).get(self.protect_best)
                if ck.protected and reason.startswith(prefix) and _number(old) and (self.best is None or self._better(old, self.best[0])):
                    self.best = (old, str(ck.path))
        if not _number(value) or (self.best is not None and not self._better(value, self.best[0])):
            return  # not measured at this save, or not better
        protect(path, self._reason(value))
        if self.best is not None and self.best[1] != path:
            unprotect(self.best[1], f"{path} is better by {self.protect_best} ({value:g} against {self.best[0]:g})")
        self.best = (value, path)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
