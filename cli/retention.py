"""`ckptfs retention plan|apply|restore` and `ckptfs drill` (docs/lifecycle.md).

Registered on the main app by cli/lifecycle.py importing this module.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from ckptfs.cli.lifecycle import _one, _target, _who
from ckptfs.cli.main import _one_line_errors, app

retention_app = typer.Typer(add_completion=False, no_args_is_help=True,
                            help="Retention: what the policy keeps and deletes (plan), doing it (apply), taking an expiring checkpoint back (restore).")
app.add_typer(retention_app, name="retention")


def _show_plan(plan: list[dict[str, Any]], policy: bool, path: str, applied: bool) -> None:
    if not plan:
        typer.echo(f"ckptfs: no checkpoints under {path}")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"retention {'applied' if applied else 'plan'} under {path}")
    for col in ("step", "path", "state", "action", "reason") + (("done",) if applied else ()):
        table.add_column(col, justify="right" if col == "step" else "left")
    for d in plan:
        row = [str(d["step"]), d["path"], d["state"], d["action"], d["reason"]]
        if applied:
            row.append(d.get("done", ""))
        table.add_row(*row)
    Console(width=200).print(table)
    deletes = sum(1 for d in plan if d["action"] == "delete")
    if not policy:
        typer.echo("ckptfs: no retention policy is set (retention_keep_last, retention_keep_every_steps, "
                   "retention_keep_every_seconds): everything is kept")
    elif not applied:
        typer.echo(f"ckptfs: {len(plan) - deletes} kept, {deletes} to let go; nothing changed (ckptfs retention apply does it)")


@retention_app.command("plan")
@_one_line_errors
def plan(
    path: str = typer.Argument(".", help="The mount point, or a directory in it (default: the current directory)."),
    as_json: bool = typer.Option(False, "--json", help="A list of {path, action (keep|delete), reason, ...}."),
) -> None:
    """Show what the retention policy keeps (and by which rule) and what it would delete; changes nothing."""
    root, rel = _target(path)
    msg = _one(root, {"cmd": "retention_plan", "path": rel}, timeout=None)
    if as_json:
        typer.echo(json.dumps(msg["plan"], indent=2, sort_keys=True))
    else:
        _show_plan(msg["plan"], msg["policy"], path, applied=False)


@retention_app.command("apply")
@_one_line_errors
def apply(
    path: str = typer.Argument(".", help="The mount point, or a directory in it (default: the current directory)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Apply the retention policy: mark checkpoints it lets go expiring, delete those whose grace period is over."""
    root, rel = _target(path)
    msg = _one(root, {"cmd": "retention_apply", "path": rel, "who": _who()}, timeout=None)
    if as_json:
        typer.echo(json.dumps(msg["plan"], indent=2, sort_keys=True))
    else:
        _show_plan(msg["plan"], msg["policy"], path, applied=True)


@retention_app.command("restore")
@_one_line_errors
def restore(
    path: str = typer.Argument(..., help="The expiring checkpoint directory in the mount."),
    reason: str = typer.Option("", "--reason", help="Why (goes to the audit log)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Take an expiring checkpoint back: it is no longer deleted, and retention keeps it from now on."""
    root, rel = _target(path)
    msg = _one(root, {"cmd": "retention_restore", "path": rel, "who": _who(), "reason": reason}, timeout=None)
    if as_json:
        msg.pop("ok", None)
        typer.echo(json.dumps(msg, indent=2, sort_keys=True))
    else:
        typer.echo(f"ckptfs: {msg['message']}")
