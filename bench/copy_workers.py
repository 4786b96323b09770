"""Copy mode alone (`python -m bench.copy_workers`): the kernel transport without passthrough, with
1 copy worker against `fuse_workers` auto (and with --compare another checkout's daemon), cache and
raw disk on tmpfs, configurations alternating round by round on one SeaweedFS server.

Per round and configuration: 1 writer of SIZE, then 4 writers of SIZE/4 each (write + fsync + close,
CHUNK-byte writes, `bench.writer` processes), the daemon's CPU seconds per GiB written, and a read of
the big file through the mount after its pages there were dropped (posix_fadvise DONTNEED on the
mount's file: the bytes stay in the cache file, on tmpfs), each as a ratio to the same on the raw
tmpfs directory measured in the same round. `upload_delay` is an hour: the drain does not run
meanwhile, only the copy path is measured. Prints the medians and ranges of the ratios.

    python -m bench.copy_workers [--size 1G] [--rounds 3] [--work /dev/shm/ckpt-bench] [--compare DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.env import GiB, MiB, BenchServer, cpu_seconds, loadavg, run_writers
from bench.mounts import fresh_mount
from bench.workloads import _drop_pages, _read_through

COPY = {"fuse_transport": "kernel", "fuse_passthrough": "false", "upload_delay": 3600}


def _raw(work: Path, size: int, chunk: int, buf: bytearray) -> dict[str, float]:
    d = work / "raw"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    one = run_writers([d / "single"], size, chunk).ack_seconds
    four = run_writers([d / f"s{i}" for i in range(4)], size // 4, chunk).ack_seconds
    read = min(_read_through(d / "single", buf)[0] for _ in range(2))
    shutil.rmtree(d, ignore_errors=True)
    return {"one": one, "four": four, "read": read}


def _mounted(server: BenchServer, work: Path, bucket: str, size: int, chunk: int, buf: bytearray,
             code_root: Path | None, **options: object) -> dict[str, Any]:
    kw: dict[str, Any] = {"code_root": code_root} if code_root else {}
    with fresh_mount(server, bucket, work / bucket, **kw, **COPY, **options) as m:
        st = m.status()
        pid = m.pid
        assert pid is not None and st.get("fuse_transport") == "kernel" and not st.get("passthrough"), st
        cpu0 = cpu_seconds(pid)
        one = run_writers([m.path / "single"], size, chunk).ack_seconds
        four = run_writers([m.path / f"s{i}" for i in range(4)], size // 4, chunk).ack_seconds
        cpu = cpu_seconds(pid) - cpu0
        reads = []
        for _ in range(2):
            _drop_pages(m.path / "single")
            reads.append(_read_through(m.path / "single", buf)[0])
        return {"one": one, "four": four, "cpu_per_gib": cpu / (2 * size / GiB), "read": min(reads),
                "workers": st.get("fuse_workers")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.copy_workers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1024, help="MiB written by the one writer (the 4 writers: a quarter each)")
    p.add_argument("--chunk-mib", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", default="1,auto", help="fuse_workers values to alternate")
    p.add_argument("--work", type=Path, default=Path("/dev/shm/ckptfs-copy-bench"))
    p.add_argument("--compare", type=Path, default=None, help="another checkout, run as `base` (its own defaults, copy mode)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    size, chunk = args.size * MiB, args.chunk_mib * MiB
    work = args.work / str(os.getpid())
    work.mkdir(parents=True)
    server = BenchServer(work / "seaweed")
    buf = bytearray(MiB)
    configs: list[tuple[str, dict[str, object], Path | None]] = [(f"workers={w}", {"fuse_workers": w}, None) for w in args.workers.split(",")]
    if args.compare:
        configs.append(("base", {}, args.compare.absolute()))
    rows: list[dict[str, Any]] = []
    try:
        server.start()
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]  # who goes first rotates
            raw = _raw(work, size, chunk, buf)
            for name, options, root in order:
                got = _mounted(server, work, f"cw{os.getpid()}r{r}{len(rows)}", size, chunk, buf, root, **options)
                row = {"round": r, "config": name, "load": loadavg()[0], **got,
                       "one_ratio": raw["one"] / got["one"], "four_ratio": raw["four"] / got["four"],
                       "read_ratio": raw["read"] / got["read"], "raw": raw}
                rows.append(row)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "raw"}),
                      file=sys.stderr, flush=True)
            time.sleep(1)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for name, _, _ in configs:
        mine = [x for x in rows if x["config"] == name]
        summary[name] = {k: f"{statistics.median(x[k] for x in mine):.2f} ({min(x[k] for x in mine):.2f}-{max(x[k] for x in mine):.2f})"
                         for k in ("one_ratio", "four_ratio", "cpu_per_gib", "read_ratio")}
        summary[name]["workers"] = mine[0]["workers"]
    out = {"size_mib": args.size, "chunk_mib": args.chunk_mib, "rounds": args.rounds, "summary": summary, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
