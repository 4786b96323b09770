"""The `ckptfs` command's help, errors and hints, without a mount: what a script and a new user read.

Every command's and subcommand's `--help` is walked (the real command, in a subprocess) and refused
on a hole: empty parentheses, Python type names, placeholders in braces, an option without help or
without a default said in words. The hints of the daemon's messages are rewritten to work from the
user's directory (cli/hints.py): pure functions, checked here on the app's own grammar.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from ckptfs.cli import main  # noqa: F401  (registers the commands)
from ckptfs.cli.app import app, command, error_object, grammar
from ckptfs.cli.hints import first_command, paste_ready, user_path
from ckptfs.cli.retention import drill_dir, missing_dirs

ROOT = Path(__file__).resolve().parents[2]
CKPTFS = [sys.executable, "-m", "ckptfs.cli"]

HOLES = [
    (re.compile(r"\(\s*[,;]?\s*\)|\(, "), "empty parentheses"),
    (re.compile(r"<(str|int|float|bool|list|path|float range|int range)[^>]*>"), "a Python type name"),
    (re.compile(r"(?<!')\{[a-z_]+\}(?!')"), "a placeholder in braces"),
    (re.compile(r"\b(TEXT|FLOAT|INTEGER|BOOLEAN)\b"), "click's type name as a metavar"),
]


def command_paths() -> list[list[str]]:
    """Every command and subcommand of the app, as the words that name it."""
    out: list[list[str]] = [[]]
    todo: list[tuple[list[str], object]] = [([], typer.main.get_command(app))]
    while todo:
        words, cmd = todo.pop()
        for name, sub in getattr(cmd, "commands", {}).items():
            out.append([*words, name])
            todo.append(([*words, name], sub))
    return out


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CKPTFS, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**os.environ, "COLUMNS": "100"})


@pytest.mark.parametrize("words", command_paths(), ids=lambda w: " ".join(w) or "ckptfs")
def test_every_help_is_complete(words: list[str]) -> None:
    proc = run(*words, "--help")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for pattern, what in HOLES:
        m = pattern.search(text)
        assert m is None, f"`ckptfs {' '.join(words)} --help` shows {what}: {m.group(0)!r}\n{text}"
    # every option and argument says what it is, and an option with a value says its default (or that it is required)
    cmd = typer.main.get_command(app)
    for w in words:
        cmd = cmd.commands[w]  # type: ignore[attr-defined]
    for p in cmd.params:
        if getattr(p, "hidden", False):
            continue
        assert p.help, f"ckptfs {' '.join(words)}: {p.name} has no help"
        if p.param_type_name == "option" and not p.required and p.name != "help":
            assert "default" in p.help or p.show_default, f"ckptfs {' '.join(words)}: {p.opts[0]} does not say its default"


def test_unknown_options_and_keys_get_the_closest_name() -> None:
    proc = run("status", "/tmp", "--jsno")
    assert proc.returncode == 2 and "No such option: --jsno" in proc.stderr and "--json" in proc.stderr, proc.stderr
    proc = run("mount", "s3://b", "/nonexistent-mnt", "-o", "chache_capacity=1G")
    assert proc.returncode == 2 and "did you mean cache_capacity?" in proc.stderr, proc.stderr
    proc = run("sattus")
    assert proc.returncode == 2 and "status" in proc.stderr, proc.stderr


def test_json_errors_are_an_object_on_stdout_with_the_exit_status(tmp_path: Path) -> None:
    proc = run("status", str(tmp_path), "--json")
    assert proc.returncode == 1
    err = json.loads(proc.stdout)
    assert err["code"] == 1 and "is not inside a ckptfs mount" in err["error"] and "\n" not in err["error"]
    assert err["hint"] == "findmnt -t fuse.ckptfs"
    assert proc.stderr.startswith("ckptfs: error: ") and len(proc.stderr.strip().splitlines()) == 1
    for args in (("checkpoints", str(tmp_path / "missing"), "--json"), ("status", str(tmp_path), "--json", "--interval", "0"),
                 ("replicate", "status", str(tmp_path), "--json")):
        proc = run(*args)
        assert proc.returncode != 0 and json.loads(proc.stdout)["code"] == proc.returncode, (args, proc.stdout, proc.stderr)
    # without --json: nothing on stdout
    proc = run("status", str(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""


def test_error_object_names_the_command_that_fixes_it() -> None:
    assert error_object("x is dead: run `ckptfs unmount /m` to clean it up", 1) == {
        "error": "x is dead: run `ckptfs unmount /m` to clean it up", "hint": "ckptfs unmount /m", "code": 1}
    assert error_object("bad", 2)["hint"] is None
    assert first_command("resume it with `kill -CONT 12`") == "kill -CONT 12"


def test_hints_of_the_daemon_work_from_where_the_user_stands() -> None:
    command()  # the grammar is the app's
    msg = "run1/step_400 is not committed (no manifest yet): run `ckptfs checkpoint commit run1/step_400` first"
    assert paste_ready(msg, "/mnt/ck", "/home/me", grammar).endswith("`ckptfs checkpoint commit /mnt/ck/run1/step_400` first")
    assert "`ckptfs checkpoint commit run1/step_400`" in paste_ready(msg, "/mnt/ck", "/mnt/ck", grammar)
    assert "`ckptfs checkpoint commit step_400`" in paste_ready(msg, "/mnt/ck", "/mnt/ck/run1", grammar)
    # option values stay, placeholders stay, a path defaulting to the working directory gets the mount from outside it
    msg = "see `ckptfs verify run/step_1 --target cold`, or `ckptfs restore PATH`; `ckptfs replicate status`"
    out = paste_ready(msg, "/mnt/ck", "/", grammar)
    assert "`ckptfs verify /mnt/ck/run/step_1 --target cold`" in out and "`ckptfs restore PATH`" in out
    assert "`ckptfs replicate status /mnt/ck`" in out
    assert "`ckptfs replicate status`" in paste_ready(msg, "/mnt/ck", "/mnt/ck/run", grammar)
    # names with spaces are quoted; text that is no command of ckptfs is left alone
    assert "`ckptfs flush '/mnt/ck/my run/step_1'`" in paste_ready("`ckptfs flush 'my run/step_1'`", "/mnt/ck", "/", grammar)
    assert paste_ready("`ckptfs nosuch a b`", "/mnt/ck", "/", grammar) == "`ckptfs nosuch a b`"
    assert user_path("/mnt/ck", "", "/mnt/ck") == "." and user_path("/mnt/ck", "", "/") == "/mnt/ck"


def test_drill_dir_refuses_a_missing_parent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckptfs.cli.errors import CliError

    assert drill_dir("", False) == ""
    assert drill_dir(str(tmp_path), False) == str(tmp_path)
    assert missing_dirs(str(tmp_path / "a" / "b")) == [str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    with pytest.raises(CliError, match="does not exist.*--parents"):
        drill_dir(str(tmp_path / "a" / "b"), False)
    assert not (tmp_path / "a").exists()
    assert drill_dir(str(tmp_path / "a" / "b"), True) == str(tmp_path / "a" / "b")
    assert f"creating {tmp_path / 'a'}, {tmp_path / 'a' / 'b'}" in capsys.readouterr().err
    assert drill_dir(str(tmp_path / "c"), False) == str(tmp_path / "c")  # its parent exists: created, and said


def test_flush_level_is_durable_or_replicated(tmp_path: Path) -> None:
    proc = run("flush", "--level", "on-tape", str(tmp_path))  # refused before looking for a mount
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("ckptfs: error: --level on-tape: give durable (in the bucket) or replicated (on peers' disks too, "
                           "with durability = peer)\n")
    help_text = run("flush", "--help").stdout
    assert "--level" in help_text and "replicated" in help_text
