"""The `ckptfs` command as an operator uses it: version, status, --watch, flush progress, and every error as one line.

Real mounts on a real SeaweedFS server; uploads are slowed by the fault proxy
where a test needs to see an upload half done. Nothing here asserts speed:
throughput and ETA are checked for being reported, not for their values.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import tomllib
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import CKPTFS, ROOT, Mount, fuse_usable, mount_is_dead, run_cli, wait_for, write_random
from tests.support.faultproxy import FaultProxy
from tests.support.seaweed import SeaweedServer, free_port

# The command's output and errors, from the control socket: the FUSE transport changes nothing here, so these tests run under the default one only
pytestmark = pytest.mark.one_transport

MiB = 1 << 20
COMMANDS_ON_A_PATH = ("status", "flush", "warmup", "evict")


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Non-zero exit, exactly one line on stderr (`ckptfs: error: ...`) holding every needle, no traceback."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ckptfs: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---------------------------------------------------------------- version
def test_version_everywhere(make_mount) -> None:  # type: ignore[no-untyped-def]
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout == f"ckptfs {expected}\n", proc.stdout + proc.stderr

    m: Mount = make_mount(start=False)
    m.metrics_port = free_port()
    m.start()
    assert m.status()["version"] == expected
    first = (m.cache_dir / "ckptfs.log").read_text().splitlines()[0]
    assert f"ckptfs {expected} starting" in first, first
    text = urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=10).read().decode()
    assert re.search(r'^ckptfs_mount_info\{[^}]*version="' + re.escape(expected) + '"', text, re.M), text[:2000]


# ----------------------------------------------------------------- status
def test_status_shows_throughput_eta_and_parts_of_a_running_upload(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    proxy.set_mode("pass", rate=4 * MiB)  # slow enough to look at the upload half way
    m: Mount = make_mount(endpoint_url=proxy.url, part_size="5MiB", max_parts_in_flight=2)
    write_random(m.path / "big.bin", 40 * MiB, seed=1)
    st = wait_for("a part of big.bin in the bucket", lambda: (s := m.status())["dirty_bytes_in_bucket"] > 0 and s)
    assert st["dirty_files"] == 1 and st["dirty_bytes"] == 40 * MiB
    assert st["dirty_bytes_in_bucket"] < 40 * MiB
    assert st["upload_bytes_per_second"] > 0  # a part finished within the window
    assert st["drain_eta_seconds"] is not None and st["drain_eta_seconds"] > 0

    proc = m.cli("status", str(m.path))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "1 dirty file (40.0 MiB) not in the bucket" in text, text
    assert re.search(r"^upload   [\d.]+ [KMG]?i?B/s · ETA \S+", text, re.M), text
    assert "\x1b[" not in text  # not a terminal: no colour
    assert len(text.splitlines()) <= 10  # one screen

    proxy.set_mode("pass", rate=0)
    m.flush()
    text = m.cli("status", str(m.path)).stdout
    assert "nothing dirty" in text and "uploaded 40.0 MiB (1 file)" in text, text
    assert "errors   none" in text, text


def test_status_names_the_last_error_with_its_age(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(endpoint_url=proxy.url, retry_auth_backoff=1)
    proxy.fail(403, "AccessDenied", count=1, methods={"PUT"})  # botocore does not retry a 403: ckptfs counts it
    write_random(m.path / "x.bin", 1 * MiB, seed=2)
    m.flush()  # retried after the error
    st = m.status()
    assert st["upload_errors_total"] == 1
    assert st["last_error"] and st["last_error_at"] is not None and st["last_error_age_seconds"] >= 0
    text = m.cli("status", str(m.path)).stdout
    assert "1 upload error" in text and "1 upload errors" not in text, text
    assert re.search(r"^last     \d+[smhd].* ago: access denied", text, re.M), text


def test_status_watch_refreshes_until_ctrl_c(mount: Mount) -> None:
    proc = subprocess.Popen([*CKPTFS, "status", str(mount.path), "--watch", "--interval", "0.2"], cwd=ROOT,
                            env=mount.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        screens = 0
        while screens < 3:  # each refresh starts with the header line
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            screens += line.startswith("ckptfs ")
        proc.send_signal(signal.SIGINT)
        # a hang guard, not a timing: a call already sent to the daemon ends only when it answers, and on a disk
        # saturated by other work (a benchmark's fsyncs) the daemon's journal commits can hold it for tens of seconds
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "interrupted" not in err, err

    # --json --watch: one JSON object per line
    proc = subprocess.Popen([*CKPTFS, "status", str(mount.path), "--watch", "--json", "-n", "0.2"], cwd=ROOT,
                            env=mount.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        samples = [json.loads(proc.stdout.readline()) for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert all("version" in s and "dirty_files" in s for s in samples)


# ------------------------------------------------------------------ flush
def test_flush_progress_moves_within_a_single_file(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    """Before: a single large file showed 0% until it was durable. Now the parts already in the bucket count."""
    proxy.set_mode("pass", rate=6 * MiB)
    m: Mount = make_mount(endpoint_url=proxy.url, part_size="5MiB", max_parts_in_flight=2)
    write_random(m.path / "big.bin", 40 * MiB, seed=3)
    proc = m.cli("flush", str(m.path / "big.bin"), "--timeout", "600")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "durable (" in line]
    assert lines, proc.stdout
    halfway = [line for line in lines if (pct := int(re.search(r"\((\d+)%\)", line).group(1))) and 0 < pct < 100]  # type: ignore[union-attr]
    assert halfway, proc.stdout  # the file was part way when a line was printed
    for line in halfway:
        assert "of 40.0 MiB durable" in line and "1 file left" in line and "/s, ETA " in line, line
    assert proc.stdout.splitlines()[-1] == f"ckptfs: {m.path / 'big.bin'} is durable"
    assert m.object_sha256("big.bin")


# ------------------------------------------------------ errors, as a user
def test_errors_wrong_paths(mount: Mount, tmp_path: Path) -> None:
    elsewhere = tmp_path / "not-a-mount"
    elsewhere.mkdir()
    for cmd in COMMANDS_ON_A_PATH:
        one_line_error(mount.cli(cmd, str(tmp_path / "missing")), "missing: no such file or directory")
        one_line_error(mount.cli(cmd, str(elsewhere)), "is not inside a ckptfs mount")
        one_line_error(mount.cli(cmd, str(mount.path / "missing")), "no such file or directory")
    one_line_error(mount.cli("unmount", str(elsewhere)), str(elsewhere))
    one_line_error(mount.cli("status", str(mount.path), "--interval", "0"), "--interval", "ckptfs status --help")
    one_line_error(mount.cli("flush"), "Missing argument")
    assert mount.status()["dirty_files"] == 0  # the mount is still fine


def test_errors_stopped_daemon(mount: Mount) -> None:
    proc = mount.cli("unmount", str(mount.path))
    assert proc.returncode == 0, proc.stderr
    for cmd in COMMANDS_ON_A_PATH:
        one_line_error(mount.cli(cmd, str(mount.path)), "is not inside a ckptfs mount", "mount it first")
    one_line_error(mount.cli("unmount", str(mount.path)), str(mount.path))


def test_errors_dead_mount(mount: Mount) -> None:
    write_random(mount.path / "kept.bin", 1 * MiB, seed=4)
    pid = mount.status()["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for("the mount to be dead", lambda: mount_is_dead(mount.path))
    for cmd in COMMANDS_ON_A_PATH:
        for path in (mount.path, mount.path / "kept.bin"):
            one_line_error(mount.cli(cmd, str(path)), "is not running (the mount is dead)", f"ckptfs unmount {mount.path}")
    # unmount cleans the dead mount up; mounting again brings the file back
    proc = mount.cli("unmount", str(mount.path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert not mount_is_dead(mount.path) and str(mount.path) not in Path("/proc/self/mounts").read_text()
    mount.start()
    assert (mount.path / "kept.bin").stat().st_size == 1 * MiB


def test_errors_stopped_daemon_does_not_hang_the_cli(mount: Mount) -> None:
    """A stopped daemon answers nothing and the kernel waits for it without a limit: the CLI sees the daemon is
    stopped and gives up (where it used to hang for good) with one line naming the pid and the fix."""
    write_random(mount.path / "kept.bin", 1 * MiB, seed=5)
    mount.flush()
    pid = mount.status()["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        # nothing in this process touches the mount while the daemon is stopped: only the CLI's children do
        one_line_error(mount.cli("status", str(mount.path)), f"(pid {pid}) is stopped", f"kill -CONT {pid}")
        one_line_error(mount.cli("flush", str(mount.path / "kept.bin")), f"kill -CONT {pid}")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert mount.status()["dirty_files"] == 0
    assert (mount.path / "kept.bin").stat().st_size == 1 * MiB


def as_nobody(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the command as user nobody (from /, which nobody may enter, whatever the checkout's permissions)."""
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *CKPTFS, *args],
                          capture_output=True, text=True, env=env, cwd="/", timeout=120)


