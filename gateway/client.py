"""The client of a mount's control socket, shared by the `ckptfs` command and the Python API (`import ckptfs`).

Finds the mount a path is in, its daemon and its socket (the `user.ckptfs.control` xattr on the mount
root), sends one request and reads the daemon's JSON lines: one line, or progress lines and then one
marked `done` (`until_done`). A reply {"ok": false, "error": ...} and every failure to reach the daemon
(no mount, a dead or stopped daemon, a socket this user may not use) is a `CkptfsError` whose one-line
message says what to do: the CLI prints it, a training script gets it as an exception. Standard
library only, since every process that imports `ckptfs` (the CLI, the daemon, a training job) loads it.
"""

from __future__ import annotations

import errno
import getpass
import json
import os
import pwd
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")

CONTROL_XATTR = "user.ckptfs.control"
STATE_XATTR = "user.ckptfs.state"

EXIT_ERROR = 1
EXIT_USAGE = 2


class CkptfsError(Exception):
    """Something the user can fix, in one line; `code` is the exit status the `ckptfs` command gives it."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class DaemonRefused(CkptfsError):
    """The daemon of `mount_root` answered a request with an error: its message names paths relative to that root
    (the CLI rewrites the commands it quotes so they work from the user's directory)."""

    def __init__(self, message: str, mount_root: Path) -> None:
        super().__init__(message)
        self.mount_root = mount_root


class NotAllowed(CkptfsError):
    """This user may not use the mount or its control socket (FUSE without allow_other, the 0600 socket)."""


class StoppedEarly(CkptfsError):
    """The daemon closed a streamed request before its final reply (it is shutting down, or died)."""


class TimedOut(CkptfsError):
    """What was waited for (files becoming durable) did not happen within the caller's timeout."""


# how long a stat/getxattr of the mount may take before the daemon counts as not answering: generous, since a busy
# daemon on a saturated disk can take seconds; a stopped daemon is recognised within a second, whatever this is
MOUNT_ANSWER_SECONDS = 60.0


def dead_mount(root: Path | str, fix: str = "") -> str:
    """The one message about a mount whose daemon is gone, wherever it is noticed."""
    fix = fix or f"run `ckptfs unmount {root}` to clean it up, then mount it again (its journal keeps what was not uploaded)"
    return f"the ckptfs daemon of {root} is not running (the mount is dead): {fix}"


# ------------------------------------------------------------ the daemon's process
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


def process_state(pid: int) -> str:
    """The state letter of process `pid` in /proc (R, S, T for stopped, Z for a zombie...), "" if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def stopped_daemon(mountpoint: str, pids: list[int] | None = None) -> str | None:
    """The message for a daemon that is stopped (it answers nothing until resumed), or None."""
    stopped = [p for p in (daemon_pids(mountpoint) if pids is None else pids) if process_state(p) in ("T", "t")]
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
            raise CkptfsError(stopped)
        if time.monotonic() >= deadline:
            raise CkptfsError(not_answering(mountpoint))
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


# ------------------------------------------------------------ the mount of a path
def find_mount_root(path: str) -> Path:
    """The root of the ckptfs mount `path` is in (a CkptfsError saying why not, if it is in none)."""
    p = Path(os.path.abspath(path))
    if _fuse_mount_of(p) is not None:
        return _answering(p, lambda: _find_mount_root(path, p))
    return _find_mount_root(path, p)


def _find_mount_root(path: str, p: Path) -> Path:
    try:
        if not p.exists():
            raise CkptfsError(f"{path}: no such file or directory")
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise CkptfsError(dead_mount(_mount_above(p))) from None
        mount = _fuse_mount_of(p)
        if e.errno in (errno.EACCES, errno.EPERM) and mount and os.access(os.path.dirname(mount[0]) or "/", os.X_OK):
            raise _not_allowed_on_mount(path, mount[1]) from None  # the mount point is reachable: FUSE said no
        raise CkptfsError(f"{path}: {e.strerror}") from None
    cur = p
    while not os.path.ismount(cur):
        if cur.parent == cur:
            break
        cur = cur.parent
    try:
        os.getxattr(cur, CONTROL_XATTR)
    except OSError:
        raise CkptfsError(f"{path} is not inside a ckptfs mount: give a path in a mounted one (`findmnt -t fuse.ckptfs` lists them), or mount it first") from None
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


def rel_path(root: Path, path: str) -> str:
    """`path` relative to the mount root `root`, as the daemon's requests name it ("" for the root itself)."""
    rel = os.path.relpath(os.path.abspath(path), root)
    return "" if rel == "." else rel


def locate(path: str) -> tuple[Path, str]:
    """The mount `path` is in and `path` relative to it."""
    root = find_mount_root(path)
    return root, rel_path(root, path)


def locate_on_replica(path: str) -> tuple[Path, str]:
    """The mount and path of a checkpoint checked on a replica (`--target`): it may be gone from the primary (its
    retention deleted it, the replica's own kept it)."""
    return locate_above(path)


def locate_above(path: str) -> tuple[Path, str]:
    """The mount and path of something that may not exist (yet, or any more): the mount is found from the
    nearest directory above it."""
    p = Path(os.path.abspath(path))
    above = p
    try:
        while not above.exists() and above.parent != above:
            above = above.parent
    except OSError:
        return locate(path)  # a dead mount and kin: find_mount_root says which, in one line
    root = find_mount_root(str(above))
    return root, rel_path(root, str(p))


# ------------------------------------------------------------ the control socket
def control_socket(mount_root: Path) -> str:
    """The path of the control socket of the daemon serving `mount_root`."""
    try:
        return _answering(mount_root, lambda: os.getxattr(mount_root, CONTROL_XATTR).decode())
    except OSError as e:
        mount = _fuse_mount_of(mount_root)
        if e.errno in (errno.EACCES, errno.EPERM) and mount:
            raise _not_allowed_on_mount(mount_root, mount[1]) from None
        raise CkptfsError(f"{mount_root} is not a ckptfs mount ({e.strerror})") from None


def file_state(path: str) -> str:
    """A file's upload state in the mount (dirty, uploading, durable; archived or restoring), from its xattr."""
    p = Path(os.path.abspath(path))
    try:
        return _answering(p, lambda: os.getxattr(p, STATE_XATTR).decode())
    except OSError as e:
        raise CkptfsError(f"{path}: {e.strerror}") from None


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
            raise CkptfsError(dead_mount(mount_root)) from None
        raise CkptfsError(f"cannot reach the ckptfs daemon of {mount_root} at {path}: {e.strerror}") from None
    with s:
        s.sendall(json.dumps(obj).encode() + b"\n")
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                raise CkptfsError(stopped_daemon(str(mount_root)) or f"the ckptfs daemon of {mount_root} did not answer in time") from None
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if not msg.get("ok"):
                    raise DaemonRefused(msg.get("error", "the daemon refused the request"), mount_root)
                yield msg


def _owner_of(socket_path: str, mount_root: Path) -> str:
    """Name of the user who owns the control socket (if its directory is closed to us: who mounted the mount)."""
    try:
        return _user_name(os.stat(socket_path).st_uid)
    except OSError:
        mount = _fuse_mount_of(mount_root)
        return _user_name(mount[1] if mount else None)


def one_reply(mount_root: Path, req: dict[str, Any], timeout: float | None = 300.0) -> dict[str, Any]:
    """Send a request the daemon answers with one line; return it.

    The default timeout is long: the lifecycle commands list the bucket before they answer.
    """
    for msg in request(mount_root, req, timeout=timeout):
        return msg
    raise CkptfsError("the daemon closed the connection without an answer")


def until_done(mount_root: Path, req: dict[str, Any], what: str, timeout: float | None = None,
               on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Send a request the daemon answers with progress lines and then one marked `done`; return that one.

    Each progress line goes to `on_progress` (which may raise to give up). If the daemon closes the
    connection first: StoppedEarly, "the daemon stopped before the WHAT finished".
    """
    for msg in request(mount_root, req, timeout=timeout):
        if msg.get("done"):
            return msg
        if on_progress is not None:
            on_progress(msg)
    raise StoppedEarly(f"the daemon stopped before the {what} finished (is it shutting down?)")


def until_durable(mount_root: Path, rel: str, timeout: float | None, label: str,
                  on_progress: Callable[[dict[str, Any]], None] | None = None, level: str = "durable") -> None:
    """Block until every file under `rel` is durable in the bucket (`ckptfs flush`, `ckptfs.wait_durable`), or with
    level `replicated` durable or on peers' disks (`flush --level replicated`; a mount with durability = peer).

    Each progress line (files, bytes, deletes not yet there; bytes of them in the bucket already) goes to
    `on_progress`. Past `timeout` seconds: TimedOut, saying what under `label` is not durable (replicated) yet.
    """
    deadline = None if timeout is None else time.monotonic() + timeout

    def progress(msg: dict[str, Any]) -> None:
        if on_progress is not None:
            on_progress(msg)
        if deadline is not None and time.monotonic() > deadline:
            from ckptfs.config import fmt_bytes  # here, not at the top: a training job's `import ckptfs` need not load the config

            in_bucket = f", {fmt_bytes(msg['uploaded_bytes'])} of it in the bucket already" if msg.get("uploaded_bytes") else ""
            deletes = f" and {_plural(msg['deletes'], 'deletion')}" if level == "durable" or msg.get("deletes") else ""
            raise TimedOut(
                f"timed out after {timeout:g}s: {_plural(msg['files'], 'file')} ({fmt_bytes(msg['bytes'])}{in_bucket}){deletes} "
                f"under {label} are not {level} yet; see `ckptfs status {mount_root}`"
            )

    sock_timeout = None if timeout is None else max(timeout, 1.0)
    request = {"cmd": "flush", "path": rel} if level == "durable" else {"cmd": "flush", "path": rel, "level": level}
    try:
        until_done(mount_root, request, "flush", timeout=sock_timeout, on_progress=progress)
    except TimedOut:
        raise
    except CkptfsError as e:
        if "did not answer in time" in str(e) and timeout is not None:
            verb = "become durable" if level == "durable" else f"be {level}"
            raise TimedOut(f"timed out after {timeout:g}s waiting for {label} to {verb}; see `ckptfs status {mount_root}`") from None
        raise


def _plural(n: float, word: str) -> str:
    return f"{n:g} {word if n == 1 else word + 's'}"


def get_status(mount_root: Path) -> dict[str, Any]:
    """The daemon's status (what `ckptfs status --json` prints)."""
    return one_reply(mount_root, {"cmd": "status"}, timeout=30.0)["status"]  # type: ignore[no-any-return]


def requester() -> dict[str, Any]:
    """Who asks (the user behind sudo, if any): recorded in the audit log with protect, unprotect and retention."""
    try:
        user = os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"user": user, "uid": os.getuid()}
