"""A checkpoint written into a temporary directory: 3 x 512 MiB into `step_1.tmp/`, then renamed to `step_1/`.

Why a workload of its own: writers that stage a step in a temporary directory (Orbax's
`N.orbax-checkpoint-tmp-T/`, `step_N.tmp/`) rename it minutes after the first files closed; a
drain that started on those files sent their bytes under the temporary name, then again (or
copied them) under the final one, and readers of the bucket saw the temporary keys (issue 24).
Measured through a fresh mount with default settings, the files written one after another (each
fsynced and closed), the directory renamed, then `ckptfs flush`:

* bytes sent to the store (the daemon's `ckptfs_uploaded_bytes_total`) / bytes written;
* keys with the temporary name ever listed: a thread lists the bucket over and over from the first
  write until the flush returned;
* the time from the rename until all is durable, for reading the above.

`python -m bench.temporary_dir` runs it alone (`--work /dev/shm/...`, `--compare CHECKOUT` as for
bench.small_files).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from bench import report
from bench.env import ROOT, BenchServer, guarded
from bench.mounts import CkptfsMount

FILES = 3
SIZE = 512 << 20
TEMPORARY = "step_1.tmp"
FINAL = "step_1"


class BucketWatcher:
    """Lists the bucket until stopped; keeps every key seen with the temporary name."""

    def __init__(self, server: BenchServer, bucket: str) -> None:
        self.client = server.client()
        self.bucket = bucket
        self.temporary: set[str] = set()
        self.listings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                self.temporary.update(o["Key"] for o in page.get("Contents", []) if TEMPORARY in o["Key"])
            self.listings += 1
            time.sleep(0.05)

    def __enter__(self) -> "BucketWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


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
    shutil.rmtree(state, ignore_errors=True)
    server.make_bucket(bucket)
    mount = CkptfsMount(server, bucket, state / "mnt", state, code_root=code_root)
    mount.start()
    try:
        with BucketWatcher(server, bucket) as watcher:
            tmp = mount.path / TEMPORARY
            tmp.mkdir()
            started = time.monotonic()
            for i in range(files):
                write_file(tmp / f"shard_{i}.bin", size)
            written = time.monotonic()
            tmp.rename(mount.path / FINAL)
            renamed = time.monotonic()
            r = mount._cli("flush", str(mount.path), timeout=3600)
            durable = time.monotonic()
            if r.returncode != 0:
                raise RuntimeError(f"ckptfs flush failed: {(r.stderr or r.stdout).strip()[:300]}")
            listings = watcher.listings
        sent = mount.metric("ckptfs_uploaded_bytes_total")
        return {"files": files, "bytes": files * size, "sent_bytes": sent, "write_s": written - started,
                "durable_from_rename_s": durable - renamed, "listings": listings,
                "temporary_keys": sorted(watcher.temporary)[:20], "temporary_keys_seen": len(watcher.temporary)}
    finally:
        mount.stop()
        shutil.rmtree(state, ignore_errors=True)
        server.drop_bucket(bucket)


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
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "tmp",
                   help="scratch directory for the server and the cache (e.g. /dev/shm/x)")
    p.add_argument("--compare", type=Path, default=None, help="another ckptfs checkout, run as ckptfs_base too")
    p.add_argument("--out", type=Path, default=None, help="write the raw results as JSON here")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    work = args.work.absolute() / f"tmpdir-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    server = BenchServer(work / "seaweed")

    def log(msg: str) -> None:
        print(f"bench {time.strftime('%H:%M:%S')} {msg}", flush=True)

    try:
        server.start()
        result = temporary_dir(server, work, f"t{os.getpid()}", log, args.size, args.compare.absolute() if args.compare else None)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"ckptfs": figures(result), **({"ckptfs_base": figures(result, "ckptfs_base")} if args.compare else {})}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
