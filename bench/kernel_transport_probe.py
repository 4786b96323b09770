#!/usr/bin/env python3
"""Probe: how fast a checkpoint is acknowledged through the kernel transport (issue 17).

Writes SIZE bytes (1 MiB writes) + fsync + close from a separate process, timed from open to
close, into: the raw disk (the backing directory itself), the kernel transport with
passthrough, and the kernel transport in copy mode (direct_io write handles as ckptfs uses;
reading /dev/fuse with trio's wait_readable "poll", and with the copy workers (threads on cloned
descriptors; the test filesystem has no fast path, so they hand every request to the trio thread); and "copy-cached":
write-through the kernel's page cache, no direct_io; and "libfuse": pyfuse3 through the
adapter, direct_io, as ckptfs runs without the kernel transport). Median of
RUNS, `sync; echo 3 > /proc/sys/vm/drop_caches` before each run. Prints GiB/s, the ratio to
the raw disk and the daemon's CPU seconds per GiB. Not part of the test suite; needs root.

    python bench/kernel_transport_probe.py [--size 2G] [--runs 3] [--dir /var/tmp/ckpt-probe]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptfs.fuse import kernel  # noqa: E402
from tests.integration.test_kernel_transport import BackingFS  # noqa: E402

WRITER = r"""
import json, os, sys, time
path, size, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
buf = os.urandom(chunk)
t0 = time.perf_counter()
fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
left = size
while left > 0:
    left -= os.write(fd, buf[:min(chunk, left)])
os.fsync(fd)
os.close(fd)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds of this process: the daemon (the writer is a child)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


async def write_once(path: str, size: int, chunk: int) -> float:
    proc = await trio.run_process([sys.executable, "-c", WRITER, path, str(size), str(chunk)], capture_stdout=True)
    return float(json.loads(proc.stdout)["seconds"])


async def run_mode(mode: str, base: Path, size: int, runs: int, chunk: int) -> dict[str, Any]:
    backing = base / f"backing-{mode}"
    mnt = base / f"mnt-{mode}"
    backing.mkdir()
    mnt.mkdir()
    times: list[float] = []
    cpu: list[tuple[float, float]] = []
    granted = None
    try:
        if mode == "raw":
            for i in range(runs):
                await trio.to_thread.run_sync(drop_caches)
                times.append(await write_once(str(backing / f"f{i}"), size, chunk))
                os.unlink(backing / f"f{i}")
            return {"mode": mode, "times": times, "cpu": None, "passthrough": None}
        fs = BackingFS(str(backing), direct_io=mode != "copy-cached")

        async def runs_on_mount() -> None:
            for i in range(runs):
                await trio.to_thread.run_sync(drop_caches)
                c0 = cpu_seconds()
                times.append(await write_once(str(mnt / f"f{i}"), size, chunk))
                c1 = cpu_seconds()
                cpu.append((c1[0] - c0[0], c1[1] - c0[1]))
                await trio.to_thread.run_sync(os.unlink, str(mnt / f"f{i}"))

        if mode == "libfuse":
            from ckptfs.fuse import libfuse

            async with libfuse.mounted(fs, str(mnt), ["fsname=ckptfs-probe"]):
                await runs_on_mount()
            return {"mode": mode, "times": times, "cpu": cpu, "passthrough": False, "write_requests": fs.calls["write"]}
        kw: dict[str, Any] = {"passthrough": mode == "passthrough", "probe_dir": str(backing)}
        kw["reader"] = "workers" if mode == "copy-workers" else "poll"
        if mode == "copy-workers":
            kw["workers"] = 2
        async with kernel.mounted(fs, str(mnt), **kw) as s:
            granted = s.passthrough
            await runs_on_mount()
            writes = s.counts[16]
        return {"mode": mode, "times": times, "cpu": cpu, "passthrough": granted, "write_requests": writes}
    finally:
        shutil.rmtree(backing, ignore_errors=True)
        shutil.rmtree(mnt, ignore_errors=True)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--chunk", default="1M")
    ap.add_argument("--dir", default=None, help="where the backing files go (default: a temp dir under /var/tmp)")
    ap.add_argument("--modes", default="raw,passthrough,copy-poll,copy-workers,copy-cached,libfuse")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (mount(2), passthrough ioctls, drop_caches)")
    size, chunk = parse_size(args.size), parse_size(args.chunk)
    base = Path(tempfile.mkdtemp(prefix="ckpt-probe-", dir=args.dir or "/var/tmp"))
    results = []
    try:
        for mode in args.modes.split(","):
            results.append(await run_mode(mode, base, size, args.runs, chunk))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    gib = size / (1 << 30)
    raw = next((r for r in results if r["mode"] == "raw"), None)
    raw_med = statistics.median(raw["times"]) if raw else None
    if args.json:
        print(json.dumps({"size": size, "chunk": chunk, "results": results}, indent=2))
        return
    print(f"write {args.size} in {args.chunk} writes + fsync + close, median of {args.runs}, caches dropped before each run")
    print(f"{'mode':<14}{'median s':>10}{'GiB/s':>8}{'vs raw':>8}{'daemon CPU s/GiB user+sys':>27}  runs (s)")
    for r in results:
        med = statistics.median(r["times"])
        ratio = f"{raw_med / med:.2f}" if raw_med else "-"
        cpu = "-"
        if r["cpu"]:
            user = statistics.median(c[0] for c in r["cpu"]) / gib
            sys_ = statistics.median(c[1] for c in r["cpu"]) / gib
            cpu = f"{user:.3f}+{sys_:.3f}"
        note = ""
        if r["mode"] == "passthrough" and not r["passthrough"]:
            note = "  (passthrough NOT granted: copy mode)"
        if "write_requests" in r:
            note += f"  WRITE requests seen: {r['write_requests']}"
        runs = " ".join(f"{t:.2f}" for t in r["times"])
        print(f"{r['mode']:<14}{med:>10.2f}{gib / med:>8.2f}{ratio:>8}{cpu:>27}  {runs}{note}")


if __name__ == "__main__":
    trio.run(main)
