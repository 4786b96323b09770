"""What one NFS gateway serves: write throughput through NFS-Ganesha into a ckptfs mount, against the same
Ganesha exporting a plain directory on the same file system, with one client and with four at once.

Why this comparison: in gateway mode every byte a training node writes crosses Ganesha, then
ckptfs; what ckptfs adds is what a plain export of the same disk would not cost. Both exports run
deploy/nfs/ganesha.conf as shipped (tests/support/ganesha.py: only the export path, the ports and
the recovery directory differ), both are written by the same userspace client, libnfs's `nfs-cp`
(Debian libnfs-utils; NFSv3, as libnfs 4 speaks no NFSv4; this kernel has no NFS client), each
client one `nfs-cp` process copying its own file from tmpfs. The ckptfs cache and the plain
directory are both on tmpfs (/dev/shm), so the disk's noise does not decide the ratio.

What is measured, and what is not: the window runs from the clients' common start until the
last `nfs-cp` has exited (every WRITE answered). The mount holds its uploads back meanwhile
(`upload_delay=3600`), so the S3 server's ingest is not in the window: the ratio is what the
gateway acknowledges, not what it drains. The drain is measured after the window, on its own
(Ganesha stopped, which closes its files, then `ckptfs flush`), and reported apart. The CPU
seconds per GiB are those of the ckptfs daemon and of Ganesha (its process tree: the kernel's
FUSE work done in Ganesha's threads counts as Ganesha's system time) over the window; the load
average before and after each part is kept, because the machine is shared.

`python -m bench.nfs_gateway [--quick]` runs it alone; `make bench` runs it as the `nfs` target.
`--compare CHECKOUT` exports a third mount, another checkout's daemon (`ckptfs_base`), through the same
harness in the same run, the three exports' order rotating from run to run: a before/after of a change
in one sitting, where the load of this shared machine moves more between sittings than the change does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from bench import report
from bench.env import GiB, MiB, ROOT, BenchServer, disk_free, guarded, log, loadavg, tree_cpu_seconds
from bench.mounts import fresh_mount
from tests.support.ganesha import GaneshaServer, missing_tools

SIZE = 1 * GiB  # bytes each client writes at the default size
QUICK_SIZE = 128 * MiB
CLIENTS = (1, 4)
HELD_BACK = {"upload_delay": 3600, "allow_other": "true"}  # nothing uploads inside the window; Ganesha (root) may enter
TMPFS = Path("/dev/shm")


def scratch_root(work: Path) -> tuple[Path, bool]:
    """Where the caches and the plain directory go: tmpfs if there is one, else `work` (said in the result)."""
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK):
        return TMPFS / f"ckptfs-bench-nfs-{os.getpid()}", True
    return work / "nfs", False


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def touch_memory(path: Path, nbytes: int) -> None:
    """Write and delete `nbytes` on the tmpfs before measuring. Why: the first export to write into memory
    the guest never touched paid for the hypervisor backing it (Ganesha over the plain directory, first in
    its run, measured 2.3-2.9 s of CPU per GiB instead of 0.67, at a third of the throughput); freed pages
    are what both exports then write into."""
    block = bytes(64 * MiB)
    with open(path, "wb") as f:
        for off in range(0, nbytes, len(block)):
            f.write(block[: min(len(block), nbytes - off)])
    path.unlink()


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def write_clients(ganesha: GaneshaServer, source: Path, directory: str, clients: int) -> dict[str, Any]:
    """`clients` nfs-cp processes started together, each copying `source` to DIRECTORY/client_I.bin."""
    cpu0 = _children_cpu()
    started = time.monotonic()
    procs = [subprocess.Popen(["nfs-cp", str(source), ganesha.url(f"{directory}/client_{i}.bin")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i in range(clients)]
    errors = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=3600)
            if p.returncode != 0:
                errors.append(f"nfs-cp exited with {p.returncode}: {err.decode(errors='replace').strip()[:300]}")
    finally:
        for p in procs:  # a client that hung (or the run interrupted) does not outlive the workload
            if p.poll() is None:
                p.kill()
                p.wait()
    elapsed = time.monotonic() - started
    if errors:
        raise RuntimeError(errors[0])
    return {"write_s": elapsed, "cpu_clients_s": _children_cpu() - cpu0}


def through_export(export: Path, workdir: Path, source: Path, size: int, daemon_pid: Callable[[], int | None]) -> dict[str, Any]:
    """Ganesha over `export`: one client, then four, each in its own directory, with the CPU of the
    gateway's processes over each window. Ganesha is stopped afterwards (its open files closed)."""
    workdir.mkdir(parents=True)
    ganesha = GaneshaServer(workdir, export)
    out: dict[str, Any] = {}
    ganesha.start()
    try:
        assert ganesha.proc is not None
        for clients in CLIENTS:
            (export / f"c{clients}").mkdir()
            load0 = loadavg()
            pid = daemon_pid()
            g0, d0 = tree_cpu_seconds(ganesha.proc.pid), tree_cpu_seconds(pid) if pid else None
            w = write_clients(ganesha, source, f"c{clients}", clients)
            g1, d1 = tree_cpu_seconds(ganesha.proc.pid), tree_cpu_seconds(pid) if pid else None
            sizes = [(export / f"c{clients}" / f"client_{i}.bin").stat().st_size for i in range(clients)]
            if sizes != [size] * clients:
                raise RuntimeError(f"after nfs-cp the files in {export / f'c{clients}'} have sizes {sizes}, not {size} each")
            out[f"clients_{clients}"] = {**w, "bytes": size * clients, "cpu_ganesha_s": g1 - g0,
                                         **({"cpu_daemon_s": d1 - d0} if d0 is not None and d1 is not None else {}),
                                         "loadavg_before": load0, "loadavg_after": loadavg()}
    finally:
        ganesha.stop()
    return out


