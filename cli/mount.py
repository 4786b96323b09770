"""`ckptfs mount`: run the daemon in the foreground (systemd), or detached with `--daemon`.

With `--daemon` the command starts itself again as a detached child with a readiness pipe
(`--ready-fd`) and returns once the child says READY (or prints the child's ERROR line). The
daemon's modules (pyfuse3, trio, boto3) are imported only when a mount starts, so the other
commands start fast.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from ckptfs.cli.app import app, fail
from ckptfs.cli.daemonlog import PRIORITIES, DaemonLogHandler, stderr_fd
from ckptfs.cli.errors import EXIT_USAGE, CliError
from ckptfs.config import FIELDS, ConfigError, did_you_mean, load_config, parse_source


# mount(8)'s words for read-only and read-write, as in `mount -o ro`
MOUNT_WORDS = {"ro": ("read_only", "true"), "rw": ("read_only", "false")}


def parse_options(options: list[str]) -> dict[str, str]:
    """`-o KEY=VALUE` options as config keys (dashes become underscores).

    A boolean option may be given as mount(8) and every FUSE file system take it: `-o allow_other`
    sets it, `-o noallow_other` clears it; `-o ro` and `-o rw` are `read_only` true and false;
    `-o allow_other,ro` is a list of such words. A value may hold commas (`commit_markers=a,b`), so
    a list of KEY=VALUE takes one -o each.
    """
    out = {}
    words = [w for opt in options for w in (opt.split(",") if "=" not in opt else [opt])]
    for opt in words:
        key, sep, value = opt.partition("=")
        key = key.strip().replace("-", "_")
        if sep and "," not in key:
            out[key] = value.strip()
            continue
        if key in MOUNT_WORDS:
            name, value = MOUNT_WORDS[key]
        elif is_bool_option(key):
            name, value = key, "true"
        elif key.startswith("no") and is_bool_option(key[2:]):
            name, value = key[2:], "false"
        elif key in FIELDS:
            raise CliError(f"-o {opt!r} needs a value: -o {key}=VALUE (docs/configuration.md)", EXIT_USAGE)
        else:
            hint = " (one option per -o: -o A -o B)" if "," in opt else did_you_mean(key, FIELDS)
            raise CliError(f"-o {opt!r} is neither KEY=VALUE nor a yes/no option{hint} "
                           "(for example -o part_size=128MiB, -o allow_other)", EXIT_USAGE)
        out[name] = value
    return out


def is_bool_option(name: str) -> bool:
    return name in FIELDS and FIELDS[name].type in ("bool", bool)


@app.command()
def mount(
    source: Optional[str] = typer.Argument(None, metavar="SOURCE", show_default=False,
                                           help="s3://BUCKET or s3://BUCKET/PREFIX; may instead be `source` in the --config file."),
    mountpoint: Optional[str] = typer.Argument(None, metavar="MOUNTPOINT", show_default=False,
                                               help="Empty directory to mount on; may instead be `mountpoint` in the --config file."),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", metavar="DIR",
                                            help="Local cache directory (journal + data) (default: `cache_dir` of the --config file)."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", metavar="URL",
                                               help="S3 endpoint (MinIO, SeaweedFS, Ceph) (default: AWS S3, or `endpoint_url` of the --config file)."),
    config: Optional[str] = typer.Option(None, "--config", metavar="FILE", help="TOML config file; flags override it (default: none)."),
    metrics_addr: Optional[str] = typer.Option(None, "--metrics-addr", metavar="HOST:PORT",
                                               help="Serve Prometheus /metrics there (default: no metrics endpoint)."),
    daemon: bool = typer.Option(False, "--daemon", help="Detach; return once the mount is ready (default: run in the foreground)."),
    option: list[str] = typer.Option([], "--option", "-o", metavar="KEY=VALUE", show_default=False,
                                     help="Any config option (docs/configuration.md); a yes/no one also as NAME or noNAME (-o allow_other), and ro/rw for read_only; repeatable (default: the --config file's, else each option's default)."),
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
        from ckptfs.peering import peer_warnings

        for w in peer_warnings(cfg):  # the detached daemon logs them too, where nobody reads them at mount time
            typer.echo(f"ckptfs: warning: {w}", err=True)
        detach([a for a in sys.argv[1:] if a != "--daemon"], cfg.cache_dir, cfg.mountpoint)
        return
    from ckptfs.daemon import run_daemon

    setup_logging(cfg.log_level)
    raise typer.Exit(run_daemon(cfg, ready_fd))


class JournalFormatter(logging.Formatter):
    """Log lines for systemd's journal: a `<N>` syslog priority prefix (sd-daemon(3)), no timestamp (the journal adds it)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{PRIORITIES.get(record.levelno, 6)}>{super().format(record)}"


def stderr_is_journal() -> bool:
    """True when stderr is systemd's journal stream ($JOURNAL_STREAM names its device and inode)."""
    dev_ino = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return dev_ino == f"{st.st_dev}:{st.st_ino}"


def setup_logging(level: str) -> None:
    """The foreground daemon's log on stderr: timestamped, or with journal priorities under systemd; a line stderr
    cannot take (the log file on a full cache disk) goes to the system log and is written later (daemonlog.py)."""
    handler = DaemonLogHandler(stderr_fd())
    if stderr_is_journal():
        handler.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def detach(argv: list[str], cache_dir: str, mountpoint: str) -> None:
    """Start the foreground daemon as a detached child; wait until it says READY or ERROR."""
    from ckptfs.preflight import UserError, check_cache_dir, check_cache_dir_free

    try:
        check_cache_dir(cache_dir, mountpoint)  # the log goes there: say what is wrong with it, as the daemon would
        found = set(os.listdir(cache_dir))
        check_cache_dir_free(cache_dir)  # and a running daemon's log is not ours to write a refusal into
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
        remove_if_created(Path(cache_dir), found)
        fail(line[6:])
    code = child.wait()
    tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
    fail(f"the daemon exited during start-up (status {code}): {tail[0] if tail else 'no log'} (log: {log_path})")


def remove_if_created(cache_dir: Path, found: set[str]) -> None:
    """After a start the daemon refused with one line (the line says why): the log and lock file this command
    created go, so the cache directory is as it was found (the daemon removed what it created itself).

    The lock file is removed only while we hold its lock: a daemon started meanwhile keeps its lock. A start
    that failed without its line keeps its log, which the message names.
    """
    log_path = cache_dir / "ckptfs.log"
    if "ckptfs.log" not in found:
        log_path.unlink(missing_ok=True)
    if "lock" in found:
        return
    try:
        fd = os.open(cache_dir / "lock", os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(cache_dir / "lock")
    except OSError:
        pass  # held by a daemon started meanwhile, or gone: not ours to remove
    finally:
        os.close(fd)
