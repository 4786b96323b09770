"""The `ckptfs` command: the entry point (`ckptfs.cli.main:main`, and `python -m ckptfs.cli`).

`mount` runs the daemon (in the foreground, or detached with `--daemon`);
every other command talks to a running daemon through its control socket,
found via the `user.ckptfs.control` xattr on the mount root. Every error a
user can cause is one line on stderr and a non-zero exit, never a traceback.

The commands live in modules of their own, each registering on the typer app of cli/app.py when
imported; importing them here, in this order (the order of `ckptfs --help`), is what makes them
commands. Only the console script and `__main__` import this module.
"""

from __future__ import annotations

import json
import sys

import typer

# registers: mount; unmount, status, flush, warmup, evict; checkpoint commit, checkpoints, verify, protect, unprotect,
# audit; replicate status; retention plan|apply|restore, drill; policy print, lifecycle plan|apply, restore, usage
from ckptfs.cli import mount, mounted, lifecycle, replicate, retention, storage  # noqa: F401  # isort: skip (the help's order)
from ckptfs.cli.app import app, command, error_object
from ckptfs.cli.errors import EXIT_ERROR, EXIT_USAGE
from ckptfs.cli.fstab import FstabError, is_mount_helper_call, mount_args


def main() -> None:
    argv = sys.argv[1:]
    commands = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback is not None}
    commands |= {g.name for g in app.registered_groups if g.name}
    if is_mount_helper_call(argv, commands):
        # run by mount(8) via mount.fuse3 (`mount -t fuse.ckptfs`, fstab): SOURCE MOUNTPOINT -o OPTIONS
        try:
            args = mount_args(argv)
        except FstabError as e:
            typer.echo(f"ckptfs: error: {e}", err=True)
            sys.exit(EXIT_USAGE)
        if args is None:
            return
        sys.argv = [sys.argv[0], *args]  # `--daemon` re-runs sys.argv[1:] in the child
    sys.exit(run_app())


def run_app() -> int:
    """Run the typer app; a usage error (bad option value, missing argument) is one line too, exit 2."""
    try:  # typer >= 0.22 carries its own copy of click
        from typer._click.exceptions import ClickException, UsageError
    except ImportError:  # pragma: no cover - older typer on click
        from click.exceptions import ClickException, UsageError  # type: ignore[no-redef]
    try:
        rv = command()(prog_name="ckptfs", standalone_mode=False)
    except ClickException as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()  # `ckptfs` alone: the help
            return EXIT_USAGE
        message = " ".join(e.format_message().split())
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if isinstance(e, UsageError) and ctx is not None else ""
        typer.echo(f"ckptfs: error: {message}{hint}", err=True)
        if "--json" in sys.argv[1:]:  # a script asked for JSON: the usage error is a JSON object too
            typer.echo(json.dumps(error_object(message + hint, e.exit_code), indent=2))
        return e.exit_code
    except typer.Abort:
        return EXIT_ERROR
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    main()
