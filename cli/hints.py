"""Hints that work when pasted: the `ckptfs ...` commands in a message, with paths as the user can use them.

The daemon names paths relative to the mount root (`run1/step_400`), which is what it knows; a
command quoted in its message (`ckptfs checkpoint commit run1/step_400`) pasted from anywhere but
the mount root fails. The CLI knows the mount root and the user's working directory, so it rewrites
each path argument of each quoted command: relative to the working directory when the path is
under it, else absolute. A command that takes a path defaulting to the working directory gets the
mount root added when the user stands outside the mount.

Pure functions on text: which words of a command are paths comes from a `Grammar` the caller
builds from the typer app (cli/app.py), so this module knows no command by name.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

# a command quoted in backticks: `ckptfs verify run1/step_400 --target vault`
QUOTED_COMMAND = re.compile(r"`(ckptfs [^`]+)`")


@dataclass(frozen=True)
class Shape:
    """What a command's words are: which options take a value, and whether its path defaults to the working directory."""

    value_options: frozenset[str]
    path_defaults_to_cwd: bool


# the command words ("checkpoint commit", "verify") -> its shape; None if they name no command
Grammar = Callable[[list[str]], Optional[tuple[int, Shape]]]


def user_path(root: Path | str, rel: str, cwd: str) -> str:
    """Mount-relative `rel` as a path the user can give from `cwd`: relative below it, else absolute."""
    absolute = os.path.normpath(os.path.join(str(root), rel)) if rel else os.path.normpath(str(root))
    if absolute == cwd:
        return "."
    if cwd != "/" and absolute.startswith(cwd + "/"):
        return os.path.relpath(absolute, cwd)
    return absolute


def _is_placeholder(word: str) -> bool:
    """PATH, NAME, ...: a word standing for what the user fills in, left as it is."""
    return word.isupper() or word.startswith("<") or word in (".", "..") or "://" in word


def paste_ready_command(command: str, root: Path | str, cwd: str, grammar: Grammar) -> str:
    """One `ckptfs ...` command with its mount-relative path arguments rewritten for `cwd` (unchanged if unknown)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    found = grammar(words[1:])
    if found is None:
        return command
    consumed, shape = found
    head, rest = words[: 1 + consumed], words[1 + consumed:]
    out: list[str] = []
    paths = 0
    skip_value = False
    for word in rest:
        if skip_value:
            out.append(word)
            skip_value = False
        elif word.startswith("-"):
            out.append(word)
            skip_value = "=" not in word and word in shape.value_options
        elif word.startswith("/") or _is_placeholder(word):
            out.append(word)
            paths += 1
        else:
            out.append(user_path(root, word, cwd))
            paths += 1
    inside = cwd == str(root) or cwd.startswith(str(root).rstrip("/") + "/")
    if not paths and shape.path_defaults_to_cwd and not inside:
        out.insert(0, str(root))
    return " ".join(shlex.quote(w) for w in head + out)


def paste_ready(message: str, root: Path | str, cwd: str, grammar: Grammar) -> str:
    """`message` with every backticked `ckptfs ...` command made to work from `cwd`."""
    return QUOTED_COMMAND.sub(lambda m: f"`{paste_ready_command(m.group(1), root, cwd, grammar)}`", message)


def first_command(message: str) -> str | None:
    """The first command quoted in `message` (the hint of a JSON error): a `ckptfs ...` one first, else any quoted
    text of several words (`kill -CONT 123`); None if there is none."""
    m = QUOTED_COMMAND.search(message) or re.search(r"`([^`]+ [^`]+)`", message)
    return m.group(1) if m else None
