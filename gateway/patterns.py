"""Which directories are checkpoints, and their step numbers (`checkpoint_patterns`).

A pattern is a directory name with `{step}` standing for the step number (one
or more digits) and `*` for any run of characters; the whole name must match:
`step_{step}` matches `step_100`, `iter_{step}` matches `iter_0000100` (step
100), `{step}` matches a bare number. The first pattern that matches wins.

A checkpoint is the *outermost* directory on a path whose name matches: in
`run7/step_100/model/0` the checkpoint is `run7/step_100` (nested run/step
layouts work); directories inside a checkpoint belong to it and are never
checkpoints of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class PatternError(ValueError):
    """A pattern that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory: its mount-relative path and its step."""

    path: str
    step: int


def compile_pattern(pattern: str) -> re.Pattern[str]:
    if pattern.count("{step}") != 1:
        raise PatternError(f"{pattern!r} must contain {{step}} exactly once (for example step_{{step}})")
    if "/" in pattern:
        raise PatternError(f"{pattern!r} must be one directory name, without '/': nested layouts match at any depth")
    head, tail = pattern.split("{step}")

    def literal(text: str) -> str:
        return ".*".join(re.escape(part) for part in text.split("*"))

    return re.compile(f"{literal(head)}(?P<step>[0-9]+){literal(tail)}")


def compile_patterns(patterns: list[str]) -> list[re.Pattern[str]]:
    return [compile_pattern(p) for p in patterns]


class Patterns:
    def __init__(self, patterns: list[str]) -> None:
        self.patterns = patterns
        self._compiled = compile_patterns(patterns)

    @property
    def enabled(self) -> bool:
        return bool(self._compiled)

    def step(self, name: str) -> int | None:
        """The step of a directory called `name`, or None if it is not a checkpoint name."""
        if name.startswith("."):
            return None  # hidden names (ours, and tools' temporary directories) are never checkpoints
        for rx in self._compiled:
            m = rx.fullmatch(name)
            if m:
                return int(m.group("step"))
        return None

    def checkpoint_of(self, path: str, is_dir: bool = True) -> Checkpoint | None:
        """The checkpoint that mount-relative `path` is (or is inside), if any.

        `is_dir` says whether the last component is a directory: a file named
        like a checkpoint (`100`) is not one.
        """
        parts = [p for p in path.split("/") if p]
        if not is_dir:
            parts = parts[:-1]
        for i, name in enumerate(parts):
            if name.startswith(".ckptfs"):
                return None  # ckptfs's own objects (namespace.keys.RESERVED_PREFIX), such as the audit log
            step = self.step(name)
            if step is not None:
                return Checkpoint("/".join(parts[: i + 1]), step)
        return None
