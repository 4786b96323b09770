"""Storage commands: policy print (access roles), lifecycle plan|apply (tiers), restore, usage (cost).

Registered on the `ckptfs` app (cli/app.py) by importing this module. See docs/security.md and docs/lifecycle.md.
"""

from __future__ import annotations

import json
import os
from typing import Any

import typer

from ckptfs.cli.app import JSON_OUTPUT, MOUNT_POINT, PATH_OR_CWD, app, for_the_user, one_line_errors
from ckptfs.cli.client import find_mount_root, get_status, locate, one_reply, until_done
from ckptfs.cli.errors import EXIT_USAGE, CliError
from ckptfs.config import ConfigError, fmt_bytes, parse_source
from ckptfs.storageclass import fmt_money

policy_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Access roles as S3 policy documents (docs/security.md).")
app.add_typer(policy_app, name="policy")


def _source(mount: str) -> tuple[str, str]:
    """(bucket, prefix) of a mount point (asked of its daemon) or of an s3://BUCKET/PREFIX given directly."""
    if mount.startswith("s3://"):
        try:
            return parse_source(mount)
        except ConfigError as e:
            raise CliError(str(e), EXIT_USAGE) from None
    return parse_source(get_status(find_mount_root(mount))["source"])


@policy_app.command("print")
@one_line_errors
def policy_print(
    mount: str = typer.Argument(..., metavar="MOUNTPOINT|s3://BUCKET/PREFIX", help="The mount point (or s3://BUCKET/PREFIX)."),
    role: str = typer.Option(..., "--role", metavar="ROLE", help="writer (training nodes), retention (the only one that deletes) or reader."),
    principal: str = typer.Option("", "--principal", metavar="ARN", show_default=False,
                                  help="Make it a bucket policy for this principal (an ARN, or '*') (default: an IAM policy)."),
    allow_delete: bool = typer.Option(False, "--allow-delete", help="writer only: may delete ordinary files, never ckptfs's objects or the audit log (default: no deletes)."),
) -> None:
    """Print the S3 policy document (JSON) for a role on the mount's bucket and prefix."""
    from ckptfs.policy import ROLES, document

    if role not in ROLES:
        raise CliError(f"--role {role!r}: use one of {', '.join(ROLES)}", EXIT_USAGE)
    if allow_delete and role != "writer":
        raise CliError("--allow-delete applies to --role writer only", EXIT_USAGE)
    bucket, prefix = _source(mount)
    doc: dict[str, Any] = document(role, bucket, prefix, principal=principal, allow_delete=allow_delete)
    typer.echo(json.dumps(doc, indent=2))


# ----------------------------------------------------------------------- tiers
lifecycle_app = typer.Typer(add_completion=False, no_args_is_help=True,
                            help="The bucket lifecycle rules for storage tiers (docs/lifecycle.md, Tiers).")
app.add_typer(lifecycle_app, name="lifecycle")


def _show_plan(p: dict[str, Any], mount: str, as_json: bool, applied: bool | None) -> None:
    p.pop("ok", None)
    if as_json:
        typer.echo(json.dumps(p, indent=2, sort_keys=True))
        return
    for w in p["warnings"]:
        typer.echo(f"ckptfs: warning: {w}", err=True)
    if p["rules"]:
        typer.echo(json.dumps({"Rules": p["rules"]}, indent=2))
    for mark, what in (("+", "add"), ("~", "change"), ("-", "remove"), ("=", "unchanged")):
        for rid in p[what]:
            typer.echo(f"{mark} {rid}")
    for rid in p["keep"]:
        typer.echo(f"  {rid or '(no id)'} (not ckptfs's: kept)")
    if not p["rules"] and not p["changes"]:  # nothing to show above: say why, once
        typer.echo(f"ckptfs: ckptfs sets no lifecycle rules for this mount (tier_transitions and tier_noncurrent_delete_days "
                   f"are not set) and bucket {p['bucket']!r} has none of its rules: nothing to " + ("apply" if applied is None else "change"))
    elif applied is None:
        typer.echo("ckptfs: " + (f"`ckptfs lifecycle apply {mount}` would make these changes" if p["changes"]
                                 else f"bucket {p['bucket']!r} has these rules already: nothing to apply"))
    else:
        typer.echo("ckptfs: " + (f"bucket {p['bucket']!r} lifecycle rules set" if applied else f"bucket {p['bucket']!r} has these rules already: nothing changed"))


@lifecycle_app.command("plan")
@one_line_errors
def lifecycle_plan(
    mount: str = MOUNT_POINT,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable: the rules, and add/change/remove/keep; an error as {\"error\", \"hint\", \"code\"}."),
) -> None:
    """Print the bucket lifecycle configuration ckptfs would set, and how it differs from the bucket's."""
    _show_plan(one_reply(find_mount_root(mount), {"cmd": "lifecycle_plan"}), mount, as_json, None)


@lifecycle_app.command("apply")
@one_line_errors
def lifecycle_apply(
    mount: str = MOUNT_POINT,
    as_json: bool = JSON_OUTPUT,
) -> None:
    """Set the bucket lifecycle configuration of `plan`, keeping the rules ckptfs did not write."""
    p = one_reply(find_mount_root(mount), {"cmd": "lifecycle_apply"})
    _show_plan(p, mount, as_json, bool(p["applied"]))


