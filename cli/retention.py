"""`ckptfs retention plan|apply|restore` and `ckptfs drill` (docs/lifecycle.md).

Registered on the `ckptfs` app (cli/app.py) by importing this module.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any

import typer

from ckptfs.cli.app import JSON_OUTPUT, PATH_OR_CWD, app, one_line_errors, say
from ckptfs.cli.client import locate, locate_on_replica, one_reply, requester, until_done
from ckptfs.cli.errors import EXIT_USAGE, CliError
from ckptfs.config import fmt_bytes

retention_app = typer.Typer(add_completion=False, no_args_is_help=True,
                            help="Retention: what the policy keeps and deletes (plan), doing it (apply), taking an expiring checkpoint back (restore).")
app.add_typer(retention_app, name="retention")


def _show_plan(plan: list[dict[str, Any]], policy: bool, path: str, applied: bool) -> None:
    if not plan:
        typer.echo(f"ckptfs: no checkpoints under {path}")
        return
    from rich.table import Table

    from ckptfs.cli.display import make_console

    table = Table(title=f"retention {'applied' if applied else 'plan'} under {path}")
    for col in ("step", "path", "state", "action", "reason") + (("done",) if applied else ()):
        table.add_column(col, justify="right" if col == "step" else "left")
    for d in plan:
        row = [str(d["step"]), d["path"], d["state"], d["action"], d["reason"]]
        if applied:
            row.append(d.get("done", ""))
        table.add_row(*row)
    make_console().print(table)
    deletes = sum(1 for d in plan if d["action"] == "delete")
    if not policy:
        typer.echo("ckptfs: no retention policy is set (retention_keep_last, retention_keep_every_steps, "
                   "retention_keep_every_seconds): everything is kept")
    elif not applied:
        typer.echo(f"ckptfs: {len(plan) - deletes} kept, {deletes} to let go; nothing changed (`ckptfs retention apply {shlex.quote(path)}` does it)")


@retention_app.command("plan")
@one_line_errors
def plan(
    path: str = PATH_OR_CWD,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable: a list of objects with path, action (keep or delete), reason, ...; an error as {\"error\", \"hint\", \"code\"}."),
) -> None:
    """Show what the retention policy keeps (and by which rule) and what it would delete; changes nothing."""
    root, rel = locate(path)
    msg = one_reply(root, {"cmd": "retention_plan", "path": rel}, timeout=None)
    if as_json:
        typer.echo(json.dumps(msg["plan"], indent=2, sort_keys=True))
    else:
        _show_plan(msg["plan"], msg["policy"], path, applied=False)


@retention_app.command("apply")
@one_line_errors
def apply(
    path: str = PATH_OR_CWD,
    as_json: bool = JSON_OUTPUT,
) -> None:
    """Apply the retention policy: mark checkpoints it lets go expiring, delete those whose grace period is over."""
    root, rel = locate(path)
    msg = one_reply(root, {"cmd": "retention_apply", "path": rel, "who": requester()}, timeout=None)
    if as_json:
        typer.echo(json.dumps(msg["plan"], indent=2, sort_keys=True))
    else:
        _show_plan(msg["plan"], msg["policy"], path, applied=True)


@retention_app.command("restore")
@one_line_errors
def restore(
    path: str = typer.Argument(..., metavar="CHECKPOINT", help="The expiring checkpoint directory in the mount."),
    reason: str = typer.Option("", "--reason", metavar="REASON", show_default=False, help="Why (goes to the audit log) (default: none)."),
    as_json: bool = JSON_OUTPUT,
) -> None:
    """Take an expiring checkpoint back: it is no longer deleted, and retention keeps it from now on."""
    say("retention_restore", path, {"reason": reason}, as_json)


def missing_dirs(path: str) -> list[str]:
    """The directories of absolute `path` that do not exist yet, outermost first (none if it exists)."""
    out: list[str] = []
    cur = path
    while not os.path.lexists(cur) and os.path.dirname(cur) != cur:
        out.append(cur)
        cur = os.path.dirname(cur)
    return out[::-1]


def drill_dir(into: str, parents: bool) -> str:
    """The absolute `--dir` to restore under ("" for the default). A directory whose parent is missing is refused
    unless `parents` (a typo must not grow a tree at /): then what will be created is said on stderr."""
    if not into:
        if parents:
            raise CliError("--parents applies to --dir only", EXIT_USAGE)
        return ""
    path = os.path.abspath(into)
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"--dir {into}: not a directory", EXIT_USAGE)
    missing = missing_dirs(path)
    if len(missing) > 1 and not parents:
        raise CliError(f"--dir {into}: {missing[0]} does not exist: create it (`mkdir -p {shlex.quote(path)}`), "
                       "or add --parents to create it and its missing parents", EXIT_USAGE)
    if missing:
        typer.echo(f"ckptfs: drill: creating {', '.join(missing)}", err=True)
    return path


@app.command()
@one_line_errors
def drill(
    path: str = typer.Argument(".", metavar="PATH", show_default=False,
                               help="A checkpoint directory, or a directory above checkpoints: its newest committed one (default: the current directory)."),
    exec_: str = typer.Option("", "--exec", metavar="COMMAND", show_default=False,
                              help="A shell command run on the restored checkpoint; the text '{path}' in it is replaced by the restored directory, "
                                   "also in $CKPTFS_DRILL_PATH; it must exit 0 (default: no command)."),
    into: str = typer.Option("", "--dir", metavar="DIR", show_default=False,
                             help="Restore under this existing directory (default: drills/ in the daemon's cache directory)."),
    parents: bool = typer.Option(False, "--parents", help="With --dir: create it and its missing parents, saying which (default: refuse a --dir whose parent is missing)."),
    keep: bool = typer.Option(False, "--keep", help="Keep the restored directory afterwards (default: removed)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON (the command's output goes to stderr); an error as {\"error\", \"hint\", \"code\"}."),
    target: str = typer.Option("", "--target", metavar="NAME", show_default=False,
                               help="Restore from the replica target of the config table replica.NAME (docs/replication.md) (default: the primary)."),
) -> None:
    """Recovery drill: restore a checkpoint from the bucket as a fresh node would, verify it deep, run a command on it."""
    from ckptfs.cli.display import TransferProgress

    into = drill_dir(into, parents)
    root, rel = locate_on_replica(path) if target else locate(path)
    req = {"cmd": "drill", "path": rel, "exec": bool(exec_), "dir": into, "keep": keep}
    if target:
        req["target"] = target
    with TransferProgress("restore", sys.stdout.isatty() and not as_json) as progress:
        msg = until_done(root, req, "drill", on_progress=progress.update)
    result = msg["result"]
    if msg.get("waiting"):
        command = exec_.replace("{path}", shlex.quote(result["dir"]))
        started = time.monotonic()
        try:
            proc = subprocess.run(command, shell=True, stdout=sys.stderr if as_json else None,
                                  env={**os.environ, "CKPTFS_DRILL_PATH": result["dir"]})
            code = proc.returncode
        except OSError as e:
            typer.echo(f"ckptfs: drill: cannot run the command: {e}", err=True)
            code = 127
        exec_result = {"command": exec_, "exit_code": code, "seconds": round(time.monotonic() - started, 3)}
        result = one_reply(root, {"cmd": "drill_done", "id": msg["id"], "exec": exec_result}, timeout=None)["result"]
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        for what in ("missing", "changed", "unexpected"):
            for name in result[what]:
                typer.echo(f"ckptfs: drill {result['path']}: {what}: {name}", err=True)
        speed = fmt_bytes(result["bytes_per_second"]) + "/s"
        where = f" from replica {result['target']}" if result.get("target") else ""
        typer.echo(f"ckptfs: drill {result['path']} (step {result['step']}){where}: restored {result['files']} files, "
                   f"{fmt_bytes(result['bytes'])} in {result['restore_seconds']:.1f} s ({speed}), deep verify: {result['verify']}")
        if result.get("exec"):
            e = result["exec"]
            typer.echo(f"ckptfs: drill command exited {e['exit_code']} after {e['seconds']:.1f} s: {e['command']}")
        elif exec_:
            typer.echo("ckptfs: drill command not run: the checkpoint did not come back whole", err=True)
        if result.get("kept"):
            typer.echo(f"ckptfs: restored copy kept in {result['dir']}")
        if result.get("record_error"):
            typer.echo(f"ckptfs: warning: {result['record_error']}", err=True)
        typer.echo(f"ckptfs: drill {'succeeded' if result['outcome'] == 'ok' else 'FAILED'} in {result['seconds']:.1f} s")
    if result["outcome"] != "ok":
        raise typer.Exit(1)
