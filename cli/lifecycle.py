"""Checkpoint lifecycle commands: checkpoint commit, checkpoints, verify, protect, unprotect, audit.

Each talks to the daemon of the mount PATH is in (see docs/lifecycle.md);
they are registered on the `ckptfs` app (cli/app.py) by importing this module.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from ckptfs.cli.app import AUDIT_REASON, CHECKPOINT_DIR, JSON_OUTPUT, PATH_OR_CWD, app, one_line_errors, say
from ckptfs.cli.client import locate, locate_on_replica, one_reply, until_done
from ckptfs.cli.errors import EXIT_USAGE, CliError
from ckptfs.cli.hints import user_path
from ckptfs.config import fmt_bytes
from ckptfs.storageclass import ARCHIVE_CLASSES

checkpoint_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Act on one checkpoint (commit).")
app.add_typer(checkpoint_app, name="checkpoint")


def parse_meta(values: list[str]) -> dict[str, Any]:
    """`--meta key=value` (value read as JSON if it is JSON, else text) or `--meta FILE` (a JSON object)."""
    out: dict[str, Any] = {}
    for v in values:
        if os.path.isfile(v):
            try:
                doc = json.loads(Path(v).read_text())
            except (OSError, ValueError) as e:
                raise CliError(f"--meta {v}: not a readable JSON file ({e})", EXIT_USAGE) from None
            if not isinstance(doc, dict):
                raise CliError(f"--meta {v}: the JSON file must hold an object ({{\"key\": value, ...}})", EXIT_USAGE)
            out.update(doc)
            continue
        key, sep, value = v.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--meta {v!r} is neither KEY=VALUE nor an existing JSON file", EXIT_USAGE)
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


@checkpoint_app.command("commit")
@one_line_errors
def commit(
    path: str = CHECKPOINT_DIR,
    meta: list[str] = typer.Option([], "--meta", metavar="KEY=VALUE|FILE", show_default=False,
                                   help="Stored in the manifest: KEY=VALUE (VALUE read as JSON if it is JSON) or a JSON file of an object; repeatable (default: none)."),
) -> None:
    """Commit a checkpoint now: wait until its files are durable, then write its manifest."""
    metadata = parse_meta(meta)
    root, rel = locate(path)
    msg = until_done(root, {"cmd": "checkpoint_commit", "path": rel, "metadata": metadata}, "commit")
    how = "committed" if msg["written"] else "already committed with this content"
    change = ", changed since its first manifest" if msg["changed"] else ""
    typer.echo(f"ckptfs: {msg['path']} {how}: step {msg['step']}, {msg['files']} files, {fmt_bytes(msg['bytes'])}, "
               f"manifest generation {msg['generation']}{change}")


@app.command()
@one_line_errors
def checkpoints(
    path: str = PATH_OR_CWD,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output: a list of checkpoints; an error as {\"error\", \"hint\", \"code\"}."),
) -> None:
    """List the checkpoints under PATH, as the bucket holds them (every node sees the same)."""
    root, rel = locate(path)
    entries = one_reply(root, {"cmd": "checkpoints", "path": rel})["checkpoints"]
    if as_json:
        typer.echo(json.dumps(entries, indent=2, sort_keys=True))
        return
    if not entries:
        typer.echo(f"ckptfs: no checkpoints under {path}")
        return
    from rich.table import Table

    from ckptfs.cli.display import fmt_age, make_console

    table = Table(title=f"checkpoints under {path}")
    for col in ("step", "path", "state", "files", "size", "class", "age", "last verify"):
        table.add_column(col, justify="right" if col in ("step", "files", "size") else "left")
    now = time.time()
    cwd = os.getcwd()
    notes_of: list[str] = []  # below the table, whole: a note squeezed into a column of 80 is unreadable
    for e in entries:
        v = e.get("last_verify")
        verified = "-" if not v else f"{v['outcome']}{' (deep)' if v.get('deep') else ''} {fmt_age(now - v['at'])} ago" + (" (earlier manifest)" if v.get("stale") else "")
        notes = []
        shown = user_path(root, e["path"], cwd)  # a path valid from here: relative below the working directory, else absolute
        here = shlex.quote(shown)  # the checkpoint as a command pasted from here names it
        if e.get("protection"):
            notes.append(f"protected: {e['protection'].get('reason', '?')}")
        if e.get("changed"):
            notes.append(f"changed (manifest generation {e['generation']})")
        mark = e.get("retention") or {}
        if e["state"] == "expiring":
            notes.append(f"expiring: deleted after {mark.get('delete_after_iso', '?')} (`ckptfs retention restore {here}` keeps it)")
        elif mark.get("state") == "restored":
            notes.append("restored from expiring")
        moved = e.get("moved") or {}
        cls = e.get("storage_class", "-")
        if moved.get("state") in ("moving", "moved", "restoring"):  # tier_move_target (docs/lifecycle.md)
            stored = ""
            if moved["state"] != "moving" and e.get("original_bytes"):  # compressed there (cold_compression): the ratio
                ratio = e["stored_bytes"] / e["original_bytes"]
                cls += f" ({ratio:.2f})"
                stored = f", stored in {fmt_bytes(e['stored_bytes'])} ({ratio:.2f} of its size)"
            notes.append(f"{moved['state']} to cold target {moved.get('target')} ({moved.get('target_url')}) since {moved.get('at_iso')}"
                         + stored + (f": `ckptfs restore {here}` brings it back" if moved["state"] != "moving" else ""))
        archived = sorted(c for c in (e.get("storage_classes") or {}) if c in ARCHIVE_CLASSES)
        if archived:
            notes.append(f"in {'/'.join(archived)}: reading it needs a restore first (ckptfs restore {here} "
                         "requests it, or reports it done)")
        table.add_row(str(e["step"]), shown, e["state"], str(e["files"]), fmt_bytes(e["bytes"]), cls, fmt_age(e.get("age_seconds")),
                      verified)
        if notes:
            notes_of.append(f"{shown}: {'; '.join(notes)}")
    console = make_console()
    console.print(table)
    for line in notes_of:
        console.print(line, soft_wrap=True, highlight=False, markup=False)


@app.command()
@one_line_errors
def verify(
    path: str = CHECKPOINT_DIR,
    deep: bool = typer.Option(False, "--deep", help="Read every file back and compare its xxh3-128 with the manifest (default: sizes and ETags only)."),
    as_json: bool = JSON_OUTPUT,
    target: Optional[str] = typer.Option(None, "--target", metavar="NAME",
                                         help="Check the copy on the replica target of the config table replica.NAME instead of the primary's (default: the primary)."),
) -> None:
    """Check a committed checkpoint against its manifest; exit 0 only when it is whole."""
    from ckptfs.cli.display import TransferProgress

    root, rel = locate_on_replica(path) if target else locate(path)
    req: dict[str, Any] = {"cmd": "verify", "path": rel, "deep": deep}
    if target:
        req["target"] = target
    with TransferProgress("verify", deep and sys.stdout.isatty() and not as_json) as progress:
        result = until_done(root, req, "verify", on_progress=progress.update)["result"]
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        kind = ("deep" if deep else "shallow") + (f", on replica {target}" if target else "")
        for what in ("missing", "changed", "unexpected"):
            for name in result[what]:
                typer.echo(f"ckptfs: {result['path']}: {what}: {name}", err=True)
        if result["unchecked"]:
            typer.echo(f"ckptfs: {result['path']}: {result['counts']['unchecked']} files have no xxh3 in the manifest "
                       "(written without ckptfs): checked by size and ETag only", err=True)
        if result["outcome"] == "whole":
            typer.echo(f"ckptfs: {result['path']} is whole ({kind}): {result['files']} files, {fmt_bytes(result['bytes'])}")
        else:
            c = result["counts"]
            typer.echo(f"ckptfs: {result['path']} is NOT whole ({kind}): {c['missing']} missing, {c['changed']} changed, "
                       f"{c['unexpected']} unexpected", err=True)
    if result["outcome"] != "whole":
        raise typer.Exit(1)


@app.command()
@one_line_errors
def protect(
    path: str = CHECKPOINT_DIR,
    reason: str = AUDIT_REASON,
    as_json: bool = JSON_OUTPUT,
) -> None:
    """Protect a committed checkpoint: every ckptfs mount refuses to change or delete it; legal holds with Object Lock."""
    say("protect", path, {"reason": reason}, as_json)


@app.command()
@one_line_errors
def unprotect(
    path: str = CHECKPOINT_DIR,
    reason: str = AUDIT_REASON,
    as_json: bool = JSON_OUTPUT,
) -> None:
    """Lift a checkpoint's protection (and its legal holds)."""
    say("unprotect", path, {"reason": reason}, as_json)


@app.command()
@one_line_errors
def audit(
    path: str = typer.Argument(".", metavar="PATH", show_default=False,
                               help="The mount point, or a checkpoint path: only events about it (default: the current directory)."),
    as_json: bool = JSON_OUTPUT,
) -> None:
    """Show the audit log kept in the bucket (protect and unprotect events), oldest first."""
    root, rel = locate(path)
    events = one_reply(root, {"cmd": "audit", "path": rel})["events"]
    if as_json:
        typer.echo(json.dumps(events, indent=2, sort_keys=True))
        return
    for e in events:
        who = e.get("who", {}).get("user", "?")
        typer.echo(f"{e.get('at_iso')}  {e.get('action'):<10} {e.get('path')}  by {who} on {e.get('node')}: {e.get('reason')}")

