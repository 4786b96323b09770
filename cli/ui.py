"""`ckptfs ui`: serve the read-only catalogue page for the checkpoints under PATH (docs/ui.md).

The page reads the mount's daemon over its control socket (`catalogue`, `audit`,
`replicate_status`: reads only), the way `ckptfs checkpoints --json` does, so this process
never holds the bucket's credentials. It runs until Ctrl-C.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import typer

from ckptfs.cli.app import PATH_OR_CWD, app, one_line_errors
from ckptfs.cli.client import locate, one_reply
from ckptfs.cli.errors import EXIT_USAGE, CliError

DEFAULT_ADDR = "127.0.0.1:8464"
ASK_TIMEOUT = 3600.0  # seconds the daemon may take to answer one request


@app.command()
@one_line_errors
def ui(
    path: str = PATH_OR_CWD,
    addr: str = typer.Option(DEFAULT_ADDR, "--addr", metavar="HOST:PORT",
                             help="Where to listen; a non-loopback address needs --token-file (port 0: any free port)."),
    token_file: Optional[str] = typer.Option(None, "--token-file", metavar="FILE",
                                             help="A file (chmod 600) holding the token every request must carry (default: none, loopback only)."),
) -> None:
    """Serve a read-only web page of the runs, checkpoints and files under PATH, until Ctrl-C."""
    import trio  # here, not at the top: every other command starts without trio, hypercorn and jinja2

    from ckptfs.config import Config
    from ckptfs.httpserver import serve
    from ckptfs.ui.serve import UiError, check_bind, parse_addr, read_token, require_extra
    from ckptfs.ui.snapshot import AskError, Snapshots

    try:
        require_extra()
        host, port = parse_addr(addr)
        token = read_token(token_file) if token_file else None
        check_bind(host, token)
    except UiError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    root, rel = locate(path)
    from ckptfs.ui.app import CatalogueApp  # jinja2: the 'ui' extra, checked above

    async def ask(request: dict[str, Any]) -> dict[str, Any]:
        try:
            # a walk of a bucket with many checkpoints may take minutes; Ctrl-C abandons the thread all the same
            return await trio.to_thread.run_sync(functools.partial(one_reply, root, request, ASK_TIMEOUT), abandon_on_cancel=True)
        except CliError as e:
            raise AskError(str(e)) from None

    async def main() -> None:
        snapshots = Snapshots(ask, rel)
        page = CatalogueApp(snapshots, str(root), token)
        async with trio.open_nursery() as nursery:
            await nursery.start(snapshots.run)
            try:
                bound = await nursery.start(functools.partial(serve, page, host, port, read_timeout=Config.metrics_read_timeout))
            except OSError as e:
                raise CliError(f"cannot listen on {addr}: {e.strerror}: choose another --addr", EXIT_USAGE) from None
            shown = f"[{host}]" if ":" in host else host
            typer.echo(f"ckptfs: serving the catalogue of {root / rel if rel else root} at http://{shown}:{bound}/"
                       + (" (token required)" if token else "") + "; Ctrl-C stops", err=True)

    try:
        trio.run(main)
    except KeyboardInterrupt:
        pass
    except BaseExceptionGroup as group:  # a CliError from inside the nursery: its one line
        mine, _ = group.split(CliError)
        while isinstance(mine, BaseExceptionGroup):
            mine = mine.exceptions[0]
        if mine is not None:
            raise mine from None
        if group.subgroup(KeyboardInterrupt) is None:
            raise
