"""Fault injection: nothing acknowledged is ever lost, and every misuse gets one clear line.

The daemon is killed, signalled, or cut off from a real SeaweedFS server by a
fault-injecting proxy (tests/support/faultproxy.py); every test checks the
bucket's bytes against what was written.

A crash, a signal, an unmount with a writer open and a dead mount run under both FUSE
transports; the store's faults, the journal's checks and the errors of `ckptfs mount`
(which these tests run with their own options) under the default one (`one_transport`).
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CKPTFS, ROOT, Mount, mount_answers, mount_is_dead, run_cli, sha256_file, wait_for, write_random
from tests.support.faultproxy import FaultProxy
from tests.support.seaweed import SeaweedServer, free_port

MiB = 1 << 20


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


@pytest.mark.one_transport
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


@pytest.mark.one_transport
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


@pytest.mark.one_transport
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
    assert st["dirty_files"] == 4
    assert "reach the object store" in st["last_error"] or "in time" in st["last_error"], st["last_error"]
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


@pytest.mark.one_transport
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


@pytest.mark.one_transport
def test_blackholed_endpoint_times_out_and_recovers(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(endpoint_url=proxy.url, connect_timeout=1, read_timeout=2, retry_max_backoff=2)
    proxy.set_mode("blackhole")
    digest = write_random(m.path / "bh.bin", 4 * MiB, seed=21)
    wait_for("a timed-out request", lambda: m.status()["upload_errors_total"] >= 1)
    proxy.set_mode("pass")
    m.flush(timeout=300)
    assert m.object_sha256("bh.bin") == digest


@pytest.mark.one_transport
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


@pytest.mark.one_transport
def test_small_files_signed_by_ckptfs_ride_out_the_same_faults(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    """Small PutObjects after the first are signed and sent by ckptfs (store/signed.py), not by boto3:
    server errors, connections the server dropped while idle, a refusal and a store gone silent must end
    the same way, every byte in the bucket."""
    m: Mount = make_mount(endpoint_url=proxy.url, connect_timeout=1, read_timeout=2, retry_max_backoff=1, retry_auth_backoff=1)
    digests = {"first.bin": write_random(m.path / "first.bin", 50_000, seed=60)}
    m.flush(timeout=300)  # the first small PutObject went through boto3: the rest are ckptfs's own
    proxy.fail(503, "SlowDown", count=8, methods={"PUT"})
    digests.update({f"slow{i}.bin": write_random(m.path / f"slow{i}.bin", 30_000 + i, seed=61 + i) for i in range(4)})
    m.flush(timeout=300)
    assert proxy.failures_left() == 0
    proxy.drop_connections()  # the pooled keep-alive connections are dead now
    digests["after-drop.bin"] = write_random(m.path / "after-drop.bin", 70_000, seed=70)
    m.flush(timeout=300)
    proxy.fail(403, "AccessDenied", count=2, methods={"PUT"})
    digests["denied.bin"] = write_random(m.path / "denied.bin", 10_000, seed=71)
    # the SlowDown above is still the last error until the 403 replaces it
    wait_for("the 403 to be reported", lambda: "access denied" in (m.status()["last_error"] or ""))
    m.flush(timeout=300)
    proxy.set_mode("blackhole")
    digests["silent.bin"] = write_random(m.path / "silent.bin", 20_000, seed=72)
    wait_for("a timed-out request", lambda: "in time" in (m.status()["last_error"] or ""))
    proxy.set_mode("pass")
    m.flush(timeout=300)
    for name, digest in digests.items():
        assert m.object_sha256(name) == digest, name
    assert m.status()["upload_errors_total"] >= 8
    assert proxy.put_agents["ckptfs"] >= 8, proxy.put_agents  # the retries went the signed way


@pytest.mark.one_transport
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


@pytest.mark.one_transport
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
        wait_for("the mount", lambda: mount_answers(m.path))
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


# ------------------------------------------------------------ clear errors
@pytest.fixture
def plain(make_mount) -> Mount:  # type: ignore[no-untyped-def]
    return make_mount("e", start=False)


def mount_with(m: Mount, *extra: str, env: dict[str, str] | None = None, source: str | None = None,
               mountpoint: Path | None = None, cache_dir: Path | None = None, endpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    args = ["mount", source or f"s3://{m.bucket}/ckpt", str(mountpoint or m.path), "--cache-dir", str(cache_dir or m.cache_dir),
            "--endpoint-url", endpoint or m.s3.endpoint_url, "--daemon", *extra]
    return run_cli(*args, env=env or m.env, timeout=120)


@pytest.mark.one_transport
def test_error_unreachable_endpoint(plain: Mount) -> None:
    one_line_error(mount_with(plain, "-o", "connect_timeout=1", endpoint=f"http://127.0.0.1:{free_port()}"),
                   "cannot reach the object store", "endpoint")


@pytest.mark.one_transport
def test_error_wrong_credentials(plain: Mount) -> None:
    env = {**plain.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    one_line_error(mount_with(plain, env=env), "rejected the credentials", "AWS_SECRET_ACCESS_KEY")
    assert "not-the-secret" not in mount_with(plain, env=env).stderr  # credentials are never printed


@pytest.mark.one_transport
def test_error_missing_bucket(plain: Mount) -> None:
    one_line_error(mount_with(plain, source="s3://no-such-bucket-here/x"), "bucket 'no-such-bucket-here' does not exist")


@pytest.mark.one_transport
def test_error_no_permission_on_the_bucket(plain: Mount, proxy: FaultProxy) -> None:
    # SeaweedFS has no per-bucket policies to deny us; the proxy answers as a denying store does
    proxy.fail(403, "AccessDenied", count=10)
    one_line_error(mount_with(plain, endpoint=proxy.url), "access denied to bucket")


@pytest.mark.one_transport
def test_error_mount_point_problems(plain: Mount, make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    one_line_error(mount_with(plain, mountpoint=tmp_path / "missing"), "does not exist", "mkdir -p")
    (tmp_path / "file").write_text("x")
    one_line_error(mount_with(plain, mountpoint=tmp_path / "file"), "is not a directory")
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("x")
    one_line_error(mount_with(plain, mountpoint=tmp_path / "full"), "is not empty")
    live: Mount = make_mount("live")
    one_line_error(mount_with(plain, mountpoint=live.path), "is already mounted", "ckptfs unmount")


@pytest.mark.one_transport
def test_error_cache_dir_problems(plain: Mount, make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    one_line_error(mount_with(plain, cache_dir=tmp_path / "nocache"), "cache directory", "does not exist")
    (tmp_path / "cachefile").write_text("x")
    one_line_error(mount_with(plain, cache_dir=tmp_path / "cachefile"), "is not a directory")
    live: Mount = make_mount("live")
    one_line_error(mount_with(plain, cache_dir=live.cache_dir), "in use by a running ckptfs", "another --cache-dir")


@pytest.mark.one_transport
def test_error_cache_dir_not_writable(plain: Mount, tmp_path: Path) -> None:
    if not _have("setpriv"):
        pytest.skip("setpriv (util-linux) is needed to drop the capabilities that let root write anywhere")
    # root may write anywhere: keep the user (so the checkout stays readable, wherever it is) but drop
    # CAP_DAC_OVERRIDE, with a cache directory owned by somebody else
    cache = tmp_path / "theirs"
    cache.mkdir()
    os.chown(cache, 65534, 65534)
    os.chmod(cache, 0o755)
    proc = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all",
                           *CKPTFS, *mount_with_args(plain, cache_dir=cache)],
                          capture_output=True, text=True, env=plain.env, cwd=ROOT, timeout=120)
    one_line_error(proc, "is not writable by this user")


@pytest.mark.one_transport
def test_error_cache_dir_on_a_read_only_file_system(plain: Mount, tmp_path: Path) -> None:
    """As root, access() fails with EROFS too: the message must name the read-only file system, not permissions."""
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        one_line_error(mount_with(plain, cache_dir=ro), "is on a read-only file system")
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def mount_with_args(m: Mount, cache_dir: Path) -> list[str]:
    return ["mount", f"s3://{m.bucket}/ckpt", str(m.path), "--cache-dir", str(cache_dir), "--endpoint-url", m.s3.endpoint_url, "--daemon"]


@pytest.mark.one_transport
@pytest.mark.parametrize("content,needles", [
    (None, ("does not exist", "--config")),
    ("part_size = [", ("is not valid TOML",)),
    ("partsize = 1", ("unknown option 'partsize'", "docs/configuration.md")),
    ('cache_capacity = "-5GiB"', ("cache_capacity",)),
    ('part_size = "4MiB"', ("below the S3 minimum of 5 MiB",)),
    ('part_size = "5MiB"\nmax_file_size = "100GiB"', ("more than 10,000 parts", "raise part_size")),
    ("upload_delay = -1", ("upload_delay", "negative")),
    ("cache_capacity = 1.5", ("cache_capacity = 1.5 is not a whole number of bytes", "1.5GiB")),
    ('cache_min_free = "lots"', ("cache_min_free = 'lots' is not a size",)),
    ("read_timeout = 0", ("read_timeout", "greater than 0")),
    ('source = "s3://b/runs/../llama"', ("'..' component",)),
])
def test_error_config_file(plain: Mount, tmp_path: Path, content: str | None, needles: tuple[str, ...]) -> None:
    cfg = tmp_path / "ckptfs.toml"
    if content is not None:
        cfg.write_text(content + "\n")
    one_line_error(mount_with(plain, "--config", str(cfg)), *needles)


@pytest.mark.one_transport
def test_error_fusermount3_missing(plain: Mount, tmp_path: Path) -> None:
    empty = tmp_path / "emptybin"
    empty.mkdir()
    one_line_error(mount_with(plain, env={**plain.env, "PATH": str(empty)}), "fusermount3 is not installed", "apt-get install fuse3")


@pytest.mark.one_transport
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


@pytest.mark.one_transport
def test_journal_has_no_credentials(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()
    write_random(m.path / "x.bin", 1000, seed=70)
    m.flush()
    secret = m.s3.env()["AWS_SECRET_ACCESS_KEY"]
    assert secret not in (m.cache_dir / "ckptfs.log").read_text()
    db = sqlite3.connect(m.cache_dir / "journal.sqlite3")
    assert secret not in repr(db.execute("SELECT * FROM meta").fetchall())


# ------------------------------------------------------------ bad input
@pytest.mark.one_transport
def test_error_missing_profile(plain: Mount, tmp_path: Path) -> None:
    env = {**plain.env, "HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials")}
    line = one_line_error(mount_with(plain, "-o", "profile=no-such-profile", env=env), "AWS profile 'no-such-profile'", "-o profile=")
    assert "Traceback" not in line


@pytest.mark.one_transport
def test_error_no_credentials_names_the_real_ways(plain: Mount, tmp_path: Path) -> None:
    env = {k: v for k, v in plain.env.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), AWS_CONFIG_FILE=str(tmp_path / "config"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "credentials"),
               AWS_EC2_METADATA_DISABLED="true")
    line = one_line_error(mount_with(plain, env=env), "no AWS credentials found")
    for way in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "-o profile=NAME", "instance role"):
        assert way in line
    assert "--config profile" not in line  # not a thing


@pytest.mark.one_transport
def test_error_source_prefix_with_dot_components(plain: Mount) -> None:
    for source in (f"s3://{plain.bucket}/a/../b", f"s3://{plain.bucket}/a//b", f"s3://{plain.bucket}/./a"):
        one_line_error(mount_with(plain, source=source), "component", "s3://BUCKET/runs/llama")


@pytest.mark.one_transport
@pytest.mark.parametrize("args", [("flush", "--timeout", "-1"), ("flush", "--timeout", "0"), ("unmount", "--flush", "--timeout", "-5")])
def test_error_negative_or_zero_timeouts_are_usage_errors(mount: Mount, args: tuple[str, ...]) -> None:
    proc = mount.cli(args[0], str(mount.path), *args[1:])
    assert proc.returncode == 2, proc.stderr
    one_line_error(proc, "--timeout", "greater than 0")
    assert os.path.ismount(mount.path)


@pytest.mark.one_transport
def test_error_cache_dir_in_a_ckptfs_mount(plain: Mount, make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    live: Mount = make_mount("live")
    inside = live.path / "cache"
    inside.mkdir()
    one_line_error(mount_with(plain, cache_dir=inside), "is inside the ckptfs mount", "local disk")
    assert not (inside / "ckptfs.log").exists()  # not even the log was written there
    same = tmp_path / "same"
    same.mkdir()
    one_line_error(mount_with(plain, mountpoint=same, cache_dir=same), "is the mount point", "outside the mount")


@pytest.mark.one_transport
def test_small_cache_disk_scales_the_reserve_and_the_log_names_the_setting(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if os.geteuid() != 0 or not _have("mount"):
        pytest.skip("needs root to mount a small tmpfs as the cache disk")
    m: Mount = make_mount("small", start=False, write_stall_timeout=3)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(m.cache_dir)], check=True)
    try:
        # the old default reserve (1 GiB) on a 64 MiB disk: every write stalled, then ENOSPC
        m.start()
        digest = write_random(m.path / "fits.bin", 20 * MiB, seed=90)
        m.flush()
        assert m.object_sha256("fits.bin") == digest
        m.stop()
        # a reserve that does hold the writes back: the log says which setting it is
        m.options["cache_min_free"] = "60MiB"
        m.start()
        with pytest.raises(OSError) as e:
            write_random(m.path / "stalls.bin", 8 * MiB, seed=91)
        assert e.value.errno == errno.ENOSPC
        log = (m.cache_dir / "ckptfs.log").read_text()
        assert "gets ENOSPC (nothing left to drain or evict)" in log and "cache_min_free = 60.0 MiB" in log and "lower cache_min_free" in log
    finally:
        m.stop()
        subprocess.run(["umount", "-l", str(m.cache_dir)], check=False)


@pytest.mark.one_transport
def test_metrics_flood_of_idle_connections_leaves_fs_and_endpoint_working(make_mount) -> None:  # type: ignore[no-untyped-def]
    import resource
    import socket
    import urllib.request

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4000 + 200
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    m: Mount = make_mount(start=False)
    m.metrics_port = free_port()
    m.start()
    pid = m.status()["pid"]
    flood: list[socket.socket] = []
    try:
        for _ in range(4000):  # more than the daemon's 1024 file descriptors: EMFILE broke the mount
            s = socket.socket()
            s.connect(("127.0.0.1", m.metrics_port))
            flood.append(s)
        digest = write_random(m.path / "during.bin", 1 * MiB, seed=95)
        assert sha256_file(m.path / "during.bin") == digest
        body = urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=60).read().decode()
        assert "ckptfs_dirty_files" in body
        assert len(os.listdir(f"/proc/{pid}/fd")) < 500
    finally:
        for s in flood:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    m.flush()
    assert m.object_sha256("during.bin") == digest


def test_unmount_refuses_while_files_are_open_for_writing(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(endpoint_url=proxy.url, shutdown_timeout=1, connect_timeout=1, read_timeout=2)
    f = open(m.path / "open.bin", "wb", buffering=0)
    try:
        f.write(b"a" * 1000)
        line = one_line_error(m.cli("unmount", str(m.path)), "1 file is open for writing: open.bin", "--force")
        assert line.startswith("ckptfs: error:")
        assert os.path.ismount(m.path)
        f.write(b"b" * 1000)  # the writer never noticed
        proxy.set_mode("refuse")  # nothing can reach the bucket: it all stays in the journal
        proc = m.cli("unmount", "--force", str(m.path))
        assert proc.returncode == 0, proc.stderr
        assert not os.path.ismount(m.path)
        assert "1 file (2.0 KiB)" in proc.stdout and "stay in the journal" in proc.stdout and str(m.cache_dir) in proc.stdout
    finally:
        try:
            f.close()
        except OSError:
            pass  # the mount is gone under it
    proxy.set_mode("pass")
    m.start()
    m.flush()
    assert m.s3.client().get_object(Bucket=m.bucket, Key=m.key("open.bin"))["Body"].read() == b"a" * 1000 + b"b" * 1000


def test_dead_mount_messages_are_the_same_everywhere(mount: Mount) -> None:
    pid = mount.status()["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for("the mount to be dead", lambda: mount_is_dead(mount.path))
    expected = f"the ckptfs daemon of {mount.path} is not running (the mount is dead)"
    one_line_error(mount.cli("status", str(mount.path)), expected, f"ckptfs unmount {mount.path}")
    one_line_error(mount.cli("flush", str(mount.path)), expected, f"ckptfs unmount {mount.path}")
    proc = mount.cli("unmount", str(mount.path))
    assert proc.returncode == 0 and expected in proc.stdout, proc.stderr
    assert not mount_is_dead(mount.path)


@pytest.mark.one_transport
def test_cache_dir_files_are_the_owners_alone_whatever_the_umask(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(start=False)
    os.chmod(m.cache_dir, 0o755)
    old = os.umask(0)
    try:
        m.start()
    finally:
        os.umask(old)
    write_random(m.path / "x.bin", 1000, seed=96)
    m.flush()
    assert stat.S_IMODE(os.stat(m.cache_dir).st_mode) == 0o700
    for entry in os.scandir(m.cache_dir):
        mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
        if entry.is_dir(follow_symlinks=False):
            assert mode == 0o700, entry.name
        else:
            assert mode == 0o600, f"{entry.name} is {oct(mode)}"
    names = set(os.listdir(m.cache_dir))
    assert {"journal.sqlite3", "journal.reserve", "ckptfs.log", "lock", "control.sock"} <= names


def test_dev_s3_credentials_file_is_the_owners_alone(tmp_path: Path) -> None:
    state = tmp_path / "s3"
    old = os.umask(0)
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "dev_s3.py"), "start", "--dir", str(state)],
                              capture_output=True, text=True, timeout=180)
    finally:
        os.umask(old)
    try:
        assert proc.returncode == 0, proc.stderr
        assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(state / "env").st_mode) == 0o600
        assert "AWS_SECRET_ACCESS_KEY" in (state / "env").read_text()
    finally:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "dev_s3.py"), "stop", "--dir", str(state)], capture_output=True, timeout=120)
