"""Which directories and files are checkpoints, and their step numbers (`checkpoint_patterns`).

A pattern is a directory name with `{step}` standing for the step number (one
or more digits) and `*` for any run of characters; the whole name must match:
`step_{step}` matches `step_100`, `iter_{step}` matches `iter_0000100` (step
100), `{step}` matches a bare number. The first pattern that matches wins. A
`*` right before `{step}` leaves every digit there to the step (`*{step}.pt`
on `model_1200.pt` is step 1200).

A pattern beginning `file:` matches a *file* instead (a checkpoint saved as one
file, such as Lightning's `epoch=0-step=100.ckpt`), and may name the
directories right above it: `file:checkpoints/*{step}.pt` matches
`run/checkpoints/model_100.pt` but not `run/model_100.pt`. Directory patterns
never match a file, nor file patterns a directory.

A checkpoint is the *outermost* match on a path: in `run7/step_100/model/0` the
checkpoint is `run7/step_100` (nested run/step layouts work); directories and
files inside a checkpoint directory belong to it and are never checkpoints of
their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FILE_PREFIX = "file:"  # a pattern for checkpoints saved as one file


class PatternError(ValueError):
    """A pattern that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint: its mount-relative path, its step, and whether it is one file rather than a directory."""

    path: str
    step: int
    file: bool = False

    @property
    def parent(self) -> str:
        """The mount-relative directory the checkpoint sits in ('' at the root)."""
        return self.path.rsplit("/", 1)[0] if "/" in self.path else ""

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def _literal(text: str) -> str:
    return ".*".join(re.escape(part) for part in text.split("*"))


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The regular expression of one directory pattern (or of a file pattern's last name)."""
    if pattern.count("{step}") != 1:
        raise PatternError(f"{pattern!r} must contain {{step}} exactly once (for example step_{{step}})")
    if "/" in pattern:
        raise PatternError(f"{pattern!r} must be one directory name, without '/': nested layouts match at any depth "
                           f"(only a {FILE_PREFIX} pattern may name the directories above its file)")
    head, tail = pattern.split("{step}")
    # a `*` right before {step} takes as little as it can, so the step is every digit there
    head_rx = _literal(head[:-1]) + ".*?" if head.endswith("*") else _literal(head)
    return re.compile(f"{head_rx}(?P<step>[0-9]+){_literal(tail)}")


@dataclass(frozen=True)
class FilePattern:
    """A `file:` pattern: the file name's expression and those of the directories right above it, nearest last."""

    name: re.Pattern[str]
    parents: tuple[re.Pattern[str], ...]


def compile_file_pattern(pattern: str) -> FilePattern:
    body = pattern[len(FILE_PREFIX):]
    *dirs, name = body.split("/")
    if not name or any(not d for d in dirs):
        raise PatternError(f"{pattern!r}: give a file name after {FILE_PREFIX} (directories above it separated by '/', none empty)")
    if any("{step}" in d for d in dirs):
        raise PatternError(f"{pattern!r}: {{step}} belongs in the file's name, not in a directory above it")
    return FilePattern(compile_pattern(name), tuple(re.compile(_literal(d)) for d in dirs))


def compile_patterns(patterns: list[str]) -> tuple[list[re.Pattern[str]], list[FilePattern]]:
    """Directory patterns and file patterns, each list in the configured order; PatternError on a bad one."""
    dirs = [compile_pattern(p) for p in patterns if not p.startswith(FILE_PREFIX)]
    files = [compile_file_pattern(p) for p in patterns if p.startswith(FILE_PREFIX)]
    return dirs, files


class Patterns:
    def __init__(self, patterns: list[str]) -> None:
        self.patterns = patterns
        self._dirs, self._files = compile_patterns(patterns)

    @property
    def enabled(self) -> bool:
        return bool(self._dirs or self._files)

    def step(self, name: str) -> int | None:
        """The step of a directory called `name`, or None if it is not a checkpoint name."""
        if name.startswith("."):
            return None  # hidden names (ours, and tools' temporary directories) are never checkpoints
        for rx in self._dirs:
            m = rx.fullmatch(name)
            if m:
                return int(m.group("step"))
        return None

    def file_step(self, parents: list[str], name: str) -> int | None:
        """The step of a file called `name` in the directories `parents` (outermost first), or None if it is
        not a checkpoint file."""
        if name.startswith("."):
            return None
        for fp in self._files:
            if len(fp.parents) > len(parents):
                continue
            m = fp.name.fullmatch(name)
            above = parents[len(parents) - len(fp.parents):] if fp.parents else []
            if m and all(rx.fullmatch(d) for rx, d in zip(fp.parents, above)):
                return int(m.group("step"))
        return None

    def checkpoint_of(self, path: str, is_dir: bool | None = None) -> Checkpoint | None:
        """The checkpoint that mount-relative `path` is (or is inside), if any.

        `is_dir` says whether the last component is a directory (True), a file
        (False) or either (None: what a user names on the command line): a file
        named like a directory checkpoint (`100`) is not one, nor a directory
        named like a file checkpoint.
        """
        parts = [p for p in path.split("/") if p]
        if not parts:
            return None
        last = parts[-1]
        dirs = parts if is_dir is not False else parts[:-1]
        for i, name in enumerate(dirs):
            if name.startswith(".ckptfs"):
                return None  # ckptfs's own objects (namespace.keys.RESERVED_PREFIX), such as the audit log
            step = self.step(name)
            if step is not None:
                return Checkpoint("/".join(parts[: i + 1]), step)
        if is_dir is not True:
            step = self.file_step(parts[:-1], last)
            if step is not None:
                return Checkpoint("/".join(parts), step, file=True)
        return None
