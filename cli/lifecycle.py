"""Checkpoint lifecycle commands: checkpoint commit, checkpoints, verify, protect, unprotect, audit.

Each talks to the daemon of the mount PATH is in (see docs/lifecycle.md);
they are registered on the main `ckptfs` app by importing this module.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from ckptfs.cli.main import EXIT_USAGE, CliError, _one_line_errors, _rel, app, find_mount_root, request
from ckptfs.config import fmt_bytes
from ckptfs.storageclass import ARCHIVE_CLASSES

checkpoint_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Act on one checkpoint (commit).")
app.add_typer(checkpoint_app, name="checkpoint")


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit} {(s % size) // subsize}{sub}"
    return f"{s}s"


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


def _who() -> dict[str, Any]:
    try:
        user = os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"user": user, "uid": os.getuid()}


def _target(path: str) -> tuple[Path, str]:
    root = find_mount_root(path)
    return root, _rel(root, path)


def _on_replica(path: str) -> tuple[Path, str]:
    """The mount and path of a checkpoint checked on a replica (`--target`): it may be gone from the primary (its
    retention deleted it, the replica's own kept it), so the mount is found from the nearest directory above it."""
    p = Path(os.path.abspath(path))
    above = p
    try:
        while not above.exists() and above.parent != above:
            above = above.parent
    except OSError:
        return _target(path)  # a dead mount and kin: find_mount_root says which, in one line
    root = find_mount_root(str(above))
    return root, _rel(root, str(p))


def _one(root: Path, req: dict[str, Any], timeout: float | None = 300.0) -> dict[str, Any]:
    for msg in request(root, req, timeout=timeout):
        return msg
    raise CliError("the daemon closed the connection without an answer")


@checkpoint_app.command("commit")
@_one_line_errors
def commit(
    path: str = typer.Argument(..., help="The checkpoint directory in the mount."),
    meta: list[str] = typer.Option([], "--meta", help="KEY=VALUE or a JSON file: stored in the manifest (repeatable)."),
) -> None:
    """Commit a checkpoint now: wait until its files are durable, then write its manifest."""
    metadata = parse_meta(meta)
    root, rel = _target(path)
    for msg in request(root, {"cmd": "checkpoint_commit", "path": rel, "metadata": metadata}, timeout=None):
        if msg.get("done"):
            how = "committed" if msg["written"] else "already committed with this content"
            change = ", changed since its first manifest" if msg["changed"] else ""
            typer.echo(f"ckptfs: {msg['path']} {how}: step {msg['step']}, {msg['files']} files, {fmt_bytes(msg['bytes'])}, "
                       f"manifest generation {msg['generation']}{change}")
            return
    raise CliError("the daemon stopped before the commit finished (is it shutting down?)")


@app.command()
@_one_line_errors
def checkpoints(
    path: str = typer.Argument(".", help="The mount point, or a directory in it (default: the current directory)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output: a list of checkpoints."),
) -> None:
    """List the checkpoints under PATH, as the bucket holds them (every node sees the same)."""
    root, rel = _target(path)
    entries = _one(root, {"cmd": "checkpoints", "path": rel})["checkpoints"]
    if as_json:
        typer.echo(json.dumps(entries, indent=2, sort_keys=True))
        return
    if not entries:
        typer.echo(f"ckptfs: no checkpoints under {path}")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"checkpoints under {path}")
    for col in ("step", "path", "state", "files", "size", "class", "age", "last verify"):
        table.add_column(col, justify="right" if col in ("step", "files", "size") else "left")
    now = time.time()
    notes_of: list[str] = []  # below the table, whole: a note squeezed into a column of 80 is unreadable
    for e in entries:
        v = e.get("last_verify")
        verified = "-" if not v else f"{v['outcome']}{' (deep)' if v.get('deep') else ''} {fmt_age(now - v['at'])} ago" + (" (earlier manifest)" if v.get("stale") else "")
        notes = []
        if e.get("protection"):
            notes.append(f"protected: {e['protection'].get('reason', '?')}")
        if e.get("changed"):
            notes.append(f"changed (manifest generation {e['generation']})")
        mark = e.get("retention") or {}
        if e["state"] == "expiring":
            notes.append(f"expiring: deleted after {mark.get('delete_after_iso', '?')} (ckptfs retention restore)")
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
                         + stored + (f": `ckptfs restore {e['path']}` brings it back" if moved["state"] != "moving" else ""))
        archived = sorted(c for c in (e.get("storage_classes") or {}) if c in ARCHIVE_CLASSES)
        if archived:
            notes.append(f"in {'/'.join(archived)}: reading it needs a restore first (ckptfs restore {os.path.join(root, e['path'])} "
                         "requests it, or reports it done)")
        table.add_row(str(e["step"]), e["path"], e["state"], str(e["files"]), fmt_bytes(e["bytes"]), cls, fmt_age(e.get("age_seconds")),
                      verified)
        if notes:
            notes_of.append(f"{e['path']}: {'; '.join(notes)}")
    console = Console()
    console.print(table)
    for line in notes_of:
        console.print(line, soft_wrap=True, highlight=False, markup=False)


