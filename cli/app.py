"""The typer app every command registers on, and what the commands share.

`--version`; the one-line error handling (a CliError or Ctrl-C from a command becomes one line on
stderr and its exit code, never a traceback); the arguments and options several commands take, so
their help reads the same everywhere; `say`, for the commands answered with one message.
The command modules import this; cli/main.py imports them to register their commands.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional, TypeVar

import typer

from ckptfs.cli.client import locate, one_reply, requester
from ckptfs.cli.errors import EXIT_ERROR, EXIT_USAGE, CliError, DaemonRefused
from ckptfs.cli.hints import Shape, first_command, paste_ready
from ckptfs.version import VERSION

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="ckptfs: a write-back checkpoint gateway to S3.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ckptfs {VERSION}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print `ckptfs X.Y.Z` and exit."),
) -> None:
    """ckptfs: a write-back checkpoint gateway to S3."""


def command() -> Any:
    """The click command of the app, run by cli/main.py. An argument's help shows its name (PATH), not typer's
    type and braces (`{path}`, `<str>`): the help names what to give, in words."""
    cmd: Any = typer.main.get_command(app)
    todo = [cmd]
    while todo:
        c = todo.pop()
        todo.extend(getattr(c, "commands", {}).values())
        for p in c.params:
            if p.param_type_name == "argument":
                name = p.metavar or p.name.upper()
                usage = name if p.required else f"[{name}]"
                p.display_type_rich = lambda ctx: None
                p._usage_display_name = lambda usage=usage: usage
    return cmd


# ------------------------------------------------------------ shared parameters
# every parameter names what it takes (metavar) and its default in words: the help has no type names in it
MOUNT_POINT = typer.Argument(..., metavar="MOUNTPOINT", help="The mount point.")
PATH_IN_MOUNT = typer.Argument(..., metavar="PATH", help="A file or directory in the mount, or the mount point.")
PATH_OR_CWD = typer.Argument(".", metavar="PATH", show_default=False,
                             help="The mount point, or a directory in it (default: the current directory).")
CHECKPOINT_DIR = typer.Argument(..., metavar="CHECKPOINT", help="The checkpoint directory in the mount.")
AUDIT_REASON = typer.Option(..., "--reason", metavar="REASON", help="Why (goes to the audit log).")
JSON_OUTPUT = typer.Option(False, "--json", help="Print the answer as JSON on stdout (an error as {\"error\", \"hint\", \"code\"}).")
TIMEOUT = typer.Option(None, "--timeout", metavar="SECONDS", help="Give up after this many seconds, exit 1 (default: wait as long as it takes).")


# ------------------------------------------------------------ errors
def error_object(message: str, code: int) -> dict[str, Any]:
    """An error as `--json` prints it on stdout: the one line, the command that fixes it (if the line quotes one), the exit status."""
    return {"error": message, "hint": first_command(message), "code": code}


def fail(message: str, code: int = EXIT_ERROR, as_json: bool = False) -> NoReturn:
    """Print `ckptfs: error: MESSAGE` on stderr (and with `as_json` the error object on stdout); exit with `code`."""
    typer.echo(f"ckptfs: error: {message}", err=True)
    if as_json:
        typer.echo(json.dumps(error_object(message, code), indent=2))
    raise typer.Exit(code)


def grammar(words: list[str]) -> Optional[tuple[int, Shape]]:
    """How many of `words` name a command of this app, and that command's shape (for cli/hints.py); None if none."""
    cmd: Any = typer.main.get_command(app)
    consumed = 0
    while hasattr(cmd, "commands") and consumed < len(words) and words[consumed] in cmd.commands:
        cmd = cmd.commands[words[consumed]]
        consumed += 1
    if not consumed or hasattr(cmd, "commands"):
        return None
    value_options = frozenset(o for p in cmd.params if p.param_type_name == "option" and not p.is_flag for o in p.opts)
    cwd_default = any(p.param_type_name == "argument" and p.default == "." for p in cmd.params)
    return consumed, Shape(value_options, cwd_default)


def for_the_user(message: str, mount_root: Path) -> str:
    """A message of the daemon of `mount_root` with the commands it quotes made to work from the user's directory."""
    return paste_ready(message, mount_root, os.getcwd(), grammar)


def one_line_errors(fn: F) -> F:
    """Turn a CliError from a command into one line on stderr and its exit code (and the error object, under --json)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return fn(*args, **kwargs)
        except DaemonRefused as e:
            fail(for_the_user(str(e), e.mount_root), e.code, as_json)
        except CliError as e:
            fail(str(e), e.code, as_json)
        except KeyboardInterrupt:
            fail("interrupted", 130, as_json)

    return wrapper  # type: ignore[return-value]


def positive_timeout(timeout: Optional[float]) -> None:
    """Refuse a `--timeout` that is not a positive number of seconds (a usage error)."""
    if timeout is not None and not timeout > 0:
        raise CliError(f"--timeout {timeout:g}: give a number of seconds greater than 0", EXIT_USAGE)


# ------------------------------------------------------------ output
def say(cmd: str, path: str, fields: dict[str, Any], as_json: bool) -> None:
    """Send a command about PATH (with who asks) that answers with one message: print it, or the JSON."""
    root, rel = locate(path)
    msg = one_reply(root, {"cmd": cmd, "path": rel, "who": requester(), **fields}, timeout=None)
    if as_json:
        msg.pop("ok", None)
        typer.echo(json.dumps(msg, indent=2, sort_keys=True))
    else:
        typer.echo(f"ckptfs: {for_the_user(msg['message'], root)}")
