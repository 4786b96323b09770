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

from ckptfs.api import Commit, commit, protect, unprotect


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
    """Commits each saved checkpoint; with `protect_best`, keeps the best one by that metric protected."""

    def __init__(self, protect_best: str | None = None, greater_is_better: bool | None = None) -> None:
        self.protect_best = protect_best
        # like the trainers' own default for `metric_for_best_model`: a loss is better lower
        self.greater_is_better = greater_is_better if greater_is_better is not None else not (protect_best or "").endswith("loss")
        self.best: tuple[float, str] | None = None  # (value, checkpoint path) of the protected one
        self.commits: list[Commit] = []

    def commit(self, path: str | os.PathLike[str], metadata: Mapping[str, Any], metrics: Mapping[str, Any]) -> Commit:
        done = commit(path, jsonable(metadata))
        self.commits.append(done)
        if self.protect_best is not None:
            self._keep_best(os.fspath(path), metrics.get(self.protect_best))
        return done

    def _keep_best(self, path: str, value: Any) -> None:
        value = jsonable(value)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return  # not measured at this save
        if self.best is not None and not (value > self.best[0] if self.greater_is_better else value < self.best[0]):
            return
        protect(path, f"best {self.protect_best} so far: {value:g}")
        if self.best is not None and self.best[1] != path:
            unprotect(self.best[1], f"{path} is better by {self.protect_best} ({value:g} against {self.best[0]:g})")
        self.best = (value, path)

