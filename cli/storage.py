"""Storage commands: policy print (access roles), lifecycle plan|apply (tiers), restore, usage (cost).

Registered on the main `ckptfs` app by importing this module. See docs/security.md and docs/lifecycle.md.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from ckptfs.cli.main import EXIT_USAGE, CliError, _one_line_errors, app, find_mount_root, get_status
from ckptfs.config import ConfigError, parse_source

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
@_one_line_errors
def policy_print(
    mount: str = typer.Argument(..., help="The mount point (or s3://BUCKET/PREFIX)."),
    role: str = typer.Option(..., "--role", help="writer (training nodes), retention (the only one that deletes) or reader."),
    principal: str = typer.Option("", "--principal", help="Make it a bucket policy for this principal (an ARN, or '*'); default: an IAM policy."),
    allow_delete: bool = typer.Option(False, "--allow-delete", help="writer only: may delete ordinary files, never ckptfs's objects or the audit log."),
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
