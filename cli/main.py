"""The `ckptfs` command.

`mount` runs the daemon (in the foreground, or detached with `--daemon`);
every other command talks to a running daemon through its control socket,
found via the `user.ckptfs.control` xattr on the mount root. Every error a
user can cause is one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

import typer

from ckptfs.config import ConfigError, fmt_bytes, load_config, parse_source
from ckptfs.version import VERSION

T = TypeVar("T")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="ckptfs: a write-back checkpoint gateway to S3.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ckptfs {VERSION}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print `ckptfs X.Y.Z` and exit."),
) -> None:
    """ckptfs: a write-back checkpoint gateway to S3."""

CONTROL_XATTR = "user.ckptfs.control"
EXIT_ERROR = 1
EXIT_USAGE = 2


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class NotAllowed(CliError):
    """This user may not use the mount or its control socket (FUSE without allow_other, the 0600 socket)."""


def fail(message: str, code: int = EXIT_ERROR) -> None:
    typer.echo(f"ckptfs: error: {message}", err=True)
    raise typer.Exit(code)


def _one_line_errors(fn):  # type: ignore[no-untyped-def]
    """Turn a CliError from a command into one line on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CliError as e:
            fail(str(e), e.code)
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper


# ----------------------------------------------------------------- helpers
def dead_mount(root: Path | str, fix: str = "") -> str:
    """The one message about a mount whose daemon is gone, wherever it is noticed."""
    fix = fix or f"run `ckptfs unmount {root}` to clean it up, then mount it again (its journal keeps what was not uploaded)"
    return f"the ckptfs daemon of {root} is not running (the mount is dead): {fix}"


def positive_timeout(timeout: Optional[float]) -> None:
    if timeout is not None and not timeout > 0:
        raise CliError(f"--timeout {timeout:g}: give a number of seconds greater than 0", EXIT_USAGE)


# how long a stat/getxattr of the mount may take before the daemon counts as not answering: generous, since a busy
# daemon on a saturated disk can take seconds; a stopped daemon is recognised within a second, whatever this is
MOUNT_ANSWER_SECONDS = 60.0


def _answering(path: Path, fn: Callable[[], T]) -> T:
    """Run `fn` (a system call on the mount) unless the daemon behind `path` does not answer.

    A FUSE call waits for the daemon without a limit: with the daemon stopped (SIGSTOP, a debugger)
    or hung, `ckptfs status` would hang with it. The call runs in a daemon thread that is left
    behind if it does not return in time (the process exits normally; the kernel ends the call).
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="ckptfs-mount-probe", daemon=True)
    t.start()
    deadline = time.monotonic() + MOUNT_ANSWER_SECONDS
    while True:
        t.join(1.0)
        if not t.is_alive():
            break
        mount = _fuse_mount_of(path)
        mountpoint = mount[0] if mount else str(path)
        stopped = stopped_daemon(mountpoint)
        if stopped:
            raise CliError(stopped)
        if time.monotonic() >= deadline:
            raise CliError(not_answering(mountpoint))
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def daemon_pids(mountpoint: str) -> list[int]:
    """Processes that look like the ckptfs daemon of `mountpoint` (a ckptfs command line naming it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if any("ckptfs" in a for a in argv) and any(os.path.abspath(a) == mountpoint.rstrip("/") for a in argv if a.startswith("/")):
            pids.append(int(entry))
    return pids


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def stopped_daemon(mountpoint: str, pids: list[int] | None = None) -> str | None:
    """The message for a daemon that is stopped (it answers nothing until resumed), or None."""
    stopped = [p for p in (daemon_pids(mountpoint) if pids is None else pids) if _proc_state(p) in ("T", "t")]
    if not stopped:
        return None
    return (f"the ckptfs daemon of {mountpoint} (pid {stopped[0]}) is stopped (SIGSTOP or a debugger) and answers nothing: "
            f"resume it with `kill -CONT {stopped[0]}`")


def not_answering(mountpoint: str) -> str:
    """The one message about a mount whose daemon exists but does not answer."""
    pids = daemon_pids(mountpoint)
    stopped = stopped_daemon(mountpoint, pids)
    if stopped:
        return stopped
    who = f" (pid {pids[0]})" if pids else ""
    return (f"the ckptfs daemon of {mountpoint}{who} did not answer within {MOUNT_ANSWER_SECONDS:g} s: it is hung or overloaded; "
            "see its log and docs/troubleshooting.md")


def find_mount_root(path: str) -> Path:
    p = Path(os.path.abspath(path))
    if _fuse_mount_of(p) is not None:
        return _answering(p, lambda: _find_mount_root(path, p))
    return _find_mount_root(path, p)


def _find_mount_root(path: str, p: Path) -> Path:
    try:
        if not p.exists():
            raise CliError(f"{path}: no such file or directory")
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise CliError(dead_mount(_mount_above(p))) from None
        mount = _fuse_mount_of(p)
        if e.errno in (errno.EACCES, errno.EPERM) and mount and os.access(os.path.dirname(mount[0]) or "/", os.X_OK):
            raise _not_allowed_on_mount(path, mount[1]) from None  # the mount point is reachable: FUSE said no
        raise CliError(f"{path}: {e.strerror}") from None
    cur = p
    while not os.path.ismount(cur):
        if cur.parent == cur:
            break
        cur = cur.parent
    try:
        os.getxattr(cur, CONTROL_XATTR)
    except OSError:
        raise CliError(f"{path} is not inside a ckptfs mount: give a path in a mounted one (`findmnt -t fuse.ckptfs` lists them), or mount it first") from None
    return cur


def _mount_above(p: Path) -> Path:
    """The mount point at or above `p` in the mount table (a dead mount cannot be stat'ed)."""
    mounts = []
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f if len(line.split()) > 1]
    except OSError:
        pass
    for cur in (p, *p.parents):
        if str(cur) in mounts:
            return cur
    return p


