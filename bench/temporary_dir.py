"""A checkpoint written into a temporary directory: 3 x 512 MiB into `step_1.tmp/`, then renamed to `step_1/`.

Why a workload of its own: writers that stage a step in a temporary directory (Orbax's
`N.orbax-checkpoint-tmp-T/`, `step_N.tmp/`) rename it minutes after the first files closed; a
drain that started on those files sent their bytes under the temporary name, then again (or
copied them) under the final one, and readers of the bucket saw the temporary keys (issue 24).
Measured through a fresh mount with default settings, the files written one after another (each
fsynced and closed; `PAUSE` seconds apart, as a trainer serialising its next state takes longer than
`upload_delay`), the directory renamed, then `ckptfs flush`:

* bytes sent to the store (the daemon's `ckptfs_uploaded_bytes_total`) / bytes written;
* keys with the temporary name ever listed: a thread lists the bucket over and over from the first
  write until the flush returned;
* the time from the rename until all is durable, for reading the above.

`python -m bench.temporary_dir` runs it alone (`--work /dev/shm/...`, `--compare CHECKOUT` as for
bench.small_files).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from bench import report
from bench.env import ROOT, BenchServer, alone_arguments, guarded, log, run_alone
from bench.mounts import fresh_mount
from tests.support.watch import BucketWatcher

FILES = 3
SIZE = 512 << 20
TEMPORARY = "step_1.tmp"
FINAL = "step_1"
PAUSE = 2.0  # seconds between two files, as a trainer serialising the next state: longer than upload_delay (0.5 s)


def write_file(path: Path, size: int, chunk: int = 8 << 20) -> None:
    data = os.urandom(chunk)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(chunk, left)
            f.write(data[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())


def through_mount(server: BenchServer, bucket: str, state: Path, files: int, size: int, code_root: Path = ROOT) -> dict[str, Any]:
    with fresh_mount(server, bucket, state, code_root) as mount, BucketWatcher(server.client(), bucket) as watcher:
        tmp = mount.path / TEMPORARY
        tmp.mkdir()
        started = time.monotonic()
        for i in range(files):
            if i:
                time.sleep(PAUSE)
            write_file(tmp / f"shard_{i}.bin", size)
        written = time.monotonic()
        tmp.rename(mount.path / FINAL)
        renamed = time.monotonic()
        durable = mount.flush()
        listings = watcher.listings
        sent = mount.metric("ckptfs_uploaded_bytes_total")
    temporary = sorted(k for k in watcher.seen if TEMPORARY in k)
    return {"files": files, "bytes": files * size, "sent_bytes": sent, "write_s": written - started,
            "durable_from_rename_s": durable - renamed, "listings": listings,
            "temporary_keys": temporary[:20], "temporary_keys_seen": len(temporary)}


def temporary_dir(server: BenchServer, work: Path, tag: str, log: Callable[[str], None], size: int = SIZE,
                  compare_root: Path | None = None) -> dict[str, Any]:
    """The checkpoint through this checkout's daemon (and with `compare_root`, that checkout's too)."""
    out: dict[str, Any] = {"files": FILES, "size": size}
    targets = [("ckptfs", ROOT)] + ([("ckptfs_base", compare_root)] if compare_root is not None else [])
    for name, root in targets:
        log(f"temporary directory: {name}, {FILES} x {size >> 20} MiB into {TEMPORARY}/, renamed, flushed")
        out[name] = guarded(lambda: through_mount(server, f"bench-{tag}-tmpdir-{name.replace('_', '-')}", work / "td", FILES, size, root))
    return out


def figures(result: dict[str, Any], name: str = "ckptfs") -> dict[str, Any]:
    run = {"temporary_dir": {**result, "ckptfs": result.get(name)}}
    return {f["id"]: f["median"] if f["median"] is not None else f.get("why_missing")
            for f in report.summarise([run], {}, report.TEMPORARY_DIR_FIGURES)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.temporary_dir", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=SIZE, help="bytes per file")
    alone_arguments(p, "scratch directory for the server and the cache (e.g. /dev/shm/x)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    return run_alone(args, "tmpdir", lambda server, work, tag, compare: temporary_dir(server, work, tag, log, args.size, compare),
                     figures)


if __name__ == "__main__":
    sys.exit(main())