def plain_directory(root: Path, source: Path, size: int) -> dict[str, Any]:
    plain = root / "plain"
    plain.mkdir(parents=True)
    try:
        return through_export(plain, root / "ganesha-plain", source, size, lambda: None)
    finally:
        shutil.rmtree(plain, ignore_errors=True)
        shutil.rmtree(root / "ganesha-plain", ignore_errors=True)


def through_ckptfs(server: BenchServer, bucket: str, root: Path, source: Path, size: int, digest: str,
                   code_root: Path = ROOT) -> dict[str, Any]:
    with fresh_mount(server, bucket, root / "ck", code_root=code_root, **HELD_BACK) as mount:
        before = mount.fuse_requests()
        out = through_export(mount.path, root / "ganesha-ckptfs", source, size, lambda: mount.pid)
        # what reached the daemon: under passthrough no WRITE, but a GETATTR and a GETXATTR per NFS WRITE
        out["fuse_requests"] = {op: n - before.get(op, 0.0) for op, n in mount.fuse_requests().items() if n - before.get(op, 0.0)}
        # the bytes on the mount are the source's (one file checked; every file's size was)
        if sha256(mount.path / f"c{CLIENTS[-1]}" / f"client_{CLIENTS[-1] - 1}.bin") != digest:
            raise RuntimeError("a file written through NFS into ckptfs differs from its source")
        out["transport"] = mount.transport()
        # after the window: the drain, on its own (Ganesha stopped, so every file is closed)
        written = sum(size * n for n in CLIENTS)
        started = time.monotonic()
        durable = mount.flush()
        sent = mount.metric("ckptfs_uploaded_bytes_total")
        if sent is None or sent < written:
            raise RuntimeError(f"ckptfs flush returned with {sent} of {written} bytes uploaded")
        out["drain"] = {"bytes": written, "flush_s": durable - started, "uploaded_bytes": sent}
    shutil.rmtree(root / "ganesha-ckptfs", ignore_errors=True)
    return out