def _fuse_mount_of(path: Path) -> tuple[str, int | None] | None:
    """The ckptfs mount in the mount table that holds `path` (a dead one too, which stat cannot see), and its owner's uid."""
    best: tuple[str, int | None] | None = None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 4 or fields[2] != "fuse.ckptfs":
                    continue
                mnt = fields[1].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
                if not (str(path) == mnt or str(path).startswith(mnt.rstrip("/") + "/")):
                    continue
                uid = next((int(o[8:]) for o in fields[3].split(",") if o.startswith("user_id=") and o[8:].isdigit()), None)
                if best is None or len(mnt) > len(best[0]):
                    best = (mnt, uid)
    except OSError:
        return None
    return best


def _user_name(uid: int | None) -> str:
    import pwd

    if uid is None:
        return "the user who mounted it"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _not_allowed_on_mount(path: str | Path, uid: int | None) -> NotAllowed:
    who = _user_name(uid)
    return NotAllowed(f"{path}: permission denied: this ckptfs mount is open only to the user who mounted it ({who}): "
                      f"run the command as {who}, or mount with -o allow_other to let other users read and write it")


def control_socket(mount_root: Path) -> str:
    try:
        return _answering(mount_root, lambda: os.getxattr(mount_root, CONTROL_XATTR).decode())
    except OSError as e:
        mount = _fuse_mount_of(mount_root)
        if e.errno in (errno.EACCES, errno.EPERM) and mount:
            raise _not_allowed_on_mount(mount_root, mount[1]) from None
        raise CliError(f"{mount_root} is not a ckptfs mount ({e.strerror})") from None


def request(mount_root: Path, obj: dict[str, Any], timeout: float | None = 30.0) -> Iterator[dict[str, Any]]:
    """Send one request; yield each response line until the daemon closes the connection."""
    path = control_socket(mount_root)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        if e.errno in (errno.EACCES, errno.EPERM):
            owner = _owner_of(path, mount_root)
            who = "root (who mounted it)" if owner == "root" else f"the user who mounted it ({owner}) or root"
            how = "with sudo" if owner == "root" else f"as {owner} (sudo -u {owner} ckptfs ...) or as root"
            raise NotAllowed(f"{mount_root}: permission denied on its control socket {path}: only {who} may use it: "
                             f"run this command {how}") from None
        if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
            raise CliError(dead_mount(mount_root)) from None
        raise CliError(f"cannot reach the ckptfs daemon of {mount_root} at {path}: {e.strerror}") from None
    with s:
        s.sendall(json.dumps(obj).encode() + b"\n")
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                raise CliError(stopped_daemon(str(mount_root)) or f"the ckptfs daemon of {mount_root} did not answer in time") from None
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if not msg.get("ok"):
                    raise CliError(msg.get("error", "the daemon refused the request"))
                yield msg


