"""The typer app every command registers on, and what the commands share.

`--version`; the one-line error handling (a CliError or Ctrl-C from a command becomes one line on
stderr and its exit code, never a traceback); the arguments and options several commands take, so
their help reads the same everywhere; `say`, for the commands answered with one message.
The command modules import this; cli/main.py imports them to register their commands.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, NoReturn, Optional, TypeVar

import typer

from ckptfs.cli.client import locate, one_reply, requester
from ckptfs.cli.errors import EXIT_ERROR, EXIT_USAGE, CliError
from ckptfs.version import VERSION

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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


# ------------------------------------------------------------ shared parameters
MOUNT_POINT = typer.Argument(..., help="The mount point.")
PATH_IN_MOUNT = typer.Argument(..., help="A file or directory in the mount, or the mount point.")
PATH_OR_CWD = typer.Argument(".", help="The mount point, or a directory in it (default: the current directory).")
CHECKPOINT_DIR = typer.Argument(..., help="The checkpoint directory in the mount.")
AUDIT_REASON = typer.Option(..., "--reason", help="Why (goes to the audit log).")
JSON_OUTPUT = typer.Option(False, "--json")


# ------------------------------------------------------------ errors
def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print `ckptfs: error: MESSAGE` on stderr and exit with `code`."""
    typer.echo(f"ckptfs: error: {message}", err=True)
    raise typer.Exit(code)


def one_line_errors(fn: F) -> F:
    """Turn a CliError from a command into one line on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CliError as e:
            fail(str(e), e.code)
        except KeyboardInterrupt:
            fail("interrupted", 130)

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
        typer.echo(f"ckptfs: {msg['message']}")
