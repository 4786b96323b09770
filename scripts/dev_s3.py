#!/usr/bin/env python3
"""A local SeaweedFS S3 server for ``make run`` / ``make stop``.

    dev_s3.py start  --dir .dev/s3 [--bucket ckpt ...]   # idempotent; one line says where it runs
    dev_s3.py status --dir .dev/s3                       # prints the endpoint; exit 1 if not running
    dev_s3.py stop   --dir .dev/s3 [--keep-data]         # stops it and deletes DIR (or keeps DIR/data)

Layout of DIR: ``data/`` (weed's data dir, log in ``data/weed.log``),
``pid``, ``endpoint`` (the S3 URL) and ``env`` (``export`` lines with the
credentials, for ``. DIR/env``).  The server runs detached in its own session
and outlives this script.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.seaweed import (  # noqa: E402
    DEFAULT_ACCESS_KEY,
    DEFAULT_SECRET_KEY,
    REGION,
    SeaweedServer,
    make_bucket,
    make_client,
    stop_process_group,
)

OUR_FILES = {"data", "pid", "endpoint", "env"}


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _is_our_weed(pid: int, data: Path) -> bool:
    args = _cmdline(pid)
    return "mini" in args and f"-dir={data}" in args


def _running_pids(state: Path) -> list[int]:
    """Pids of the weed serving ``state/data``: the recorded one, else any found in /proc."""
    data = state / "data"
    try:
        pid = int((state / "pid").read_text().strip())
        if _is_our_weed(pid, data):
            return [pid]
    except (OSError, ValueError):
        pass
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _is_our_weed(int(entry), data):
            found.append(int(entry))
    return found


def _write(path: Path, text: str) -> None:
    """Write a file readable by its owner only (0600), whatever the umask: `env` holds the credentials."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    os.replace(tmp, path)


def _env_lines(access_key: str, secret_key: str) -> str:
    env = {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key, "AWS_DEFAULT_REGION": REGION}
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def cmd_start(args: argparse.Namespace) -> int:
    state: Path = args.dir
    if _running_pids(state) and (state / "endpoint").exists():
        endpoint = (state / "endpoint").read_text().strip()
        client = make_client(endpoint, args.access_key, args.secret_key)
        for bucket in args.bucket:
            make_bucket(client, bucket)
        print(f"dev S3 already running at {endpoint}", file=sys.stderr)
        return 0

    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)  # the credentials file is in it
    for name in ("pid", "endpoint", "env"):
        (state / name).unlink(missing_ok=True)
    server = SeaweedServer(state / "data", args.access_key, args.secret_key)
    server.start()  # killed again on any error below, until detach()
    for bucket in args.bucket:
        server.make_bucket(bucket)
    _write(state / "env", _env_lines(args.access_key, args.secret_key))
    _write(state / "endpoint", server.endpoint_url + "\n")
    _write(state / "pid", f"{server.pid}\n")
    endpoint = server.endpoint_url
    pid = server.detach()
    print(
        f"dev S3 started at {endpoint} (pid {pid}, {server.startup_seconds:.1f}s, "
        f"buckets: {', '.join(args.bucket) or '-'}, log {server.log_path})",
        file=sys.stderr,
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state: Path = args.dir
    if _running_pids(state) and (state / "endpoint").exists():
        print((state / "endpoint").read_text().strip())
        return 0
    print("dev S3 is not running", file=sys.stderr)
    return 1


def cmd_stop(args: argparse.Namespace) -> int:
    state: Path = args.dir
    if not state.exists():
        return 0
    stray = {p.name for p in state.iterdir()} - OUR_FILES - {n + ".tmp" for n in OUR_FILES}
    if stray:
        print(f"refusing to delete {state}: it holds files dev_s3.py did not write: {sorted(stray)}", file=sys.stderr)
        return 1
    for pid in _running_pids(state):
        stop_process_group(pid)
        print(f"dev S3 stopped (pid {pid})", file=sys.stderr)
    leftover = _running_pids(state)
    if leftover:
        print(f"weed still running after SIGKILL: {leftover}", file=sys.stderr)
        return 1
    if args.keep_data:
        for name in ("pid", "endpoint"):
            (state / name).unlink(missing_ok=True)
        print(f"dev S3 data kept in {state / 'data'}: the next start serves it again", file=sys.stderr)
        return 0
    shutil.rmtree(state)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("start", cmd_start), ("status", cmd_status), ("stop", cmd_stop)):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=lambda s: Path(s).absolute(), default=Path(".dev/s3").absolute())
        p.set_defaults(func=func)
        if name == "start":
            p.add_argument("--bucket", action="append", default=[], help="create this bucket (repeatable)")
            p.add_argument("--access-key", default=DEFAULT_ACCESS_KEY)
            p.add_argument("--secret-key", default=DEFAULT_SECRET_KEY)
        if name == "stop":
            p.add_argument("--keep-data", action="store_true", help="stop the server but keep its data for the next start")
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