def _owner_of(socket_path: str, mount_root: Path) -> str:
    """Name of the user who owns the control socket (if its directory is closed to us: who mounted the mount)."""
    try:
        return _user_name(os.stat(socket_path).st_uid)
    except OSError:
        mount = _fuse_mount_of(mount_root)
        return _user_name(mount[1] if mount else None)


def get_status(mount_root: Path) -> dict[str, Any]:
    for msg in request(mount_root, {"cmd": "status"}):
        return msg["status"]
    raise CliError("the daemon closed the connection without an answer")


def parse_options(options: list[str]) -> dict[str, str]:
    out = {}
    for opt in options:
        key, sep, value = opt.partition("=")
        if not sep:
            raise CliError(f"-o {opt!r} is not KEY=VALUE (for example -o part_size=128MiB)", EXIT_USAGE)
        out[key.strip().replace("-", "_")] = value.strip()
    return out


# ---------------------------------------------------------------- commands
@app.command()
def mount(
    source: Optional[str] = typer.Argument(None, help="s3://BUCKET or s3://BUCKET/PREFIX; may instead be `source` in the --config file."),
    mountpoint: Optional[str] = typer.Argument(None, help="Empty directory to mount on; may instead be `mountpoint` in the --config file."),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help="Local cache directory (journal + data)."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", help="S3 endpoint (MinIO, SeaweedFS, Ceph)."),
    config: Optional[str] = typer.Option(None, "--config", help="TOML config file; flags override it."),
    metrics_addr: Optional[str] = typer.Option(None, "--metrics-addr", help="HOST:PORT for Prometheus /metrics."),
    daemon: bool = typer.Option(False, "--daemon", help="Detach; return once the mount is ready."),
    option: list[str] = typer.Option([], "--option", "-o", help="Any config option as KEY=VALUE (repeatable)."),
    ready_fd: Optional[int] = typer.Option(None, "--ready-fd", hidden=True),
) -> None:
    """Mount a bucket. Foreground by default (for systemd); --daemon detaches.

    `ckptfs mount --config FILE` takes the source, mount point and everything
    else from FILE (as the systemd unit does); arguments and flags override it.
    """
    if source is not None and mountpoint is None and not source.startswith("s3://"):
        source, mountpoint = None, source  # `ckptfs mount --config FILE MOUNTPOINT`
    try:
        overrides: dict[str, Any] = dict(parse_options(option))
        if source is not None:
            overrides["bucket"], overrides["prefix"] = parse_source(source)
        flags = dict(mountpoint=mountpoint, cache_dir=cache_dir, endpoint_url=endpoint_url, metrics_addr=metrics_addr)
        overrides.update({k: v for k, v in flags.items() if v is not None})  # a flag not given leaves -o KEY=VALUE alone
        cfg = load_config(config, overrides=overrides)
    except (ConfigError, CliError) as e:
        fail(str(e), EXIT_USAGE)
    if daemon:
        detach([a for a in sys.argv[1:] if a != "--daemon"], cfg.cache_dir, cfg.mountpoint)
        return
    from ckptfs.daemon import run_daemon

    setup_logging(cfg.log_level)
    raise typer.Exit(run_daemon(cfg, ready_fd))


class JournalFormatter(logging.Formatter):
    """Log lines for systemd's journal: a `<N>` syslog priority prefix (sd-daemon(3)), no timestamp (the journal adds it)."""

    PRIORITIES = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

    def format(self, record: logging.LogRecord) -> str:
        return f"<{self.PRIORITIES.get(record.levelno, 6)}>{super().format(record)}"


