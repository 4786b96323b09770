"""Commands on a running mount and its cache: unmount, status, flush, warmup, evict.

Each talks to the daemon of the mount through its control socket (cli/client.py). cli/display.py
(and with it rich) is imported only by the commands that print with it, so that `ckptfs mount`
and the other commands start without it.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from ckptfs.cli.app import MOUNT_POINT, PATH_IN_MOUNT, TIMEOUT, app, fail, one_line_errors, positive_timeout
from ckptfs.cli.client import dead_mount, find_mount_root, get_status, one_reply, process_state, rel_path, until_done, until_durable
from ckptfs.cli.errors import EXIT_USAGE, CliError, NotAllowed, StoppedEarly
from ckptfs.config import fmt_bytes
from ckptfs.peering import FLUSH_LEVELS


@app.command()
@one_line_errors
def unmount(
    mountpoint: str = MOUNT_POINT,
    flush: bool = typer.Option(False, "--flush", help="Wait until everything is durable in the bucket first (default: no, the journal keeps it)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS",
                                            help="With --flush: give up after this many seconds, exit 1 (default: wait as long as it takes)."),
    force: bool = typer.Option(False, "--force", help="Unmount even while files are open for writing (their writers get errors) (default: refuse)."),
) -> None:
    """Unmount. Dirty data stays in the journal for the next mount unless --flush.

    Refused (exit 1) while files are open for writing, naming them, unless --force.
    """
    positive_timeout(timeout)
    root = Path(os.path.abspath(mountpoint))
    try:
        st = get_status(root)
    except NotAllowed:
        raise
    except CliError as e:
        if _is_dead_mount(root) or os.path.ismount(root) and "not running" in str(e):
            subprocess.run(["fusermount3", "-u", "-z", str(root)], check=False, capture_output=True)
            typer.echo(f"ckptfs: {dead_mount(root, 'unmounted it; mount it again to upload what its journal holds')}")
            return
        if os.path.ismount(root):
            raise
        fail(f"{mountpoint} is not mounted")
    writers = st.get("open_for_writing") or []
    if writers and not force:
        from ckptfs.control import open_for_writing_message

        raise CliError(open_for_writing_message(writers))
    if flush:
        wait_durable(root, "", timeout)
        typer.echo(f"ckptfs: everything in {root} is durable in the bucket")
    pid = st["pid"]
    left: dict[str, Any] = {}  # what stays in the journal, from the daemon's last line
    wait = None if flush else float(st.get("shutdown_timeout", 30)) + 30
    try:
        left = until_done(root, {"cmd": "unmount", "flush": flush, "force": force}, "unmount", timeout=wait)
    except StoppedEarly:
        pass  # it stopped without saying what is left: waited for below all the same
    except CliError as e:
        if "did not answer in time" not in str(e):
            raise
    deadline = time.monotonic() + 30
    while _alive(pid):
        if time.monotonic() > deadline:
            fail(f"daemon pid {pid} did not stop in time; it may still be draining (kill -TERM {pid} again, or wait)")
        time.sleep(0.1)
    if left.get("left_files") or left.get("left_deletes"):
        n, d = left["left_files"], left["left_deletes"]
        typer.echo(f"ckptfs: unmounted {root}; {n} file{'s' if n != 1 else ''} ({fmt_bytes(left['left_bytes'])}) and "
                   f"{d} deletion{'s' if d != 1 else ''} are not in the bucket yet: they stay in the journal in "
                   f"{left.get('cache_dir', 'the cache directory')} and the next mount of it uploads them")
        return
    typer.echo(f"ckptfs: unmounted {root}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_state(pid) not in ("Z", "")  # a zombie child of ours counts as gone


def _is_dead_mount(path: Path) -> bool:
    try:
        os.stat(path)
        return False
    except OSError as e:
        return e.errno == errno.ENOTCONN


@app.command()
@one_line_errors
def status(
    mountpoint: str = MOUNT_POINT,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (with --watch: one JSON object per line); an error as {\"error\", \"hint\", \"code\"}."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C (default: print once)."),
    interval: float = typer.Option(2.0, "--interval", "-n", min=0.1, metavar="SECONDS", show_default=False,
                                   help="With --watch: seconds between refreshes, at least 0.1 (default: 2)."),
) -> None:
    """Show the drain, upload throughput and ETA, cache, reads and errors of a mount."""
    from ckptfs.cli import display

    root = find_mount_root(mountpoint)
    st = get_status(root)
    console = display.make_console()
    if watch:
        display.watch(console, st, lambda: get_status(root), interval, as_json, lambda s: json.dumps(s, sort_keys=True))
        return
    if as_json:
        typer.echo(json.dumps(st, indent=2, sort_keys=True))
        return
    console.print(display.status_screen(st), soft_wrap=not console.is_terminal)


@app.command()
@one_line_errors
def flush(
    path: str = PATH_IN_MOUNT,
    timeout: Optional[float] = TIMEOUT,
    level: str = typer.Option("durable", "--level", metavar="LEVEL", show_default=False,
                              help="durable: in the bucket (default); replicated: in the bucket or on peer_replicas other nodes' "
                                   "disks (a mount with durability = peer)."),
) -> None:
    """Block until every file under PATH is durable in the bucket (or, with --level replicated, on peers' disks too)."""
    if level not in FLUSH_LEVELS:
        raise CliError(f"--level {level}: give durable (in the bucket) or replicated (on peers' disks too, with durability = peer)", EXIT_USAGE)
    positive_timeout(timeout)
    root = find_mount_root(path)
    wait_durable(root, rel_path(root, path), timeout, label=path, level=level)
    typer.echo(f"ckptfs: {path} is {level}")


@app.command()
@one_line_errors
def warmup(
    paths: list[str] = typer.Argument(..., metavar="PATH...", help="Files or directories in the mount to read into the local cache."),
) -> None:
    """Pre-stage files or trees from the bucket into the local cache (exit 1 if any file fails)."""
    from ckptfs.cli import display

    root = find_mount_root(paths[0])
    rels = []
    for p in paths:
        if find_mount_root(p) != root:
            raise CliError(f"{p} is not in the same ckptfs mount as {paths[0]}: run one warmup per mount")
        rels.append(rel_path(root, p))
    last: dict[str, Any] = {"files": 0, "bytes": 0}  # the last progress line: the final one carries only the failures
    with display.TransferProgress("warmup", sys.stdout.isatty()) as progress:
        def on_progress(msg: dict[str, Any]) -> None:
            last.update(msg)
            progress.update(msg)

        failed = until_done(root, {"cmd": "warmup", "paths": rels}, "warmup", on_progress=on_progress)["failed"]
    files, total = last["files"], last["bytes"]
    for path, error in failed:
        typer.echo(f"ckptfs: {path}: {error}", err=True)
    if failed:
        raise CliError(f"{len(failed)} of {display.plural(max(files, len(failed)), 'file')} could not be read from the bucket (see above)")
    typer.echo(f"ckptfs: {display.plural(files, 'file')} ({fmt_bytes(total)}) {'is' if files == 1 else 'are'} in the cache")


@app.command()
@one_line_errors
def evict(
    path: str = PATH_IN_MOUNT,
) -> None:
    """Drop the local copies of durable files under PATH (they are read from the bucket again when needed)."""
    from ckptfs.cli.display import plural

    root = find_mount_root(path)
    msg = one_reply(root, {"cmd": "evict", "path": rel_path(root, path)}, timeout=30.0)
    note = f"; {msg['skipped']} not durable yet or in use were kept" if msg["skipped"] else ""
    typer.echo(f"ckptfs: evicted {plural(msg['files'], 'file')} ({fmt_bytes(msg['bytes'])}){note}")


@app.command("remove-node")
@one_line_errors
def remove_node(
    mountpoint: str = MOUNT_POINT,
    node: str = typer.Argument(..., metavar="NODE", help="The node_name of the node to take out of the cluster."),
    force: bool = typer.Option(False, "--force", help="Also a node that is down and not yet taken over to the end: the files "
                                                      "only its peers hold are given up."),
) -> None:
    """Take a node that will not come back out of the cluster (durability = peer): its record says left, so it is
    no longer listed as down nor alerted on. A node unmounted cleanly leaves by itself."""
    root = find_mount_root(mountpoint)
    msg = one_reply(root, {"cmd": "remove_node", "node": node, "force": force}, timeout=60.0)
    typer.echo(f"ckptfs: {msg['message']}")


def wait_durable(root: Path, rel: str, timeout: Optional[float], label: str | None = None, level: str = "durable") -> None:
    """Flush `rel` and show its progress by bytes (parts already in the bucket count), with throughput and ETA."""
    from ckptfs.cli import display

    label = label or str(root)
    progress = display.FlushProgress(label, display.make_console(), level=level)
    try:
        until_durable(root, rel, timeout, label, on_progress=progress.update, level=level)
        progress.finish()
    finally:
        progress.close()