def nobody_can_run_ckptfs(env: dict[str, str]) -> bool:
    if os.geteuid() != 0 or subprocess.run(["which", "setpriv"], capture_output=True).returncode != 0:
        return False
    return as_nobody("--version", env=env).returncode == 0


def test_errors_other_user(s3: SeaweedServer, bucket: str, tmp_path: Path) -> None:
    if not fuse_usable():
        pytest.skip("/dev/fuse is not usable here")
    # mount points user nobody can reach (pytest's tmp_path is root's only); the cache dirs stay private
    base = Path(tempfile.mkdtemp(prefix="ckptfs-cli-"))
    os.chmod(base, 0o755)
    mounts = []
    try:
        for name, options in (("shared", {"allow_other": "true"}), ("private", {})):
            (base / name).mkdir()
            (tmp_path / f"{name}-cache").mkdir()
            m = Mount(s3, bucket, name, base / name, tmp_path / f"{name}-cache", {"upload_delay": 0.2, **options})
            mounts.append(m)
            m.start()
        shared, private = mounts
        if not nobody_can_run_ckptfs(shared.env):
            pytest.skip("needs root, setpriv, and a python and checkout that user nobody can read")
        write_random(shared.path / "f.bin", 1 * MiB, seed=5)
        for cmd in (*COMMANDS_ON_A_PATH, "unmount"):
            # the shared mount is open to everyone, its control socket (0600) only to its owner
            one_line_error(as_nobody(cmd, str(shared.path), env=shared.env), "permission denied on its control socket",
                           "only root (who mounted it) may use it", "run this command with sudo")
            # a mount without allow_other is closed to other users altogether
            one_line_error(as_nobody(cmd, str(private.path), env=private.env),
                           "open only to the user who mounted it (root)", "allow_other")
        assert as_nobody("status", "--help", env=shared.env).returncode == 0
        # nothing happened to either mount
        assert shared.status()["dirty_files"] <= 1 and private.status()["dirty_files"] == 0
        assert os.path.ismount(shared.path) and os.path.ismount(private.path)
    finally:
        for m in mounts:
            m.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_plurals_in_warmup_and_evict(mount: Mount) -> None:
    write_random(mount.path / "one.bin", 1 * MiB, seed=6)
    mount.flush()
    proc = mount.cli("evict", str(mount.path / "one.bin"))
    assert proc.returncode == 0 and "evicted 1 file (1.0 MiB)" in proc.stdout, proc.stdout + proc.stderr
    proc = mount.cli("warmup", str(mount.path / "one.bin"))
    assert proc.returncode == 0 and "1 file (1.0 MiB) is in the cache" in proc.stdout, proc.stdout + proc.stderr