def stderr_is_journal() -> bool:
    """True when stderr is systemd's journal stream ($JOURNAL_STREAM names its device and inode)."""
    dev_ino = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return dev_ino == f"{st.st_dev}:{st.st_ino}"


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler()
    if stderr_is_journal():
        handler.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def detach(argv: list[str], cache_dir: str, mountpoint: str) -> None:
    """Start the foreground daemon as a detached child; wait until it says READY or ERROR."""
    from ckptfs.daemon import UserError, check_cache_dir

    try:
        check_cache_dir(cache_dir, mountpoint)  # the log goes there: say what is wrong with it, as the daemon would
    except UserError as e:
        fail(str(e))
    log_path = Path(cache_dir) / "ckptfs.log"
    try:
        os.umask(0o077)  # the log and all the daemon writes are the owner's alone, whatever the caller's umask
        log_file = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
        os.fchmod(log_file.fileno(), 0o600)
    except OSError as e:
        fail(f"cannot write the log {log_path}: {e.strerror} (is --cache-dir a writable directory?)")
    r, w = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "ckptfs.cli", *argv, "--ready-fd", str(w)],
        stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, pass_fds=(w,), start_new_session=True,
    )
    os.close(w)
    log_file.close()
    with os.fdopen(r, "rb") as pipe:
        line = pipe.readline().decode(errors="replace").strip()
    if line == "READY":
        typer.echo(f"ckptfs: mounted at {mountpoint} (pid {child.pid}, log {log_path})")
        return
    if line.startswith("ERROR "):
        child.wait(timeout=30)
        fail(line[6:])
    code = child.wait()
    tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
    fail(f"the daemon exited during start-up (status {code}): {tail[0] if tail else 'no log'} (log: {log_path})")


