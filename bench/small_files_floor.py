#!/usr/bin/env python3
"""Probe: the small-file floor of the kernel transport itself, without ckptfs behind it.

Why: issue 24 asks for 5,000 x 64 KiB create+write+close at >= 0.25 of the same on the local
disk, and `rm -rf` of them at <= 10x. A file costs the daemon several FUSE requests (LOOKUP,
CREATE, a GETXATTR of `security.capability`, RELEASE, a GETATTR of the directory; for rm:
LOOKUP, UNLINK, GETATTR, FORGET), each a round trip through /dev/fuse, a trio task and a reply.
This mounts the tests' `BackingFS` (directories in a dict, file bytes in a backing directory: no
journal, no namespace, no drain) with the kernel transport as ckptfs runs it (passthrough where
granted, one reader on the event loop) and times the same workload as `bench/small_files.py`
against the backing directory itself, so what it prints is what any filesystem written on this
transport could reach at best, in the same run. Not part of the test suite; needs root.

    python bench/small_files_floor.py [--count 5000] [--size 65536] [--dir /dev/shm] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.env import own_cpu_seconds  # noqa: E402
from ckptfs.fuse import kernel  # noqa: E402
from tests.integration.test_kernel_transport import BackingFS  # noqa: E402

# the writer runs in a process of its own, as bench/small_files.py's does (the daemon's event
# loop must not share a GIL with the program it serves)
WRITER = r"""
import json, os, shutil, sys, time
d, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = os.urandom(size)
os.makedirs(d, exist_ok=True)
t = time.perf_counter()
for i in range(count):
    fd = os.open(os.path.join(d, f"f{i:05d}.bin"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
write = time.perf_counter() - t
t = time.perf_counter()
shutil.rmtree(d)
print(json.dumps({"write": write, "rm": time.perf_counter() - t}))
"""


def run_writer(directory: Path, count: int, size: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", WRITER, str(directory), str(count), str(size)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


async def on_mount(base: Path, count: int, size: int, rounds: int) -> tuple[list[dict[str, float]], dict[str, int], bool]:
    backing, mnt = base / "backing", base / "mnt"
    backing.mkdir()
    mnt.mkdir()
    fs = BackingFS(str(backing))
    results = []
    async with kernel.mounted(fs, str(mnt), passthrough=True, probe_dir=str(backing)) as s:
        for i in range(rounds):
            c0 = own_cpu_seconds()
            r = await trio.to_thread.run_sync(run_writer, mnt / f"r{i}", count, size)
            r["daemon_cpu"] = own_cpu_seconds() - c0
            results.append(r)
        counts = {kernel._opname(op): n for op, n in s.counts.most_common()}
        granted = s.passthrough
    return results, counts, granted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--size", type=int, default=64 << 10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm", help="where the backing files and the local comparison go")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (mount(2))")
    base = Path(tempfile.mkdtemp(prefix="ckpt-floor-", dir=args.dir))
    try:
        raw = []
        for i in range(args.rounds):
            raw.append(run_writer(base / f"raw{i}", args.count, args.size))
        mounted, counts, granted = trio.run(on_mount, base, args.count, args.size, args.rounds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    raw_write = statistics.median(r["write"] for r in raw)
    raw_rm = statistics.median(r["rm"] for r in raw)
    m_write = statistics.median(r["write"] for r in mounted)
    m_rm = statistics.median(r["rm"] for r in mounted)
    n = args.count * args.rounds
    print(f"{args.count} x {args.size} B, median of {args.rounds}, load {os.getloadavg()[0]:.1f}, passthrough {'granted' if granted else 'NOT granted'}")
    print(f"create+write+close: local {args.count / raw_write:,.0f} files/s, transport alone {args.count / m_write:,.0f} files/s"
          f" = {raw_write / m_write:.3f} of local")
    print(f"rm -rf:             local {raw_rm * 1000:.0f} ms, transport alone {m_rm * 1000:.0f} ms = {m_rm / raw_rm:.1f}x local")
    per_file = statistics.median(r["daemon_cpu"] for r in mounted) / args.count * 1e6
    print(f"daemon CPU per file (write + rm): {per_file:.0f} us; requests per file: "
          + ", ".join(f"{op} {c / n:.2f}" for op, c in counts.items() if c >= n / 10))


if __name__ == "__main__":
    main()