def nfs_gateway(server: BenchServer, work: Path, tag: str, log: Callable[[str], None], size: int = SIZE,
                index: int = 1, compare_root: Path | None = None) -> dict[str, Any]:
    """Both exports, one client then four each; which export goes first alternates with `index`. With
    `compare_root`, a third: that checkout's daemon (`ckptfs_base`), the order rotating instead."""
    missing = missing_tools()
    if missing:
        return {"skipped": f"NFS gateway tools missing: {', '.join(missing)} (Debian: nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils)"}
    root, on_tmpfs = scratch_root(work)
    need = size * (1 + sum(CLIENTS)) + GiB  # the source, then every client's file (the plain export's are gone by then)
    if disk_free(root.parent) < need:
        return {"skipped": f"{root.parent} has {disk_free(root.parent) / GiB:.1f} GiB free, the NFS workload needs about "
                           f"{need / GiB:.1f} GiB there: free some or use a smaller size"}
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    out: dict[str, Any] = {"size": size, "clients": list(CLIENTS), "tmpfs": on_tmpfs, "client": "nfs-cp (libnfs, NFSv3)",
                           "cores": len(os.sched_getaffinity(0))}
    try:
        source = root / "source.bin"
        with open(source, "wb") as f:
            block = os.urandom(4 * MiB)
            for off in range(0, size, len(block)):
                f.write(block[: min(len(block), size - off)])
        digest = sha256(source)
        touch_memory(root / "warm.bin", size * sum(CLIENTS))
        parts = [("plain", lambda: plain_directory(root, source, size)),
                 ("ckptfs", lambda: through_ckptfs(server, f"bench-{tag}-nfs", root, source, size, digest))]
        if compare_root is not None:
            parts.append(("ckptfs_base", lambda: through_ckptfs(server, f"bench-{tag}-nfsbase", root, source, size, digest,
                                                                code_root=compare_root)))
            turn = (index - 1) % len(parts)
            order = parts[turn:] + parts[:turn]
        else:
            order = parts if index % 2 else parts[::-1]
        for name, part in order:
            log(f"NFS gateway: Ganesha over {'a plain directory' if name == 'plain' else name}, "
                f"{' then '.join(str(c) for c in CLIENTS)} nfs-cp clients of {size >> 20} MiB each")
            out[name] = guarded(part)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def figures(result: dict[str, Any]) -> dict[str, Any]:
    run = {"nfs_gateway": result}
    return {f["id"]: f["median"] if f["median"] is not None else f.get("why_missing")
            for f in report.summarise([run], {}, report.NFS_FIGURES)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.nfs_gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=SIZE // MiB, help=f"MiB each client writes (default {SIZE // MiB})")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_SIZE // MiB} MiB per client, 1 run")
    p.add_argument("--runs", type=int, default=1, help="repetitions, the two exports' order alternating (default 1)")
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "tmp",
                   help="scratch directory for the S3 server (the caches and the plain directory go to /dev/shm)")
    p.add_argument("--out", type=Path, default=None, help="write the raw results as JSON here")
    p.add_argument("--compare", type=Path, default=None,
                   help="another ckptfs checkout: export its daemon too (ckptfs_base), for a before/after in one run")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    size = QUICK_SIZE if args.quick else args.size_mib * MiB
    if size < MiB or args.runs < 1:
        p.error("--size-mib and --runs must be at least 1")
    work = args.work.absolute() / f"nfs-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    server = BenchServer(work / "seaweed")
    runs = []
    try:
        server.start()
        for i in range(args.runs):
            runs.append(nfs_gateway(server, work, f"n{i + 1}-{os.getpid()}", log, size, i + 1,
                                    args.compare.absolute() if args.compare else None))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1) + "\n")
    summary = report.summarise([{"nfs_gateway": r} for r in runs], {}, report.NFS_FIGURES)
    print(json.dumps({f["id"]: f["median"] if f["median"] is not None else f.get("why_missing") for f in summary}, indent=1))
    if args.compare:  # the same figures with the other checkout's daemon in ckptfs's place
        base = report.summarise([{"nfs_gateway": {**r, "ckptfs": r.get("ckptfs_base")}} for r in runs], {}, report.NFS_FIGURES)
        print(json.dumps({f"{f['id']} (base)": f["median"] if f["median"] is not None else f.get("why_missing") for f in base}, indent=1))
    parts = ("plain", "ckptfs", "ckptfs_base") if args.compare else ("plain", "ckptfs")
    return 0 if all("error" not in (r.get(k) or {}) for r in runs for k in parts) else 1


if __name__ == "__main__":
    sys.exit(main())