@app.command()
@_one_line_errors
def unmount(
    mountpoint: str = typer.Argument(..., help="The mount point."),
    flush: bool = typer.Option(False, "--flush", help="Wait until everything is durable in the bucket first."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="With --flush: give up after this many seconds."),
    force: bool = typer.Option(False, "--force", help="Unmount even while files are open for writing (their writers get errors)."),
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
        return
    writers = st.get("open_for_writing") or []
    if writers and not force:
        from ckptfs.control import open_for_writing_message

        raise CliError(open_for_writing_message(writers))
    if flush:
        wait_durable(root, "", timeout)
    pid = st["pid"]
    left: dict[str, Any] = {}
    wait = None if flush else float(st.get("shutdown_timeout", 30)) + 30
    try:
        for msg in request(root, {"cmd": "unmount", "flush": flush, "force": force}, timeout=wait):
            if msg.get("done"):
                left = msg
                break
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
    # a zombie child of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _is_dead_mount(path: Path) -> bool:
    try:
        os.stat(path)
        return False
    except OSError as e:
        import errno

        return e.errno == errno.ENOTCONN


@app.command()
@_one_line_errors
def status(
    mountpoint: str = typer.Argument(..., help="The mount point."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (with --watch: one JSON object per line)."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C."),
    interval: float = typer.Option(2.0, "--interval", "-n", min=0.1, help="With --watch: seconds between refreshes."),
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
@_one_line_errors
def flush(
    path: str = typer.Argument(..., help="A file or directory in the mount, or the mount point."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Give up after this many seconds (exit 1)."),
) -> None:
    """Block until every file under PATH is durable in the bucket."""
    positive_timeout(timeout)
    root = find_mount_root(path)
    wait_durable(root, _rel(root, path), timeout, label=path)
    typer.echo(f"ckptfs: {path} is durable")


def _rel(root: Path, path: str) -> str:
    rel = os.path.relpath(os.path.abspath(path), root)
    return "" if rel == "." else rel


@app.command()
@_one_line_errors
def warmup(
    paths: list[str] = typer.Argument(..., help="Files or directories in the mount to read into the local cache."),
) -> None:
    """Pre-stage files or trees from the bucket into the local cache (exit 1 if any file fails)."""
    from ckptfs.cli.display import plural

    root = find_mount_root(paths[0])
    rels = []
    for p in paths:
        if find_mount_root(p) != root:
            raise CliError(f"{p} is not in the same ckptfs mount as {paths[0]}: run one warmup per mount")
        rels.append(_rel(root, p))
    progress = None
    if sys.stdout.isatty():
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

        progress = Progress(TextColumn("warmup {task.fields[files]} files"), BarColumn(), DownloadColumn(binary_units=True),
                            TransferSpeedColumn(), TimeElapsedColumn())
        progress.start()
        task = progress.add_task("warmup", total=None, files="?")
    files = total = 0
    failed: list[list[str]] = []
    try:
        for msg in request(root, {"cmd": "warmup", "paths": rels}, timeout=None):
            if msg.get("done"):
                failed = msg["failed"]
                break
            files, total = msg["files"], msg["bytes"]
            if progress:
                progress.update(task, total=total, completed=msg["done_bytes"], files=files)
        else:
            raise CliError("the daemon stopped before the warmup finished (is it shutting down?)")
    finally:
        if progress:
            progress.stop()
    for path, error in failed:
        typer.echo(f"ckptfs: {path}: {error}", err=True)
    if failed:
        raise CliError(f"{len(failed)} of {plural(max(files, len(failed)), 'file')} could not be read from the bucket (see above)")
    typer.echo(f"ckptfs: {plural(files, 'file')} ({fmt_bytes(total)}) {'is' if files == 1 else 'are'} in the cache")


@app.command()
@_one_line_errors
def evict(
    path: str = typer.Argument(..., help="A file or directory in the mount, or the mount point."),
) -> None:
    """Drop the local copies of durable files under PATH (they are read from the bucket again when needed)."""
    from ckptfs.cli.display import plural

    root = find_mount_root(path)
    for msg in request(root, {"cmd": "evict", "path": _rel(root, path)}):
        note = f"; {msg['skipped']} not durable yet or in use were kept" if msg["skipped"] else ""
        typer.echo(f"ckptfs: evicted {plural(msg['files'], 'file')} ({fmt_bytes(msg['bytes'])}){note}")
        return
    raise CliError("the daemon closed the connection without an answer")


def wait_durable(root: Path, rel: str, timeout: Optional[float], label: str | None = None) -> None:
    """Flush `rel` and show its progress by bytes (parts already in the bucket count), with throughput and ETA."""
    from ckptfs.cli import display

    label = label or str(root)
    deadline = None if timeout is None else time.monotonic() + timeout
    last: dict[str, Any] = {}
    progress = display.FlushProgress(label, display.make_console())
    try:
        sock_timeout = None if timeout is None else max(timeout, 1.0)
        try:
            for msg in request(root, {"cmd": "flush", "path": rel}, timeout=sock_timeout):
                if msg.get("done"):
                    progress.finish()
                    return
                last = msg
                progress.update(msg)
                if deadline is not None and time.monotonic() > deadline:
                    in_bucket = f", {fmt_bytes(last['uploaded_bytes'])} of it in the bucket already" if last.get("uploaded_bytes") else ""
                    raise CliError(
                        f"timed out after {timeout:g}s: {display.plural(last['files'], 'file')} ({fmt_bytes(last['bytes'])}{in_bucket}) and "
                        f"{display.plural(last['deletes'], 'deletion')} under {label} are not durable yet; see `ckptfs status {root}`"
                    )
        except CliError as e:
            if "did not answer in time" in str(e) and deadline is not None:
                raise CliError(f"timed out after {timeout:g}s waiting for {label} to become durable; see `ckptfs status {root}`") from None
            raise
        raise CliError("the daemon stopped before the flush finished (is it shutting down?)")
    finally:
        progress.close()


from ckptfs.cli import lifecycle as _lifecycle  # noqa: E402,F401 - registers checkpoint, checkpoints, verify, protect, ...
from ckptfs.cli import storage as _storage  # noqa: E402,F401 - registers policy, lifecycle, restore, usage


def main() -> None:
    from ckptfs.cli.fstab import FstabError, is_mount_helper_call, mount_args

    argv = sys.argv[1:]
    commands = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback is not None}
    commands |= {g.name for g in app.registered_groups if g.name}
    if is_mount_helper_call(argv, commands):
        # run by mount(8) via mount.fuse3 (`mount -t fuse.ckptfs`, fstab): SOURCE MOUNTPOINT -o OPTIONS
        try:
            args = mount_args(argv)
        except FstabError as e:
            typer.echo(f"ckptfs: error: {e}", err=True)
            sys.exit(EXIT_USAGE)
        if args is None:
            return
        sys.argv = [sys.argv[0], *args]  # `--daemon` re-runs sys.argv[1:] in the child
    sys.exit(run_app())


def run_app() -> int:
    """Run the typer app; a usage error (bad option value, missing argument) is one line too, exit 2."""
    try:  # typer >= 0.22 carries its own copy of click
        from typer._click.exceptions import ClickException, UsageError
    except ImportError:  # pragma: no cover - older typer on click
        from click.exceptions import ClickException, UsageError  # type: ignore[no-redef]
    try:
        rv = app(prog_name="ckptfs", standalone_mode=False)
    except ClickException as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()  # `ckptfs` alone: the help
            return EXIT_USAGE
        message = " ".join(e.format_message().split())
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if isinstance(e, UsageError) and ctx is not None else ""
        typer.echo(f"ckptfs: error: {message}{hint}", err=True)
        return e.exit_code
    except typer.Abort:
        return EXIT_ERROR
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    main()
