"""The systemd unit: it verifies, and the daemon keeps the Type=notify contract with a real service manager's socket.

The handshake test plays systemd: it binds the NOTIFY_SOCKET datagram socket, starts
`ckptfs mount --config FILE` in the foreground the way the unit's ExecStart does (under the
unit's NoNewPrivileges and CapabilityBoundingSet, applied with setpriv), and checks what
arrives: READY=1 only once the mount answers, STATUS= lines, then on SIGTERM STOPPING=1 with
a stop timeout extension derived from shutdown_timeout, and exit status 0.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptfs.config import Config
from ckptfs.daemon import STOP_MARGIN_SECONDS
from tests.conftest import ROOT, fuse_usable, sha256_file, write_random

UNIT = ROOT / "systemd" / "ckptfs@.service"
MiB = 1 << 20


def unit_service_section() -> dict[str, list[str]]:
    """[Service] of the unit, every value of repeated keys kept."""
    values: dict[str, list[str]] = {}
    section = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "Service":
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_unit_promises() -> None:
    svc = unit_service_section()
    assert svc["Type"] == ["notify"]
    assert svc["ExecStart"] == ["/usr/local/bin/ckptfs mount --config /etc/ckptfs/%i.toml"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["RestartPreventExitStatus"] == ["2"]  # a config error: restarting cannot help
    # the stop drains up to shutdown_timeout: the default one must fit in TimeoutStopSec
    assert float(svc["TimeoutStopSec"][0]) >= Config().shutdown_timeout + 10
    assert svc["KillMode"] == ["mixed"]  # one SIGTERM to the daemon; a second one would cut the drain
    assert svc["DeviceAllow"] == ["/dev/fuse rw"]
    for key in svc:
        # each of these would give the service its own mount namespace: the FUSE mount would be invisible
        assert key not in {"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "ReadWritePaths",
                           "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups", "MountFlags"}, key


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (Debian package systemd)")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this checkout's command
    exe = Path(sys.executable).parent / "ckptfs"
    if not exe.exists():
        exe = tmp_path / "ckptfs"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    text = UNIT.read_text().replace("/usr/local/bin/ckptfs", str(exe))
    (tmp_path / "ckptfs@.service").write_text(text)
    (tmp_path / "ckptfs@ckpt.service").symlink_to("ckptfs@.service")
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "ckptfs@ckpt.service")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ckptfs@" not in proc.stderr, proc.stderr  # verify only warns about lines it cannot parse
    # the check is real: a typo in the unit is reported
    (tmp_path / "typo@.service").write_text(text.replace("KillMode=mixed", "KillMode=mixd"))
    (tmp_path / "typo@ckpt.service").symlink_to("typo@.service")
    bad = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "typo@ckpt.service")],
                         capture_output=True, text=True, timeout=60)
    assert "kill mode" in bad.stderr


def in_mount_table(path: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


class NotifySocket:
    """The service manager's end of sd_notify: a datagram socket that collects messages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []

    def receive(self, proc: subprocess.Popen, want: str, limit: float = 120.0) -> dict[str, str]:
        """Wait for a message with variable `want`; fail if the daemon exits first."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.sock], [], [], 0.2)
            if ready:
                raw = self.sock.recv(65536).decode()
                msg = dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)
                self.messages.append(msg)
                if want in msg:
                    return msg
            elif proc.poll() is not None:
                raise AssertionError(f"daemon exited ({proc.returncode}) before sending {want}; got {self.messages}")
        raise AssertionError(f"no {want} from the daemon; got {self.messages}")

    def close(self) -> None:
        self.sock.close()


def unit_sandbox() -> list[str]:
    """setpriv arguments applying the unit's NoNewPrivileges and CapabilityBoundingSet."""
    svc = unit_service_section()
    caps = ",".join("+" + c.lower().removeprefix("cap_") for c in svc["CapabilityBoundingSet"][0].split())
    assert svc["NoNewPrivileges"] == ["yes"]
    if shutil.which("setpriv") is None:
        return []
    return ["setpriv", "--no-new-privs", "--bounding-set", f"-all,{caps}", "--inh-caps", "-all"]


def test_notify_handshake_ready_status_stopping(s3, bucket: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if not fuse_usable():
        pytest.skip("/dev/fuse is not usable here")
    mnt, cache = tmp_path / "mnt", tmp_path / "cache"
    mnt.mkdir()
    cache.mkdir()
    config = tmp_path / "ckpt.toml"
    config.write_text(
        f'source = "s3://{bucket}/svc"\nmountpoint = "{mnt}"\ncache_dir = "{cache}"\n'
        f'endpoint_url = "{s3.endpoint_url}"\nshutdown_timeout = 7\nupload_delay = 0.2\n'
    )
    notify = NotifySocket(tmp_path / "notify.sock")
    log_path = tmp_path / "journal.log"
    log = open(log_path, "wb")
    st = os.fstat(log.fileno())
    env = {**os.environ, **s3.env(), "NOTIFY_SOCKET": str(notify.path), "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    proc = subprocess.Popen([*unit_sandbox(), sys.executable, "-m", "ckptfs.cli", "mount", "--config", str(config)],
                            cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        ready = notify.receive(proc, "READY")
        # the mount answers by the time systemd is told it is ready
        assert os.path.ismount(mnt)
        assert os.listdir(mnt) == []
        assert ready["READY"] == "1" and ready["STATUS"] == f"mounted s3://{bucket}/svc at {mnt}"
        digest = write_random(mnt / "step.bin", 3 * MiB, seed=70)
        status = notify.receive(proc, "STATUS")
        assert "not yet in the bucket" in status["STATUS"] and "drain lag" in status["STATUS"]
        proc.send_signal(signal.SIGTERM)
        stopping = notify.receive(proc, "STOPPING")
        assert stopping["STOPPING"] == "1"
        assert int(stopping["EXTEND_TIMEOUT_USEC"]) == int((7 + STOP_MARGIN_SECONDS) * 1_000_000)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if in_mount_table(mnt):  # also a dead mount, which os.path.ismount does not see
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        notify.close()
        log.close()
    assert not os.path.ismount(mnt)
    # the stop drained the file: its bytes are in the bucket
    body = s3.client().get_object(Bucket=bucket, Key="svc/step.bin")["Body"].read()
    copy = tmp_path / "copy.bin"
    copy.write_bytes(body)
    assert sha256_file(copy) == digest
    # under the journal, log lines carry syslog priorities instead of timestamps
    lines = log_path.read_text().splitlines()
    assert any(line.startswith("<6>ckptfs: mounted s3://") for line in lines), lines
    assert not any(line[:2] == "20" for line in lines), lines
