"""`ckptfs replicate status`: how far each replica target is behind (docs/replication.md)."""

from __future__ import annotations

import json

import typer

from ckptfs.cli.app import PATH_OR_CWD, app, one_line_errors
from ckptfs.cli.client import find_mount_root, one_reply
from ckptfs.config import fmt_bytes

replicate_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Replication of committed checkpoints to other stores.")
app.add_typer(replicate_app, name="replicate")


@replicate_app.command("status")
@one_line_errors
def status(
    path: str = PATH_OR_CWD,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output: a list with one entry per target; an error as {\"error\", \"hint\", \"code\"}."),
) -> None:
    """Per replica target: checkpoints replicated, pending, failed, bytes behind, lag, and the target's error if any.

    Exits 1 when a target is unreachable or refuses, or a copy failed; 0 otherwise (pending work alone is not an error).
    """
    root = find_mount_root(path)
    msg = one_reply(root, {"cmd": "replicate_status"}, timeout=120)
    targets = msg["targets"]
    if as_json:
        typer.echo(json.dumps(targets, indent=2, sort_keys=True))
    else:
        from rich.table import Table

        from ckptfs.cli.display import fmt_age, make_console

        table = Table(title=f"replication from {root}" + (" (this node copies)" if msg.get("lease_held") else ""))
        for col in ("target", "where", "select", "replicated", "pending", "failed", "behind", "lag", "state"):
            table.add_column(col, justify="right" if col in ("replicated", "pending", "failed", "behind") else "left")
        for t in targets:
            state = f"error: {t['error']}" if t["error"] else (f"copying {t['copying']}" if t["copying"] else
                                                               ("pending" if t["pending"] else
                                                                "a new commit not surveyed yet" if t.get("unsurveyed_commits") else "up to date"))
            table.add_row(t["name"], t["target"] + (f" at {t['endpoint_url']}" if t["endpoint_url"] else ""), t["select"],
                          str(t["replicated"]), str(t["pending"]), str(t["failed"]), fmt_bytes(t["bytes_behind"]),
                          fmt_age(t["lag_seconds"]) if t["pending"] else "-", state)
        make_console().print(table)
        if msg.get("primary_error"):
            typer.echo(f"ckptfs: the primary could not be surveyed: {msg['primary_error']}", err=True)
        for t in targets:
            for p, why in sorted(t["failures"].items()):
                typer.echo(f"ckptfs: replica {t['name']}: {p}: {why}", err=True)
    if any(t["error"] or t["failed"] for t in targets):
        raise typer.Exit(1)
