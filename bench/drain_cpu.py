"""The drain's own CPU per GiB: one big file uploaded from the cache, with and without its bytes signed.

Why a workload of its own: the main run's `cpu_drained` mixes the drain with acknowledging (its 8-writer phase
drains while it writes) and with the disk. Here a file is written and fsynced through a mount that holds
uploads back (`upload_delay` an hour), then `ckptfs flush` drains it alone; the daemon's CPU seconds over the
flush, per GiB, are what a node pays to drain (reading the cache, the xxh3 and CRC32 pass, signing, sending).
Two configurations alternate round by round on one server:

* `signed`: the default over plain http, each part's SHA-256 in its signature (`sign_payload_over_http`);
* `unsigned`: `sign_payload_over_http = false`, UNSIGNED-PAYLOAD and the signed CRC32 alone.

Over https neither hashes the bytes for the signature, so `unsigned` is also what an https store costs, less TLS.
Put `--work` on tmpfs (/dev/shm) so the disk is not what is measured; the server's ingest (~100-150 MiB/s on
these cores) bounds the time, not the CPU per GiB.

    python -m bench.drain_cpu [--size 1G] [--rounds 3] [--work /dev/shm/x] [--compare CHECKOUT]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from bench import report
from bench.env import GiB, MiB, ROOT, BenchServer, alone_arguments, cpu_seconds, guarded, log, run_alone
from bench.mounts import fresh_mount

SIZE = GiB
ROUNDS = 3
CONFIGS: dict[str, dict[str, object]] = {"signed": {}, "unsigned": {"sign_payload_over_http": "false"}}


def drain_once(server: BenchServer, bucket: str, state: Path, size: int, code_root: Path, options: dict[str, object]) -> dict[str, Any]:
    with fresh_mount(server, bucket, state, code_root, upload_delay=3600, **options) as mount:
        chunk = os.urandom(64 * MiB)
        with open(mount.path / "big.bin", "wb") as f:
            left = size
            while left:
                left -= f.write(chunk[:min(len(chunk), left)])
            f.flush()
            os.fsync(f.fileno())
        assert mount.pid is not None
        cpu0, t = cpu_seconds(mount.pid), time.monotonic()
        mount.flush()
        elapsed, cpu = time.monotonic() - t, cpu_seconds(mount.pid) - cpu0
    return {"drain_s": elapsed, "cpu_s": cpu, "cpu_per_gib": cpu / (size / GiB), "mib_per_s": size / MiB / elapsed}


def drain_cpu(server: BenchServer, work: Path, tag: str, log: Callable[[str], None], size: int = SIZE, rounds: int = ROUNDS,
              compare_root: Path | None = None) -> dict[str, Any]:
    """Each configuration `rounds` times, alternating (and with `compare_root`, that checkout's default too)."""
    targets = [(name, ROOT, opts) for name, opts in CONFIGS.items()]
    if compare_root is not None:
        targets.append(("base", compare_root, {}))
    out: dict[str, Any] = {"size": size, "rounds": {name: [] for name, _, _ in targets}}
    for r in range(rounds):
        for name, root, opts in targets:
            log(f"drain CPU: {name}, round {r + 1} of {rounds}, {size >> 20} MiB")
            out["rounds"][name].append(guarded(lambda: drain_once(server, f"bench-{tag}-drain-{name}-{r}", work / "dc", size, root, opts)))
    return out


def figures(result: dict[str, Any], name: str = "ckptfs") -> dict[str, Any]:
    return {f["id"]: f["median"] if f["median"] is not None else f.get("why_missing")
            for f in report.summarise([{"drain_cpu": result}], {}, report.DRAIN_CPU_FIGURES)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.drain_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=SIZE, help="bytes of the file drained")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    alone_arguments(p, "scratch directory for the server and the cache (e.g. /dev/shm/x)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    return run_alone(args, "drain", lambda server, work, tag, compare: drain_cpu(server, work, tag, log, args.size, args.rounds, compare),
                     figures)


if __name__ == "__main__":
    sys.exit(main())