@app.command()
@_one_line_errors
def verify(
    path: str = typer.Argument(..., help="The checkpoint directory in the mount."),
    deep: bool = typer.Option(False, "--deep", help="Read every file back and compare its xxh3-128 with the manifest."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    target: Optional[str] = typer.Option(None, "--target", help="Check the copy on replica target NAME ([replica.NAME]) instead of the primary's."),
) -> None:
    """Check a committed checkpoint against its manifest; exit 0 only when it is whole."""
    root, rel = _on_replica(path) if target else _target(path)
    progress = None
    if deep and sys.stdout.isatty() and not as_json:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

        progress = Progress(TextColumn("verify {task.fields[files]} files"), BarColumn(), DownloadColumn(binary_units=True),
                            TransferSpeedColumn(), TimeElapsedColumn())
        progress.start()
        task = progress.add_task("verify", total=None, files="?")
    result: dict[str, Any] | None = None
    try:
        req: dict[str, Any] = {"cmd": "verify", "path": rel, "deep": deep}
        if target:
            req["target"] = target
        for msg in request(root, req, timeout=None):
            if msg.get("done"):
                result = msg["result"]
                break
            if progress:
                progress.update(task, total=msg["bytes"], completed=msg["done_bytes"], files=msg["files"])
    finally:
        if progress:
            progress.stop()
    if result is None:
        raise CliError("the daemon stopped before the verify finished (is it shutting down?)")
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


def _protection(cmd: str, path: str, reason: str, as_json: bool) -> None:
    _say(cmd, path, {"reason": reason}, as_json)


def _say(cmd: str, path: str, fields: dict[str, Any], as_json: bool) -> None:
    """Send a command about PATH (with who asks) that answers with one message: print it, or the JSON."""
    root, rel = _target(path)
    msg = _one(root, {"cmd": cmd, "path": rel, "who": _who(), **fields}, timeout=None)
    if as_json:
        msg.pop("ok", None)
        typer.echo(json.dumps(msg, indent=2, sort_keys=True))
    else:
        typer.echo(f"ckptfs: {msg['message']}")


@app.command()
@_one_line_errors
def protect(
    path: str = typer.Argument(..., help="The checkpoint directory in the mount."),
    reason: str = typer.Option(..., "--reason", help="Why (goes to the audit log)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Protect a committed checkpoint: every ckptfs mount refuses to change or delete it; legal holds with Object Lock."""
    _protection("protect", path, reason, as_json)


@app.command()
@_one_line_errors
def unprotect(
    path: str = typer.Argument(..., help="The checkpoint directory in the mount."),
    reason: str = typer.Option(..., "--reason", help="Why (goes to the audit log)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Lift a checkpoint's protection (and its legal holds)."""
    _protection("unprotect", path, reason, as_json)


@app.command()
@_one_line_errors
def audit(
    path: str = typer.Argument(".", help="The mount point, or a checkpoint path: only events about it."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show the audit log kept in the bucket (protect and unprotect events), oldest first."""
    root, rel = _target(path)
    events = _one(root, {"cmd": "audit", "path": rel})["events"]
    if as_json:
        typer.echo(json.dumps(events, indent=2, sort_keys=True))
        return
    for e in events:
        who = e.get("who", {}).get("user", "?")
        typer.echo(f"{e.get('at_iso')}  {e.get('action'):<10} {e.get('path')}  by {who} on {e.get('node')}: {e.get('reason')}")


from ckptfs.cli import replicate as _replicate  # noqa: E402,F401 - registers `replicate status` (it uses the helpers above)
from ckptfs.cli import retention as _retention  # noqa: E402,F401 - registers retention plan|apply|restore and drill
