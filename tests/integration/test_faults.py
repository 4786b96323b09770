"""Fault injection: nothing acknowledged is ever lost, and every misuse gets one clear line.

The daemon is killed, signalled, or cut off from a real SeaweedFS server by a
fault-injecting proxy (tests/support/faultproxy.py); every test checks the
bucket's bytes against what was written.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import CKPTFS, ROOT, Mount, mount_is_dead, run_cli, sha256_file, wait_for, write_random
from tests.support.faultproxy import FaultProxy
from tests.support.seaweed import SeaweedServer, free_port

MiB = 1 << 20


@pytest.fixture
def proxy(s3: SeaweedServer) -> Iterator[FaultProxy]:
    p = FaultProxy(s3.s3_port)
    try:
        yield p
    finally:
        p.close()


def uploads_under(m: Mount) -> list[str]:
    r = m.s3.client().list_multipart_uploads(Bucket=m.bucket, Prefix=m.key(""))
    return [u["Key"] for u in r.get("Uploads", [])]


# ------------------------------------------------------------ crash and restart
def test_kill9_mid_upload_resumes_from_the_parts_in_the_bucket(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    proxy.set_mode("pass", rate=12 * MiB)  # slow enough to kill it half way
    m: Mount = make_mount(endpoint_url=proxy.url, part_size="5MiB", max_parts_in_flight=2, upload_delay=0.1)
    size = 60 * MiB
    big = write_random(m.path / "big.bin", size, seed=1)  # fsynced
    small = write_random(m.path / "small.bin", 3 * MiB, seed=2, fsync=False)  # only closed
    wait_for("half the upload to reach the bucket", lambda: proxy.bytes_up >= 30 * MiB)
    pid = m.status()["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for("the mount to be dead", lambda: mount_is_dead(m.path))  # once every thread of the daemon is gone
    proxy.set_mode("pass", rate=0)
    proxy.bytes_up = 0
    m.start()  # same cache dir: cleans up the dead mount, replays the journal
    m.flush()
    assert m.object_sha256("big.bin") == big
    assert m.object_sha256("small.bin") == small
    # the parts already in the bucket were reused (ListParts), not sent again
    assert proxy.bytes_up < 0.7 * (size + 3 * MiB), proxy.bytes_up
    assert uploads_under(m) == []
    assert sha256_file(m.path / "big.bin") == big


def test_leaked_multipart_upload_is_aborted(make_mount, s3: SeaweedServer, bucket: str) -> None:  # type: ignore[no-untyped-def]
    client = s3.client()
    upload = client.create_multipart_upload(Bucket=bucket, Key="ckpt/crashed-node.bin")
    client.upload_part(Bucket=bucket, Key="ckpt/crashed-node.bin", UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * (5 * MiB))
    time.sleep(2.1)  # older than abort_stale_uploads_after below (S3 start times have 1 s resolution)
    m: Mount = make_mount(abort_stale_uploads_after=1)
    wait_for("the leaked upload to be aborted", lambda: uploads_under(m) == [])
    digest = write_random(m.path / "after.bin", 1 * MiB, seed=3)
    m.flush()
    assert m.object_sha256("after.bin") == digest


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The contract for every user error: non-zero exit, one line on stderr naming the problem, no traceback."""
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_foreign_and_corrupt_journals_are_refused(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(prefix="ckpt")
    digest = write_random(m.path / "a.bin", 1 * MiB, seed=4)
    m.stop()  # a.bin may still be dirty: it must not be uploaded elsewhere
    other: Mount = make_mount(prefix="other-run", start=False)  # same mount point and cache dir
    assert other.cache_dir == m.cache_dir
    one_line_error(other.cli(*other.mount_args()), "cache dir belongs to s3://", "/ckpt", "use another --cache-dir")
    assert not any(k.startswith("other-run/") for k in m.keys())
    m.start()  # the right source still works, and drains what was left
    m.flush()
    assert m.object_sha256("a.bin") == digest
    m.stop()
    journal = m.cache_dir / "journal.sqlite3"
    for name in os.listdir(m.cache_dir):
        if name.startswith("journal.sqlite3-"):
            os.unlink(m.cache_dir / name)
    with open(journal, "r+b") as f:
        f.seek(100)
        f.write(os.urandom(4000))
    one_line_error(m.cli(*m.mount_args()), "journal", "move it aside")


# ------------------------------------------------------------ object store trouble
def status_of(m: Mount) -> dict[str, Any]:
    return m.status()


def test_endpoint_down_for_60s_writers_never_notice(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(endpoint_url=proxy.url, connect_timeout=1, read_timeout=5, retry_max_backoff=4,
                          part_size="5MiB", multipart_threshold="5MiB")
    digests = {"before.bin": write_random(m.path / "before.bin", 2 * MiB, seed=5)}
    m.flush()
    proxy.set_mode("refuse")
    down_at = time.monotonic()
    for i in range(4):  # writers keep being acknowledged from local disk
        digests[f"during{i}.bin"] = write_random(m.path / f"during{i}.bin", 8 * MiB, seed=10 + i)
    st = wait_for("upload errors to show", lambda: (s := m.status())["upload_errors_total"] >= 3 and s)
    assert st["dirty_files"] == 4 and "reach the object store" in st["last_error"] or "in time" in st["last_error"]
    lag_early = st["oldest_dirty_age_seconds"]
    time.sleep(max(0.0, 60 - (time.monotonic() - down_at)))  # the outage lasts 60 s
    st = m.status()
    assert st["dirty_files"] == 4
    assert st["oldest_dirty_age_seconds"] > lag_early  # the lag grows and is visible
    assert sha256_file(m.path / "during0.bin") == digests["during0.bin"]  # reads never fail meanwhile
    proxy.set_mode("pass")
    m.flush(timeout=300)
    for name, digest in digests.items():
        assert m.object_sha256(name) == digest
    assert m.status()["dirty_files"] == 0


def test_hanging_endpoint_times_out_and_recovers(make_mount, s3: SeaweedServer) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(connect_timeout=1, read_timeout=2, retry_max_backoff=2)
    s3.pause()  # SIGSTOP: connections are accepted by the kernel, nothing answers
    try:
        digest = write_random(m.path / "hang.bin", 4 * MiB, seed=20)
        wait_for("a timed-out request", lambda: m.status()["upload_errors_total"] >= 1)
        assert os.getxattr(m.path / "hang.bin", "user.ckptfs.state") in (b"dirty", b"uploading")
    finally:
        s3.resume()
    m.flush(timeout=300)
    assert m.object_sha256("hang.bin") == digest


def test_blackholed_endpoint_times_out_and_recovers(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(endpoint_url=proxy.url, connect_timeout=1, read_timeout=2, retry_max_backoff=2)
    proxy.set_mode("blackhole")
    digest = write_random(m.path / "bh.bin", 4 * MiB, seed=21)
    wait_for("a timed-out request", lambda: m.status()["upload_errors_total"] >= 1)
    proxy.set_mode("pass")
    m.flush(timeout=300)
    assert m.object_sha256("bh.bin") == digest


@pytest.mark.parametrize("status,code", [(503, "SlowDown"), (500, "InternalError")])
def test_server_errors_are_retried(make_mount, proxy: FaultProxy, status: int, code: str) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(endpoint_url=proxy.url, retry_max_backoff=1, part_size="5MiB", multipart_threshold="5MiB")
    # more failures than botocore's own 3 attempts, so ckptfs's retry loop must carry it
    proxy.fail(status, code, count=8, methods={"PUT", "POST"})
    digest = write_random(m.path / "big.bin", 12 * MiB, seed=30)
    small = write_random(m.path / "small.bin", 100_000, seed=31)
    m.flush(timeout=300)
    assert proxy.failures_left() == 0
    assert m.object_sha256("big.bin") == digest
    assert m.object_sha256("small.bin") == small
    st = m.status()
    assert st["upload_errors_total"] >= 1
    assert uploads_under(m) == []


def test_access_denied_is_reported_loudly_and_retried_slowly(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(endpoint_url=proxy.url, retry_auth_backoff=2)
    proxy.fail(403, "AccessDenied", count=3, methods={"PUT"})
    digest = write_random(m.path / "denied.bin", 1 * MiB, seed=40)
    st = wait_for("the 403 to be reported", lambda: (s := m.status())["last_error"] and s)
    assert "access denied" in st["last_error"]
    m.flush(timeout=300)
    assert m.object_sha256("denied.bin") == digest
    log = (m.cache_dir / "ckptfs.log").read_text()
    assert "ERROR" in log and "access denied" in log


def test_missing_bucket_is_reported_loudly_and_retried_slowly(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    # SeaweedFS re-creates a deleted bucket on the next PutObject, so the proxy answers
    # as a store whose bucket was deleted does
    m: Mount = make_mount(endpoint_url=proxy.url, retry_auth_backoff=2)
    proxy.fail(404, "NoSuchBucket", count=3, methods={"PUT"})
    digest = write_random(m.path / "orphan.bin", 1 * MiB, seed=50)
    st = wait_for("the missing bucket to be reported", lambda: (s := m.status())["last_error"] and s)
    assert "does not exist" in st["last_error"]
    m.flush(timeout=300)
    assert m.object_sha256("orphan.bin") == digest
    assert "does not exist" in (m.cache_dir / "ckptfs.log").read_text()


# ------------------------------------------------------------ stopping
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_a_foreground_daemon_cleanly(make_mount, proxy: FaultProxy, signum: int) -> None:  # type: ignore[no-untyped-def]
    proxy.set_mode("pass", rate=4 * MiB)
    m: Mount = make_mount(endpoint_url=proxy.url, start=False, shutdown_timeout=2, part_size="5MiB", multipart_threshold="5MiB",
                          upload_delay=0.1)
    proc = subprocess.Popen([*CKPTFS, *m.mount_args(daemon=False)], env=m.env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("the mount", lambda: _answers(m.path))
        digest = write_random(m.path / "ckpt.bin", 40 * MiB, seed=60)
        wait_for("the drain to start", lambda: proxy.bytes_up > 1 * MiB)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert not os.path.ismount(m.path)
    assert "Traceback" not in stderr
    assert "the next mount" in stderr  # it says what is left and who finishes it
    proxy.set_mode("pass", rate=0)
    m.start()
    m.flush()
    assert m.object_sha256("ckpt.bin") == digest
    assert uploads_under(m) == []


def _answers(path: Path) -> bool:
    try:
        os.getxattr(path, "user.ckptfs.control")
        return True
    except OSError:
        return False


# ------------------------------------------------------------ clear errors
@pytest.fixture
def plain(make_mount) -> Mount:  # type: ignore[no-untyped-def]
    return make_mount("e", start=False)


def mount_with(m: Mount, *extra: str, env: dict[str, str] | None = None, source: str | None = None,
               mountpoint: Path | None = None, cache_dir: Path | None = None, endpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    args = ["mount", source or f"s3://{m.bucket}/ckpt", str(mountpoint or m.path), "--cache-dir", str(cache_dir or m.cache_dir),
            "--endpoint-url", endpoint or m.s3.endpoint_url, "--daemon", *extra]
    return run_cli(*args, env=env or m.env, timeout=120)


def test_error_unreachable_endpoint(plain: Mount) -> None:
    one_line_error(mount_with(plain, "-o", "connect_timeout=1", endpoint=f"http://127.0.0.1:{free_port()}"),
                   "cannot reach the object store", "endpoint")


def test_error_wrong_credentials(plain: Mount) -> None:
    env = {**plain.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    one_line_error(mount_with(plain, env=env), "rejected the credentials", "AWS_SECRET_ACCESS_KEY")
    assert "not-the-secret" not in mount_with(plain, env=env).stderr  # credentials are never printed


def test_error_missing_bucket(plain: Mount) -> None:
    one_line_error(mount_with(plain, source="s3://no-such-bucket-here/x"), "bucket 'no-such-bucket-here' does not exist")


def test_error_no_permission_on_the_bucket(plain: Mount, proxy: FaultProxy) -> None:
    # SeaweedFS has no per-bucket policies to deny us; the proxy answers as a denying store does
    proxy.fail(403, "AccessDenied", count=10)
    one_line_error(mount_with(plain, endpoint=proxy.url), "access denied to bucket")


def test_error_mount_point_problems(plain: Mount, make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    one_line_error(mount_with(plain, mountpoint=tmp_path / "missing"), "does not exist", "mkdir -p")
    (tmp_path / "file").write_text("x")
    one_line_error(mount_with(plain, mountpoint=tmp_path / "file"), "is not a directory")
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("x")
    one_line_error(mount_with(plain, mountpoint=tmp_path / "full"), "is not empty")
    live: Mount = make_mount("live")
    one_line_error(mount_with(plain, mountpoint=live.path), "is already mounted", "ckptfs unmount")


def test_error_cache_dir_problems(plain: Mount, make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    one_line_error(mount_with(plain, cache_dir=tmp_path / "nocache"), "cache directory", "does not exist")
    (tmp_path / "cachefile").write_text("x")
    one_line_error(mount_with(plain, cache_dir=tmp_path / "cachefile"), "is not a directory")
    live: Mount = make_mount("live")
    one_line_error(mount_with(plain, cache_dir=live.cache_dir), "in use by a running ckptfs", "another --cache-dir")


def test_error_cache_dir_not_writable(plain: Mount, tmp_path: Path) -> None:
    if not _have("setpriv"):
        pytest.skip("setpriv (util-linux) is needed to run as another user")
    # root may write anywhere: run the command as nobody, in directories nobody can reach
    base = Path(tmp_path_factory_dir())
    (base / "mnt").mkdir()
    (base / "cache").mkdir(mode=0o755)
    os.chmod(base / "mnt", 0o777)
    env = {**plain.env, "HOME": str(base)}
    args = [*CKPTFS, "mount", f"s3://{plain.bucket}/ckpt", str(base / "mnt"), "--cache-dir", str(base / "cache"),
            "--endpoint-url", plain.s3.endpoint_url, "--daemon"]
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    one_line_error(proc, "is not writable by this user")


def tmp_path_factory_dir() -> str:
    import tempfile

    d = tempfile.mkdtemp(prefix="ckptfs-nobody-")
    os.chmod(d, 0o755)
    return d


@pytest.mark.parametrize("content,needles", [
    (None, ("does not exist", "--config")),
    ("part_size = [", ("is not valid TOML",)),
    ("partsize = 1", ("unknown option 'partsize'", "docs/configuration.md")),
    ('cache_capacity = "-5GiB"', ("cache_capacity",)),
    ('part_size = "4MiB"', ("below the S3 minimum of 5 MiB",)),
    ('part_size = "5MiB"\nmax_file_size = "100GiB"', ("more than 10,000 parts", "raise part_size")),
    ("upload_delay = -1", ("upload_delay", "negative")),
])
def test_error_config_file(plain: Mount, tmp_path: Path, content: str | None, needles: tuple[str, ...]) -> None:
    cfg = tmp_path / "ckptfs.toml"
    if content is not None:
        cfg.write_text(content + "\n")
    one_line_error(mount_with(plain, "--config", str(cfg)), *needles)


def test_error_fusermount3_missing(plain: Mount, tmp_path: Path) -> None:
    empty = tmp_path / "emptybin"
    empty.mkdir()
    one_line_error(mount_with(plain, env={**plain.env, "PATH": str(empty)}), "fusermount3 is not installed", "apt-get install fuse3")


def test_error_dev_fuse_missing(plain: Mount, tmp_path: Path) -> None:
    if not (_have("unshare") and _have("mount")):
        pytest.skip("unshare/mount (util-linux) are needed to hide /dev/fuse")
    # a private mount namespace whose /dev has everything but fuse
    old = tmp_path / "olddev"
    old.mkdir()
    args = " ".join(f"'{a}'" for a in [*CKPTFS, "mount", f"s3://{plain.bucket}/ckpt", str(plain.path), "--cache-dir",
                                         str(plain.cache_dir), "--endpoint-url", plain.s3.endpoint_url])
    script = (
        f"mount --make-rprivate / && mount --bind /dev {old} && mount -t tmpfs tmpfs /dev && "
        f"for n in null zero random urandom; do touch /dev/$n && mount --bind {old}/$n /dev/$n; done && "
        f"exec {args}"
    )
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=plain.env, cwd=ROOT, timeout=120)
    one_line_error(proc, "/dev/fuse is missing", "modprobe fuse")


def _have(cmd: str) -> bool:
    import shutil

    return shutil.which(cmd) is not None


def test_journal_has_no_credentials(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()
    write_random(m.path / "x.bin", 1000, seed=70)
    m.flush()
    secret = m.s3.env()["AWS_SECRET_ACCESS_KEY"]
    assert secret not in (m.cache_dir / "ckptfs.log").read_text()
    db = sqlite3.connect(m.cache_dir / "journal.sqlite3")
    assert secret not in repr(db.execute("SELECT * FROM meta").fetchall())
