"""NFS-Ganesha (and rpcbind, if none runs) on 127.0.0.1 for the NFS gateway test, with temp paths and free ports.

The server runs deploy/nfs/ganesha.conf as shipped, with only the export path, the two
ports and the NFSv4 recovery directory replaced (the recovery directory lives in the test's
work directory, so it outlives a restart of the server as /var/lib/nfs/ganesha would). rpcbind is needed because Ganesha will not start without registering its
programs; the libnfs client is given the ports in the URL, so it never asks rpcbind and is
not confused by another NFS server registered there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.seaweed import free_port

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = ROOT / "deploy" / "nfs" / "ganesha.conf"
TOOLS = ("ganesha.nfsd", "rpcbind", "rpcinfo", "nfs-cp", "nfs-cat", "nfs-ls")


def missing_tools() -> list[str]:
    missing = [t for t in TOOLS if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]
    if not any(Path(d).glob("libfsalvfs.so") for d in ("/usr/lib/x86_64-linux-gnu/ganesha", "/usr/lib/aarch64-linux-gnu/ganesha", "/usr/lib64/ganesha")):
        missing.append("nfs-ganesha-vfs (libfsalvfs.so)")
    return missing


def _which(tool: str) -> str:
    return shutil.which(tool) or f"/usr/sbin/{tool}"


def _stop(proc: subprocess.Popen, limit: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class GaneshaServer:
    def __init__(self, workdir: Path, export_path: Path) -> None:
        self.workdir = workdir
        self.export_path = export_path
        self.nfs_port = free_port()
        self.mnt_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.rpcbind: subprocess.Popen | None = None
        self.log = workdir / "ganesha.log"

    def config_text(self) -> str:
        text = SHIPPED_CONFIG.read_text()
        for old, new in (("Path = /mnt/ckpt;", f"Path = {self.export_path};"),
                         ("NFS_Port = 2049;", f"NFS_Port = {self.nfs_port};"),
                         ("MNT_Port = 20048;", f"MNT_Port = {self.mnt_port};"),
                         ("RecoveryRoot = /var/lib/nfs/ganesha;", f"RecoveryRoot = {self.workdir / 'recovery'};")):
            assert text.count(old) == 1, f"deploy/nfs/ganesha.conf no longer has {old!r}"
            text = text.replace(old, new)
        return text

    def url(self, path: str) -> str:
        return f"nfs://127.0.0.1/ckpt/{path}?nfsport={self.nfs_port}&mountport={self.mnt_port}"

    def start(self, limit: float = 60.0) -> None:
        if subprocess.run([_which("rpcinfo"), "-p", "127.0.0.1"], capture_output=True, timeout=30).returncode != 0:
            self.rpcbind = subprocess.Popen([_which("rpcbind"), "-f"], stdout=subprocess.DEVNULL,
                                            stderr=open(self.workdir / "rpcbind.log", "wb"), start_new_session=True)
            deadline = time.monotonic() + limit
            while subprocess.run([_which("rpcinfo"), "-p", "127.0.0.1"], capture_output=True, timeout=30).returncode != 0:
                if self.rpcbind.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"rpcbind did not start: {(self.workdir / 'rpcbind.log').read_text()}")
                time.sleep(0.1)
        conf = self.workdir / "ganesha.conf"
        conf.write_text(self.config_text())
        seen = self.log.stat().st_size if self.log.exists() else 0  # a restart appends to the same log
        self.proc = subprocess.Popen(
            [_which("ganesha.nfsd"), "-F", "-f", str(conf), "-L", str(self.log), "-p", str(self.workdir / "ganesha.pid"), "-N", "NIV_EVENT"],
            stdout=subprocess.DEVNULL, stderr=open(self.workdir / "ganesha.stderr", "wb"), start_new_session=True,
        )
        deadline = time.monotonic() + limit
        while True:
            text = self.log.read_bytes()[seen:].decode(errors="replace") if self.log.exists() else ""
            if "NFS SERVER INITIALIZED" in text:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline or ":FATAL :" in text or ":MAJ :" in text:
                self.stop()
                raise RuntimeError("ganesha.nfsd did not start: " + "\n".join(text.splitlines()[-15:]))
            time.sleep(0.1)

    def kill(self) -> None:
        """Ganesha gone at once (SIGKILL), rpcbind left running: what a crash, or systemd's stop after its timeout, leaves."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
        if self.rpcbind is not None:
            _stop(self.rpcbind)
