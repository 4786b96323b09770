"""Fixtures: a real SeaweedFS S3 server per test session, a fresh bucket and a real FUSE mount per test."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptfs.config import Config  # noqa: E402
from tests.support.seaweed import SeaweedServer  # noqa: E402

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]


def fuse_usable() -> bool:
    return os.path.exists("/dev/fuse") and os.access("/dev/fuse", os.R_OK | os.W_OK)


@pytest.fixture
def proxy(s3: SeaweedServer) -> Iterator[Any]:
    """A fault-injecting HTTP proxy in front of the test S3 server (tests/support/faultproxy.py)."""
    from tests.support.faultproxy import FaultProxy

    p = FaultProxy(s3.s3_port)
    try:
        yield p
    finally:
        p.close()


def _server(data: Path) -> Iterator[SeaweedServer]:
    server = SeaweedServer(data)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _bucket(server: SeaweedServer, prefix: str) -> Iterator[str]:
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    server.make_bucket(name)
    yield name
    # SeaweedFS gives every bucket volumes of its own, and a server has a limited number:
    # a suite that leaves its buckets behind runs out ("No writable volumes") after ~100 tests
    if not server.paused:
        delete_bucket(server.client(), name)


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    yield from _server(tmp_path_factory.mktemp("seaweed"))


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real etcd on free loopback ports (peer_membership = etcd), one per test session (per xdist worker)."""
    from tests.support.etcd import EtcdServer

    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def second_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A second S3 server on other ports: another region (replication) or a cold store (tier moves)."""
    yield from _server(tmp_path_factory.mktemp("seaweed-second"))


@pytest.fixture
def second_bucket(second_s3: SeaweedServer) -> Iterator[str]:
    yield from _bucket(second_s3, "r")


@pytest.fixture
def bucket(s3: SeaweedServer) -> Iterator[str]:
    yield from _bucket(s3, "t")


def delete_bucket(client: Any, name: str) -> None:
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=name):
            for u in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)
    except Exception as e:  # noqa: BLE001 - best effort: a leftover bucket costs volumes, not correctness
        print(f"could not delete bucket {name}: {e}")


# The CLI's timeouts here only guard against a hang. Inside `make test-vm`'s emulated guest
# (scripts/test_vm.py sets CKPTFS_IN_VM) everything runs ~10-50x slower, a cold CLI start alone
# can take tens of seconds: the guards stretch rather than fail a working run.
HANG_GUARD_SCALE = 10.0 if os.environ.get("CKPTFS_IN_VM") else 1.0


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*CKPTFS, *args], capture_output=True, text=True, env=env, timeout=timeout * HANG_GUARD_SCALE, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"ckptfs {' '.join(args)} failed ({proc.returncode}): {proc.stderr}{proc.stdout}")
    return proc


@dataclass
class Mount:
    """A running ckptfs daemon on a real FUSE mount."""

    s3: SeaweedServer
    bucket: str
    prefix: str
    path: Path
    cache_dir: Path
    options: dict[str, Any] = field(default_factory=dict)
    metrics_port: int | None = None
    endpoint_url: str | None = None  # e.g. a fault-injecting proxy in front of the server

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.s3.env()}

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def mount_args(self, daemon: bool = True) -> list[str]:
        args = [
            "mount", f"s3://{self.bucket}/{self.prefix}".rstrip("/"), str(self.path),
            "--cache-dir", str(self.cache_dir), "--endpoint-url", self.endpoint_url or self.s3.endpoint_url,
        ]
        if daemon:
            args.append("--daemon")
        if self.metrics_port:
            args += ["--metrics-addr", f"127.0.0.1:{self.metrics_port}"]
        for k, v in self.options.items():
            args += ["-o", f"{k}={v}"]
        return args

    def start(self) -> None:
        run_cli(*self.mount_args(), env=self.env, timeout=120, check=True)

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=self.env, timeout=timeout)

    def status(self) -> dict[str, Any]:
        proc = self.cli("status", str(self.path), "--json", timeout=30)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def flush(self, rel: str = "", timeout: float = 300) -> None:
        proc = self.cli("flush", str(self.path / rel), "--timeout", str(timeout), timeout=timeout + 30)
        assert proc.returncode == 0, proc.stderr

    def stop(self) -> None:
        if os.path.ismount(self.path):
            self.cli("unmount", str(self.path), timeout=120)
        # a dead mount (daemon killed) fails os.path.ismount: look in the mount table
        if str(self.path) in open("/proc/self/mounts").read():
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], check=False, capture_output=True)

    # bucket helpers
    def keys(self) -> list[str]:
        out: list[str] = []
        client = self.s3.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)

    def object_sha256(self, rel: str) -> str:
        body = self.s3.client().get_object(Bucket=self.bucket, Key=self.key(rel))["Body"]
        h = hashlib.sha256()
        for chunk in iter(lambda: body.read(8 << 20), b""):
            h.update(chunk)
        return h.hexdigest()

    def head(self, rel: str) -> dict[str, Any]:
        return self.s3.client().head_object(Bucket=self.bucket, Key=self.key(rel))


DEFAULT_LISTING_TIMEOUT = Config.__dataclass_fields__["listing_timeout"].default

# Both FUSE transports (issue 17): every test that mounts (`make_mount`, `mount`, or asks for
# `fuse_transport`) runs once per transport, with ids `[kernel]` and `[libfuse]`, unless it (or its
# module, with `pytestmark`) is marked `one_transport`: tests of store-side logic behind the
# control socket, where the transport changes nothing; they run under the default (`auto`).
# CKPTFS_FUSE_TRANSPORT=kernel|libfuse forces one transport for the whole run (no parameter:
# the daemon takes it from the environment); tests that pass `fuse_transport=` themselves keep it.
TRANSPORTS = ("kernel", "libfuse")


# Parallel workers (pytest-xdist, `make test`: -n 2 --dist loadgroup): each worker is a session of its own, so it
# starts its own SeaweedFS servers (the session fixtures `s3` and `second_s3`, on ports picked free, under the
# worker's own base temp directory), and every test's mounts, cache directories, tmpfs disks, peer, metrics and UI
# ports are its own too. What is one per host is shared: NFS-Ganesha registers its NFS and MOUNT programs with the
# host's one rpcbind (port 111; one registration per program and version; started by whichever test finds none and
# stopped by it), so every test that runs Ganesha carries NFS_GROUP and one worker runs them one after another.
NFS_GROUP = pytest.mark.xdist_group("nfs")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "one_transport: run under the default FUSE transport only, not once per transport")
    # registered by pytest-xdist too; here so a run without it (plain pytest) knows the marker
    config.addinivalue_line("markers", "xdist_group(name): tests that pytest-xdist's --dist loadgroup runs on one worker, in turn")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not {"make_mount", "fuse_transport"} & set(metafunc.fixturenames):
        return
    if os.environ.get("CKPTFS_FUSE_TRANSPORT") or metafunc.definition.get_closest_marker("one_transport"):
        return
    metafunc.parametrize("fuse_transport", TRANSPORTS, indirect=True)


@pytest.fixture
def fuse_transport(request: pytest.FixtureRequest) -> str | None:
    """The FUSE transport this test runs under ("kernel" or "libfuse"), None for the default."""
    name = getattr(request, "param", None)
    if name == "kernel" and os.geteuid() != 0:
        pytest.skip("the kernel transport mounts with mount(2): needs root")
    return name


def peer_cluster(s3: SeaweedServer, bucket: str, tmp_path: Path, **options: Any) -> Iterator[Any]:
    """What a peers test's `cluster` fixture yields from: nodes of one bucket with peer durability
    (tests/support/peer_nodes.py `Cluster`; `options` go to it), stopped afterwards (a paused daemon continued first)."""
    from tests.support.peer_nodes import Cluster

    if not fuse_usable():
        pytest.skip("/dev/fuse is not usable here")
    c = Cluster(s3, bucket, tmp_path, **options)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def make_mount(s3: SeaweedServer, bucket: str, tmp_path: Path, fuse_transport: str | None) -> Iterator[Any]:
    if not fuse_usable():
        pytest.skip("/dev/fuse is not usable here")
    mounts: list[Mount] = []

    def factory(name: str = "m", prefix: str = "ckpt", start: bool = True, endpoint_url: str | None = None, **options: Any) -> Mount:
        path = tmp_path / f"{name}-mnt"
        cache = tmp_path / f"{name}-cache"
        path.mkdir(exist_ok=True)
        cache.mkdir(exist_ok=True)
        # listing_timeout: tests of what another node sees read the bucket right after a flush; on a
        # loaded machine a listing can outlast the default bound, and the (correct) stale answer would
        # fail them. Tests of a slow or hung store pass DEFAULT_LISTING_TIMEOUT themselves.
        opts = {"upload_delay": 0.2, "listing_timeout": 120, **({"fuse_transport": fuse_transport} if fuse_transport else {}), **options}
        m = Mount(s3, bucket, prefix, path, cache, opts, endpoint_url=endpoint_url)
        mounts.append(m)
        if start:
            m.start()
        return m

    try:
        yield factory
    finally:
        for m in mounts:
            m.stop()


@pytest.fixture
def mount(make_mount: Any) -> Mount:
    return make_mount()


def wait_for(what: str, check: Any, timeout: float = 300.0) -> Any:
    """Poll until `check()` is truthy: for background work to reach a state, never to assert speed."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def mount_is_dead(path: Path) -> bool:
    """True once the daemon behind a FUSE mount is gone (every thread of it: the kernel says ENOTCONN)."""
    import errno

    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def mount_answers(path: Path) -> bool:
    """True once the daemon behind the mount answers a request of its own (the control socket's xattr on the root)."""
    try:
        os.getxattr(path, "user.ckptfs.control")
        return True
    except OSError:
        return False


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_random(path: Path, size: int, seed: int = 0, fsync: bool = True, chunk: int = 1 << 20) -> str:
    """Write `size` pseudo-random bytes; return their sha256."""
    import random

    rng = random.Random(seed)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(chunk, left)
            data = rng.randbytes(n)
            f.write(data)
            h.update(data)
            left -= n
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return h.hexdigest()