@app.command()
@one_line_errors
def restore(
    path: str = typer.Argument(..., metavar="PATH", help="A file or directory (a checkpoint) in the mount."),
    wait: bool = typer.Option(False, "--wait", help="Keep reporting until every object is restored; restores take minutes to hours (default: ask and report once)."),
    as_json: bool = JSON_OUTPUT,
) -> None:
    """Restore archived objects (GLACIER, DEEP_ARCHIVE) so they can be read; reports progress."""

    def on_progress(msg: dict[str, Any]) -> None:
        if as_json:
            return
        if msg.get("moved"):  # a checkpoint moved to a cold target (tier_move_target): copied back from there
            typer.echo(f"ckptfs: {path}: copying back from cold target {msg['target']}: {msg['done_files']} of {msg['files']} files, "
                       f"{fmt_bytes(msg['done_bytes'])} of {fmt_bytes(msg['bytes'])}", err=True)
        else:
            typer.echo(f"ckptfs: {path}: {msg['restored']} of {msg['archived']} restored, {msg['ongoing']} in progress", err=True)

    root, rel = locate(path)
    msg = until_done(root, {"cmd": "restore", "path": rel, "wait": wait}, "restore request", on_progress=on_progress)
    msg.pop("ok", None)
    if as_json:
        typer.echo(json.dumps(msg, indent=2, sort_keys=True))
    elif msg.get("moved"):
        typer.echo(f"ckptfs: {path}: " + (for_the_user(msg.get("message") or "", root) or f"brought back from cold target {msg['target']}: "
                   f"{msg['files']} files ({fmt_bytes(msg['bytes'])}) copied back and verified; it is hot again"))
    elif not msg["archived"]:
        files = msg.get("files", msg["objects"])  # its files: not the manifest and markers ckptfs keeps beside them
        what = "it is not" if os.path.isfile(path) else "its file is not" if files == 1 else f"none of its {files} files is"
        typer.echo(f"ckptfs: {path}: {what} in an archive class: nothing to restore")
    elif msg["restored"] == msg["archived"]:
        typer.echo(f"ckptfs: {path}: all {msg['archived']} archived objects are restored and readable")
    else:
        typer.echo(f"ckptfs: {path}: {msg['restored']} of {msg['archived']} archived objects restored, {msg['ongoing']} "
                   f"in progress ({msg['requested']} requested now); run `ckptfs restore {path} --wait` to follow")


# ------------------------------------------------------------------------ cost
@app.command()
@one_line_errors
def usage(
    path: str = PATH_OR_CWD,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable: bytes, objects, by_checkpoint, by_run, by_state, by_class, monthly_cost_estimate; an error as {\"error\", \"hint\", \"code\"}."),
) -> None:
    """Bytes and objects in the bucket under PATH per checkpoint, run, state and storage class, and an estimated monthly cost."""
    root, rel = locate(path)
    u = one_reply(root, {"cmd": "usage", "path": rel})
    u.pop("ok", None)
    if as_json:
        typer.echo(json.dumps(u, indent=2, sort_keys=True))
        return
    from rich.table import Table

    from ckptfs.cli.display import make_console

    console = make_console()
    console.print(f"{u['path']}: {fmt_bytes(u['bytes'])} in {u['objects']} objects, about {fmt_money(u['monthly_cost_estimate'])} per month "
                  f"({u['prices_note']})")
    nc = u.get("noncurrent")
    if nc is not None:
        console.print(f"versioned bucket: {fmt_bytes(nc['bytes'])} in {nc['objects']} noncurrent versions"
                      f" (and {nc['delete_markers']} delete markers), about {fmt_money(nc['monthly_cost'])} per month of the above"
                      + ("" if not nc["objects"] else "; `tier_noncurrent_delete_days` expires them"))
    # compressed on a cold target (cold_compression): what it saved, a column only when something was
    saved = any(e.get("saved_bytes") for e in [*u["by_class"].values(), *u["by_checkpoint"]])

    def saving(e: dict[str, Any]) -> list[str]:
        if not saved:
            return []
        return [f"{fmt_bytes(e['saved_bytes'])} ({e['saved_bytes'] / e['original_bytes']:.0%})" if e.get("saved_bytes") else "-"]

    for title, rows in (("by storage class", u["by_class"]), ("by state", {k: v for k, v in u["by_state"].items() if v["objects"]}),
                        ("by run", u["by_run"])):
        if not rows:
            continue
        t = Table(title=title)
        for col in ("", "size", "objects", "per month", *(["saved"] if saved and title == "by storage class" else [])):
            t.add_column(col, justify="left" if not col else "right")
        for name, e in rows.items():
            t.add_row(name, fmt_bytes(e["bytes"]), str(e["objects"]), fmt_money(e["monthly_cost"]) if "monthly_cost" in e else "-",
                      *(saving(e) if title == "by storage class" else []))
        console.print(t)
    if u["by_checkpoint"]:
        t = Table(title="by checkpoint")
        for col in ("step", "path", "state", "class", "size", "objects", "per month", *(["saved"] if saved else [])):
            t.add_column(col, justify="right" if col in ("step", "size", "objects", "per month", "saved") else "left")
        for c in u["by_checkpoint"]:
            t.add_row(str(c["step"]), c["path"], c["state"], c["storage_class"], fmt_bytes(c["bytes"]), str(c["objects"]),
                      fmt_money(c["monthly_cost"]), *saving(c))
        console.print(t)
