"""Figures from the runs: ratios against the limit measured in the same run, median / min / max.

A figure is computed per run (so a slow moment of the shared machine hits the
figure and its limit alike), then summarised over the runs. `holds` judges
the median against the issue's target; min and max show the spread.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MiB = 1 << 20


def _get(run: dict[str, Any], *path: str) -> Any:
    cur: Any = run
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return cur


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _faster(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


@dataclass
class Figure:
    id: str
    label: str
    unit: str  # "x" for a ratio (higher is better unless op is "<=")
    op: str  # ">=", "<=" or "" (information only)
    target: float | None
    compute: Callable[[dict[str, Any], dict[str, Any]], float | None]
    chart: bool = False  # drawn in the PNG (ratios where higher is better)
    parts: tuple[str, ...] = ()  # the parts of a run it reads, to say why it is missing ("a.b": run["a"]["b"])
    # why a run's numbers are not what the label says (say, no passthrough was granted); None if they are
    check: Callable[[dict[str, Any]], str | None] | None = None

    def __post_init__(self) -> None:
        if not self.parts:
            known = ("raw", "s5cmd", "boto3", "rclone", "s3fs", "cold_read")
            self.parts = tuple(p for p in known if p in self.id) + ("ckptfs",)
            if self.id.startswith("ack"):
                self.parts = ("raw", "ckptfs")
            elif self.id.startswith("drain"):
                self.parts = ("s5cmd", "boto3", "ckptfs")
            elif self.id.startswith("cold") or "download" in self.id:
                self.parts = ("ckptfs", "cold_read")


def _ack(workload: str, limit: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    return lambda run, meta: _ratio(_get(run, limit, workload, "ack_s"), _get(run, "ckptfs", workload, "ack_s"))


def _drain(workload: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    return lambda run, meta: _ratio(
        _faster(_get(run, "s5cmd", workload, "upload_s"), _get(run, "boto3", workload, "upload_s")),
        _get(run, "ckptfs", workload, "durable_from_close_s"),
    )


def _peer(peer: str, workload: str, field: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    return lambda run, meta: _ratio(_get(run, peer, workload, field), _get(run, "ckptfs", workload, field))


def _mibps(size_key: str, *path: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    def f(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
        t = _get(run, *path)
        return meta["sizes"][size_key] / MiB / t if t else None

    return f


def _rename_ms(target: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    return lambda run, meta: (lambda s: s * 1000 if s is not None else None)(_get(run, target, "single", "rename_s"))


def _store_bytes_ratio(target: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    return lambda run, meta: _ratio(_get(run, target, "single", "received_bytes"), meta["sizes"]["single"])


def _cold(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
    return _ratio(_get(run, "cold_read", "direct_s"), _get(run, "cold_read", "mount", "read_s"))


# ------------------------------------------------------- ckptfs per FUSE transport
# "ckptfs" is the mount as a user gets it by default (as root on Linux >= 6.9: the kernel transport
# with passthrough); "ckptfs_copy" the kernel transport with fuse_passthrough = false; "ckptfs_libfuse"
# pyfuse3. Each run records the transport the daemon reported and the FUSE requests that reached it.
TRANSPORT_PARTS = {"passthrough": "ckptfs", "copy": "ckptfs_copy", "libfuse": "ckptfs_libfuse"}
# the pyfuse3 transport's figures before the kernel transport (median of the recorded run of ckptfs ecdab6f)
LIBFUSE_BEFORE = {"single": 0.56, "sharded": 0.57}


def _transport_problem(run: dict[str, Any], mode: str, reads: str | None = None) -> str | None:
    """Why run[part] did not measure `mode` (passthrough, copy, libfuse); None if it did.

    Passthrough: kernel transport, granted at INIT, and no WRITE reached the daemon while
    acknowledging (nor a READ during the cached read, with `reads`)."""
    part = TRANSPORT_PARTS[mode]
    t = _get(run, part, "transport")
    if not isinstance(t, dict):
        return None  # the part is missing: _why_missing says why
    name, granted = t.get("fuse_transport"), t.get("passthrough")
    writes = sum(v.get("write", 0) for v in (t.get("ack_requests") or {}).values())
    if mode == "passthrough":
        if name != "kernel" or not granted:
            return f"{part} ran fuse_transport={name} without passthrough (not root, or Linux < 6.9?)"
        if writes:
            return f"{part}: {writes:.0f} WRITE requests reached the daemon: not (only) passthrough"
        if reads and (_get(run, part, "cached_read", reads, "daemon_reads") or 0):
            return f"{part}: READ requests reached the daemon during the cached read: not passthrough"
    elif mode == "copy":
        if name != "kernel" or granted:
            return f"{part} ran fuse_transport={name}, passthrough={granted}: not the kernel transport's copy mode"
    elif name != "libfuse":
        return f"{part} ran fuse_transport={name}, not libfuse"
    return None


def _t_ack(mode: str, workload: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    part = TRANSPORT_PARTS[mode]
    return lambda run, meta: _ratio(_get(run, "raw", workload, "ack_s"), _get(run, part, workload, "ack_s"))


def _t_cpu_ack(mode: str, workload: str = "single") -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """Daemon CPU seconds per GiB acknowledged, in the phase of `workload` (the 1-file phase: nothing else runs)."""
    part = TRANSPORT_PARTS[mode]
    size = "single" if workload == "single" else "sharded"
    return lambda run, meta: (lambda c: c / (meta["sizes"][size] / (1 << 30)) if c is not None else None)(
        _get(run, part, "daemon", f"cpu_ack_{workload}_s"))


def _t_cached(mode: str, state: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    part = TRANSPORT_PARTS[mode]
    return lambda run, meta: _ratio(_get(run, part, "cached_read", state, "raw_s"), _get(run, part, "cached_read", state, "mount_s"))


def _cold_libfuse(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
    return _ratio(_get(run, "cold_read", "direct_s"), _get(run, "cold_read", "mount_libfuse", "read_s"))


def _cold_problem(run: dict[str, Any]) -> str | None:
    t = _get(run, "cold_read", "mount", "transport")
    if isinstance(t, dict) and t.get("fuse_transport") != "kernel":
        return f"the fresh mount ran fuse_transport={t.get('fuse_transport')}, not kernel"
    return None


def _rss(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
    v = _get(run, "ckptfs", "daemon", "peak_rss_bytes")
    return v / MiB if v else None


def _replication(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
    s5 = _get(run, "replication", "s5cmd") or {}
    return _ratio(_faster(s5.get("pipe_s"), s5.get("via_disk_s")), _get(run, "replication", "replicate_s"))


def _replication_mibps(*path: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    return lambda run, meta: (lambda b, t: b / MiB / t if b and t else None)(_get(run, "replication", "bytes"), _get(run, "replication", *path))


def _cpu_per_gib(run: dict[str, Any], meta: dict[str, Any], tool: str) -> float | None:
    a, b = _get(run, tool, "single", "cpu_s"), _get(run, tool, "sharded", "cpu_s")
    if a is None or b is None:
        return None
    return (a + b) / ((meta["sizes"]["single"] + meta["sizes"]["sharded"]) / (1 << 30))


# ------------------------------------------------------------ many small files (bench/small_files.py)
LOCAL, S5CMD, DRAINING, HELD = "small_files.local", "small_files.s5cmd", "small_files.ckptfs", "small_files.ckptfs_held"


def _small(*path: str) -> Any:
    return lambda run: _get(run, "small_files", *path)


def _small_ratio(a: Callable[[dict[str, Any]], Any], b: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    return lambda run, meta: _ratio(a(run), b(run))


def _small_per_file_ms(*path: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """Seconds at `path` under the small-files result as milliseconds per file."""
    return lambda run, meta: (lambda c, n: 1000 * c / n if c is not None and n else None)(
        _get(run, "small_files", *path), _get(run, "small_files", "count"))


def _small_durable_floor(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
    """The least `small_durable` the run's cores allow: the CPU that cannot be avoided (the server storing the
    same PutObjects, as in the s5cmd run; the daemon answering the writes with nothing uploading; the writer),
    spread perfectly over every core, with an upload client and drain bookkeeping that cost nothing."""
    sf = (run.get("small_files") or {})
    s5, held, cores = sf.get("s5cmd") or {}, sf.get("ckptfs_held") or {}, sf.get("cores")
    parts = (s5.get("cpu_server_s"), (held.get("daemon") or {}).get("cpu_write_s"), held.get("cpu_writer_s"), s5.get("upload_s"), cores)
    if any(x is None for x in parts) or not parts[3] or not cores:
        return None
    server, daemon, writer, s5cmd_s, _ = parts
    return max(server + daemon + writer, 0.0) / cores / s5cmd_s


SMALL_FIGURES: list[Figure] = [
    Figure("small_ack", "Small files (64 KiB each, create+write+close): ckptfs / local disk files per second", "x", ">=", 0.25,
           _small_ratio(_small("ckptfs", "files_per_s"), _small("local", "files_per_s")), True, (DRAINING, LOCAL)),
    Figure("small_last_first", "Small files, uploads held back: per-file time of the last tenth (500 of 5,000) / of the first tenth (ckptfs)", "x", "<=", 1.0,
           _small_ratio(_small("ckptfs_held", "last_ms"), _small("ckptfs_held", "first_ms")), False, (HELD,)),
    Figure("small_last_first_draining", "Small files, draining meanwhile: per-file time of the last tenth / of the first tenth (ckptfs)",
           "x", "", None, _small_ratio(_small("ckptfs", "last_ms"), _small("ckptfs", "first_ms")), False, (DRAINING,)),
    Figure("small_durable", "Small files: first write to all durable (ckptfs flush) / s5cmd cp of the same directory", "x", "<=", 1.5,
           _small_ratio(_small("ckptfs", "durable_from_start_s"), _small("s5cmd", "upload_s")), False, (DRAINING, S5CMD)),
    Figure("small_rm", "Small files never uploaded: rm -rf through ckptfs / rm -rf on the local disk", "x", "<=", 10.0,
           _small_ratio(_small("ckptfs_held", "rm_s"), _small("local", "rm_s")), False, (HELD, LOCAL),
           lambda run: (lambda e: f"rm -rf through ckptfs failed ({e['lines']} lines, first: {e['first']})" if e else None)(
               _get(run, "small_files", "ckptfs_held", "rm_errors"))),
    Figure("small_cpu_write", "Small files: ckptfs daemon CPU ms per file written (draining meanwhile)", "ms", "", None,
           _small_per_file_ms("ckptfs", "daemon", "cpu_write_s"), False, (DRAINING,)),
    Figure("small_cpu_held", "Small files: ckptfs daemon CPU ms per file written (uploads held back)", "ms", "", None,
           _small_per_file_ms("ckptfs_held", "daemon", "cpu_write_s"), False, (HELD,)),
    Figure("small_cpu_rm", "Small files: ckptfs daemon CPU ms per file removed (rm -rf, never uploaded)", "ms", "", None,
           _small_per_file_ms("ckptfs_held", "daemon", "cpu_rm_s"), False, (HELD,)),
    Figure("small_cpu_s5cmd", "Small files: s5cmd cp's own CPU ms per file", "ms", "", None,
           _small_per_file_ms("s5cmd", "cpu_s5cmd_s"), False, (S5CMD,)),
    Figure("small_cpu_server_s5cmd", "Small files: the S3 server's CPU ms per file stored by s5cmd cp", "ms", "", None,
           _small_per_file_ms("s5cmd", "cpu_server_s"), False, (S5CMD,)),
    Figure("small_cpu_server_ckptfs", "Small files: the S3 server's CPU ms per file, ckptfs writing and draining until flush returns", "ms", "", None,
           _small_per_file_ms("ckptfs", "cpu_server_s"), False, (DRAINING,)),
    Figure("small_cpu_writer", "Small files: the writer's own CPU ms per file created through ckptfs (uploads held back)", "ms", "", None,
           _small_per_file_ms("ckptfs_held", "cpu_writer_s"), False, (HELD,)),
    Figure("small_durable_floor", "Small files: the least first-write-to-durable / s5cmd cp these cores allow (server CPU of the s5cmd run + "
           "daemon CPU with uploads held back + writer CPU, over every core, uploads and their bookkeeping free)", "x", "", None,
           _small_durable_floor, False, (HELD, S5CMD)),
    Figure("small_files_per_s_local", "Small files: local disk, files per second", "files/s", "", None,
           lambda run, meta: _get(run, "small_files", "local", "files_per_s"), False, (LOCAL,)),
    Figure("small_files_per_s_ckptfs", "Small files: ckptfs (draining meanwhile), files per second", "files/s", "", None,
           lambda run, meta: _get(run, "small_files", "ckptfs", "files_per_s"), False, (DRAINING,)),
    Figure("small_files_per_s_held", "Small files: ckptfs (uploads held back), files per second", "files/s", "", None,
           lambda run, meta: _get(run, "small_files", "ckptfs_held", "files_per_s"), False, (HELD,)),
]


# ------------------------------------------------ the drain alone, signed and unsigned (bench/drain_cpu.py)
def _drain_cpu(config: str, field: str = "cpu_per_gib") -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """The median over the workload's rounds of one configuration (rounds that failed left out)."""
    def compute(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
        rounds = [r[field] for r in (_get(run, "drain_cpu", "rounds", config) or []) if isinstance(r, dict) and field in r]
        return statistics.median(rounds) if rounds else None
    return compute


DC = ("drain_cpu.rounds",)
DRAIN_CPU_FIGURES: list[Figure] = [
    Figure("drain_cpu_signed", "Drain alone (1 file, cache on the work dir): daemon CPU seconds per GiB, bytes signed over http (the default)",
           "s/GiB", "", None, _drain_cpu("signed"), False, DC),
    Figure("drain_cpu_unsigned", "Drain alone: daemon CPU seconds per GiB with sign_payload_over_http = false (what https costs, less TLS)",
           "s/GiB", "<=", 1.0, _drain_cpu("unsigned"), False, DC),
    Figure("drain_cpu_base", "Drain alone: the --compare checkout's daemon CPU seconds per GiB (its defaults)", "s/GiB", "", None,
           _drain_cpu("base"), False, DC),
    Figure("drain_mib_s_signed", "Drain alone: MiB/s, signed (the server's ingest bounds it)", "MiB/s", "", None,
           _drain_cpu("signed", "mib_per_s"), False, DC),
]


# ------------------------------------------------ a checkpoint in a temporary directory (bench/temporary_dir.py)
TD = ("temporary_dir.ckptfs",)
TEMPORARY_DIR_FIGURES: list[Figure] = [
    Figure("tmpdir_sent", "Temporary directory (3 x 512 MiB into step_N.tmp/, renamed): bytes sent to the store (ckptfs_uploaded_bytes_total) / bytes written",
           "x", "<=", 1.01, lambda run, meta: _ratio(_get(run, "temporary_dir", "ckptfs", "sent_bytes"), _get(run, "temporary_dir", "ckptfs", "bytes")),
           False, TD),
    Figure("tmpdir_keys", "Temporary directory: keys with the temporary name ever listed in the bucket (listed over and over from the first write to the flush)",
           "keys", "<=", 0.0, lambda run, meta: _get(run, "temporary_dir", "ckptfs", "temporary_keys_seen"), False, TD),
    Figure("tmpdir_durable", "Temporary directory: rename to all durable (ckptfs flush), seconds", "s", "", None,
           lambda run, meta: _get(run, "temporary_dir", "ckptfs", "durable_from_rename_s"), False, TD),
]


# ------------------------------------------------ what one NFS gateway serves (bench/nfs_gateway.py)
NFS = ("nfs_gateway.plain", "nfs_gateway.ckptfs")
NFS_CLIENTS = (1, 4)


def _nfs_mibps(export: str, clients: int) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    def f(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
        part = _get(run, "nfs_gateway", export, f"clients_{clients}") or {}
        return part["bytes"] / MiB / part["write_s"] if part.get("write_s") else None

    return f


def _nfs_ratio(clients: int) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    return lambda run, meta: _ratio(_nfs_mibps("ckptfs", clients)(run, meta), _nfs_mibps("plain", clients)(run, meta))


def _nfs_cpu_per_gib(export: str, *fields: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """CPU seconds of `fields` (summed) per GiB written, over the one-client and the four-client windows together."""
    def f(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
        parts = [_get(run, "nfs_gateway", export, f"clients_{c}") for c in NFS_CLIENTS]
        if not all(isinstance(p, dict) and all(k in p for k in fields) for p in parts):
            return None
        return sum(p[k] for p in parts for k in fields) / (sum(p["bytes"] for p in parts) / (1 << 30))

    return f


def _nfs_load(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
    loads = [load[0] for export in ("plain", "ckptfs") for c in NFS_CLIENTS
             for load in (_get(run, "nfs_gateway", export, f"clients_{c}", "loadavg_after"),) if load]
    return max(loads) if loads else None


def _nfs_drain_mibps(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
    d = _get(run, "nfs_gateway", "ckptfs", "drain") or {}
    return d["bytes"] / MiB / d["flush_s"] if d.get("flush_s") else None


NFS_FIGURES: list[Figure] = [
    *(Figure(f"nfs_write_{c}", f"NFS gateway, {c} client{'s' if c > 1 else ''} (nfs-cp, NFSv3, cache and plain directory on tmpfs): "
             "write throughput through Ganesha into ckptfs / Ganesha over a plain directory (uploads held back: the S3 ingest is not in it)",
             "x", ">=", 0.8, _nfs_ratio(c), True, NFS) for c in NFS_CLIENTS),
    Figure("nfs_cpu_daemon", "NFS gateway: ckptfs daemon CPU seconds per GiB written through Ganesha (1 and 4 clients)", "s/GiB", "", None,
           _nfs_cpu_per_gib("ckptfs", "cpu_daemon_s"), False, NFS[1:]),
    Figure("nfs_cpu_ganesha", "NFS gateway: Ganesha CPU seconds per GiB written, exporting ckptfs", "s/GiB", "", None,
           _nfs_cpu_per_gib("ckptfs", "cpu_ganesha_s"), False, NFS[1:]),
    Figure("nfs_cpu_gateway", "NFS gateway: ckptfs daemon + Ganesha CPU seconds per GiB written (what sizes a gateway, docs/nfs.md)", "s/GiB", "", None,
           _nfs_cpu_per_gib("ckptfs", "cpu_daemon_s", "cpu_ganesha_s"), False, NFS[1:]),
    Figure("nfs_cpu_ganesha_plain", "NFS gateway: Ganesha CPU seconds per GiB written, exporting a plain directory", "s/GiB", "", None,
           _nfs_cpu_per_gib("plain", "cpu_ganesha_s"), False, NFS[:1]),
    Figure("nfs_cpu_clients", "NFS gateway: the nfs-cp clients' own CPU seconds per GiB (through ckptfs)", "s/GiB", "", None,
           _nfs_cpu_per_gib("ckptfs", "cpu_clients_s"), False, NFS[1:]),
    Figure("nfs_daemon_requests", "NFS gateway: FUSE requests reaching the ckptfs daemon per MiB written over NFS (1 and 4 clients)", "req/MiB", "", None,
           lambda run, meta: (lambda r, b: sum(r.values()) / (b / MiB) if r and b else None)(
               _get(run, "nfs_gateway", "ckptfs", "fuse_requests"),
               sum(_get(run, "nfs_gateway", "ckptfs", f"clients_{c}", "bytes") or 0 for c in NFS_CLIENTS)), False, NFS[1:]),
    Figure("nfs_loadavg", "NFS gateway: highest 1-minute load average after a measured window (the machine is shared)", "load", "", None,
           _nfs_load, False, NFS),
    *(Figure(f"mibps_nfs_{export}_{c}", f"NFS, {c} nfs-cp client{'s (all together)' if c > 1 else ''}, Ganesha over "
             f"{'ckptfs (uploads held back)' if export == 'ckptfs' else 'a plain tmpfs directory'}", "MiB/s", "", None,
             _nfs_mibps(export, c), False, (f"nfs_gateway.{export}",)) for c in NFS_CLIENTS for export in ("plain", "ckptfs")),
    Figure("mibps_nfs_drain", "NFS gateway: ckptfs flush of the files written over NFS, after the window", "MiB/s", "", None,
           _nfs_drain_mibps, False, NFS[1:]),
]


# ----------------------------------------------------------- peer durability (bench/peers.py)
PEERS = ("peers.local", "peers.peer")


def _peers_ack(part: str, pair: str = "peer") -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """Acknowledge time with durability=local / with durability=peer (a throughput ratio: higher is better); `pair`:
    "peer", or "encrypted" (the same pair with peer_encryption = aes-gcm)."""
    return lambda run, meta: _ratio(_get(run, "peers", "local", part, "ack_s"), _get(run, "peers", pair, part, "ack_s"))


def _peers_receiver(pair: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    return lambda run, meta: _ratio(_get(run, "peers", pair, "cpu_receiver_s"),
                                    sum((_get(run, "peers", pair, p, "bytes") or 0) for p in ("single", "writers")) / (1 << 30))


def _peers_cpu(extra: bool, pair: str = "peer") -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """The owner daemon's CPU seconds per GiB replicated over both windows (less the local node's for the same writes)."""
    def f(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
        parts = ("single", "writers")
        peer = [_get(run, "peers", pair, p) for p in parts]
        local = [_get(run, "peers", "local", p) for p in parts]
        if not all(isinstance(x, dict) for x in peer) or (extra and not all(isinstance(x, dict) for x in local)):
            return None
        cpu = sum(x["cpu_daemon_s"] for x in peer) - (sum(x["cpu_daemon_s"] for x in local) if extra else 0.0)
        return cpu / (sum(x["bytes"] for x in peer) / (1 << 30))

    return f


def _peers_loss(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
    loss = _get(run, "peers", "peer", "node_lost") or {}
    if loss.get("lost") or loss.get("misnamed"):
        return float("inf")  # a file lost is no time at all
    return _ratio(loss.get("durable_s"), loss.get("bound_s"))


def _peers_drain(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
    d = _get(run, "peers", "local", "drain") or {}
    return d["bytes"] / MiB / d["flush_s"] if d.get("flush_s") else None


PEERS_FIGURES: list[Figure] = [
    Figure("peers_ack_single", "Peer durability: acknowledge (write+fsync+close) 1 file, durability=local / durability=peer "
           "(both nodes on this machine's cores, caches on tmpfs, uploads held back)", "x", ">=", 0.6, _peers_ack("single"), True, PEERS),
    Figure("peers_ack_writers", "Peer durability: acknowledge 4 writers, durability=local / durability=peer", "x", ">=", 0.6,
           _peers_ack("writers"), True, PEERS),
    Figure("peers_ack_floor_single", "Peer durability, the floor on this machine: 1 file written on tmpfs / the same with every byte "
           "streamed by sendfile to another process that holds it before fsync returns (no ckptfs, no checks: bench/peerfloor.py); "
           "no implementation's peers_ack_single can pass it here", "x", "", None,
           lambda run, meta: _get(run, "peers", "floor", "single", "ratio_none"), False, ("peers.floor",)),
    Figure("peers_ack_floor_writers", "Peer durability, the floor on this machine: 4 writers (as peers_ack_floor_single)", "x", "", None,
           lambda run, meta: _get(run, "peers", "floor", "writers", "ratio_none"), False, ("peers.floor",)),
    Figure("peers_ack_floor_hashed_single", "Peer durability, the floor with the checks the design needs (the receiver hashes what "
           "arrives, the sender reads its file back and hashes it at the seal): 1 file", "x", "", None,
           lambda run, meta: _get(run, "peers", "floor", "single", "ratio_hashed"), False, ("peers.floor",)),
    Figure("peers_ack_floor_hashed_writers", "Peer durability, the floor with the checks the design needs: 4 writers", "x", "", None,
           lambda run, meta: _get(run, "peers", "floor", "writers", "ratio_hashed"), False, ("peers.floor",)),
    Figure("peers_cpu_sender", "Peer durability: the sending daemon's CPU seconds per GiB replicated (all of its CPU over the windows)",
           "s/GiB", "<=", 0.3, _peers_cpu(False), False, PEERS[1:]),
    Figure("peers_cpu_added", "Peer durability: the sending daemon's CPU per GiB, less a local node's for the same writes", "s/GiB", "", None,
           _peers_cpu(True), False, PEERS),
    Figure("peers_cpu_receiver", "Peer durability: the receiving daemon's CPU seconds per GiB held", "s/GiB", "", None,
           _peers_receiver("peer"), False, PEERS[1:]),
    Figure("peers_encrypted_ack_single", "Peer durability with peer_encryption = aes-gcm: acknowledge 1 file, local / peer", "x", "",
           None, _peers_ack("single", "encrypted"), True, ("peers.local", "peers.encrypted")),
    Figure("peers_encrypted_ack_writers", "Peer durability with peer_encryption = aes-gcm: acknowledge 4 writers, local / peer", "x", "",
           None, _peers_ack("writers", "encrypted"), True, ("peers.local", "peers.encrypted")),
    Figure("peers_encrypted_cpu_sender", "Peer durability with peer_encryption = aes-gcm: the sending daemon's CPU seconds per GiB "
           "(against peers_cpu_sender in the same run: what encryption adds, <= 0.5 targeted)", "s/GiB", "", None,
           _peers_cpu(False, "encrypted"), False, ("peers.encrypted",)),
    Figure("peers_encrypted_cpu_receiver", "Peer durability with peer_encryption = aes-gcm: the receiving daemon's CPU seconds per GiB",
           "s/GiB", "", None, _peers_receiver("encrypted"), False, ("peers.encrypted",)),
    Figure("peers_node_lost", "Peer durability: node lost right after a save -> all its files durable, / (peer_lease_ttl + 1.5 x undrained "
           "/ drain rate of this run)", "x", "<=", 1.0, _peers_loss, False, PEERS),
    Figure("peers_trials_lost", "Peer durability: acknowledged files lost in the node-loss trials at random instants", "files", "<=", 0.0,
           lambda run, meta: _get(run, "peers", "trials", "lost_files"), False, ("peers.trials",)),
    Figure("peers_trials_twice", "Peer durability: bytes uploaded twice in the trials (objects made again after they existed)", "bytes",
           "<=", 0.0, lambda run, meta: _get(run, "peers", "trials", "twice_bytes"), False, ("peers.trials",)),
    Figure("peers_trials_replicas_left", "Peer durability: replicas left peer_drop_grace + 30 s after their files were durable", "files",
           "<=", 0.0, lambda run, meta: _get(run, "peers", "trials", "replicas_left"), False, ("peers.trials",)),
    Figure("peers_trials_count", "Peer durability: node-loss trials run", "trials", "", None,
           lambda run, meta: _get(run, "peers", "trials", "trials"), False, ("peers.trials",)),
    Figure("mibps_peers_drain", "Peer durability: the drain rate the node-loss bound uses (ckptfs flush on the local node)", "MiB/s", "", None,
           _peers_drain, False, PEERS[:1]),
]


# ------------------------------------------------------- the compressed cold tier (bench/compression.py)
def _cz_ratio(*names: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """Stored / original bytes of the cold tier's codec over the files `names`."""
    def f(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
        files = _get(run, "compression", "files")
        return _ratio(sum(files[n]["ours"] for n in names), sum(files[n]["size"] for n in names)) if files else None

    return f


def _cz_worst(baseline: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """The largest, over the files, of the codec's stored bytes / the baseline's on the same file."""
    def f(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
        files = _get(run, "compression", "files")
        return max(e["ours"] / e[baseline] for e in files.values()) if files else None

    return f


def _cz_speed(field: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """GB (1e9 bytes) of original per second of `field`: the codec's CPU seconds per file summed, or a wall time."""
    def f(run: dict[str, Any], meta: dict[str, Any]) -> float | None:
        c = _get(run, "compression") or {}
        files = c.get("files")
        if not files:
            return None
        seconds = c.get(field) if field in c else sum(e[field] for e in files.values())
        return sum(e["size"] for e in files.values()) / seconds / 1e9 if seconds else None

    return f


def _cz_daemon(field: str) -> Callable[[dict[str, Any], dict[str, Any]], float | None]:
    """Uncompressed / compressed time of the daemon's move or restore of the same files."""
    return lambda run, meta: _ratio(_get(run, "compression", "daemon_none", field), _get(run, "compression", "daemon_auto", field))


CZ = ("compression",)

FIGURES: list[Figure] = [
    Figure("ack_single", "Acknowledge, 1 file: ckptfs / raw disk throughput", "x", ">=", 0.8, _ack("single", "raw"), True),
    Figure("ack_sharded", "Acknowledge, 8 writers: ckptfs / raw disk throughput", "x", ">=", 0.7, _ack("sharded", "raw"), True),
    Figure("rename_ms", "Rename of the un-uploaded big file (ckptfs)", "ms", "<=", 10.0, _rename_ms("ckptfs")),
    Figure("rename_bytes", "Store bytes received during that rename (ckptfs)", "bytes", "<=", 0.0,
           lambda run, meta: _get(run, "ckptfs", "single", "rename_received_bytes")),
    Figure("rename_store_ratio", "Store bytes received for the renamed file / its size (ckptfs; 1 = no copy)", "x", "<=", 1.0,
           _store_bytes_ratio("ckptfs")),
    Figure("rename_copies", "Server-side copy requests for the renamed file (ckptfs)", "count", "<=", 0.0,
           lambda run, meta: _get(run, "ckptfs", "single", "copy_requests")),
    Figure("drain_single", "Drain, 1 file: faster of s5cmd/boto3 / ckptfs close-to-durable", "x", ">=", 0.9, _drain("single"), True),
    Figure("drain_sharded", "Drain, 8 files: faster of s5cmd/boto3 / ckptfs close-to-durable", "x", ">=", 0.9, _drain("sharded"), True),
    Figure("vs_s3fs_ack_single", "Peers, 1 file: s3fs / ckptfs time to acknowledge", "x", ">=", 3.0, _peer("s3fs", "single", "ack_s"), True),
    Figure("vs_s3fs_ack_sharded", "Peers, 8 writers: s3fs / ckptfs time to acknowledge", "x", ">=", 3.0, _peer("s3fs", "sharded", "ack_s"), True),
    Figure("vs_rclone_ack_single", "Peers, 1 file: rclone / ckptfs time to acknowledge", "x", ">=", 1.0, _peer("rclone", "single", "ack_s"), True),
    Figure("vs_rclone_ack_sharded", "Peers, 8 writers: rclone / ckptfs time to acknowledge", "x", ">=", 1.0, _peer("rclone", "sharded", "ack_s"), True),
    Figure("vs_s3fs_durable_single", "Peers, 1 file: s3fs / ckptfs time until the bucket holds it", "x", ">=", 1.0,
           _peer("s3fs", "single", "durable_from_start_s"), True),
    Figure("vs_s3fs_durable_sharded", "Peers, 8 writers: s3fs / ckptfs time until the bucket holds all", "x", ">=", 1.0,
           _peer("s3fs", "sharded", "durable_from_start_s"), True),
    Figure("vs_rclone_durable_single", "Peers, 1 file: rclone / ckptfs time until the bucket holds it", "x", ">=", 1.0,
           _peer("rclone", "single", "durable_from_start_s"), True),
    Figure("vs_rclone_durable_sharded", "Peers, 8 writers: rclone / ckptfs time until the bucket holds all", "x", ">=", 1.0,
           _peer("rclone", "sharded", "durable_from_start_s"), True),
    Figure("rclone_rename_ms", "Rename of the un-uploaded big file (rclone)", "ms", "", None, _rename_ms("rclone")),
    Figure("rclone_rename_store_ratio", "Store bytes received for it / its size (rclone)", "x", "", None, _store_bytes_ratio("rclone")),
    Figure("s3fs_rename_ms", "Rename of the big file (s3fs; it uploaded on close)", "ms", "", None, _rename_ms("s3fs")),
    Figure("s3fs_rename_copies", "Server-side copy requests for that rename (s3fs)", "count", "", None,
           lambda run, meta: _get(run, "s3fs", "single", "copy_requests")),
    Figure("cold_read", "Cold read of the big file: fresh ckptfs mount (kernel transport) / direct ranged download throughput", "x", ">=", 0.9,
           _cold, True, check=_cold_problem),
    Figure("cold_read_libfuse", "Cold read of the big file: fresh ckptfs mount (pyfuse3) / direct ranged download throughput", "x", "", None,
           _cold_libfuse, parts=("ckptfs", "cold_read")),
    # per FUSE transport, each against the raw disk of the same run
    Figure("ack_passthrough_single", "Passthrough, 1 file: ckptfs (kernel transport, passthrough) / raw disk throughput", "x", ">=", 0.95,
           _t_ack("passthrough", "single"), True, ("raw", "ckptfs"), lambda run: _transport_problem(run, "passthrough")),
    Figure("ack_passthrough_sharded", "Passthrough, 8 writers: ckptfs (kernel transport, passthrough) / raw disk throughput", "x", ">=", 0.9,
           _t_ack("passthrough", "sharded"), True, ("raw", "ckptfs"), lambda run: _transport_problem(run, "passthrough")),
    Figure("cpu_passthrough_ack", "Passthrough: daemon CPU seconds per GiB acknowledged (1-file phase)", "s/GiB", "<=", 0.1,
           _t_cpu_ack("passthrough"), False, ("ckptfs",), lambda run: _transport_problem(run, "passthrough")),
    Figure("cpu_passthrough_ack_sharded", "Passthrough: daemon CPU seconds per GiB acknowledged (8-writer phase; the first shards' drain may overlap)",
           "s/GiB", "", None, _t_cpu_ack("passthrough", "sharded"), False, ("ckptfs",), lambda run: _transport_problem(run, "passthrough")),
    Figure("cached_read_passthrough", "Passthrough: cached file, fresh open / raw disk read throughput (both in page cache)", "x", ">=", 0.9,
           _t_cached("passthrough", "warm"), True, ("raw", "ckptfs"), lambda run: _transport_problem(run, "passthrough", "warm")),
    Figure("cached_read_cold_passthrough", "Passthrough: cached file, fresh open / raw disk read throughput (neither in page cache)", "x", "", None,
           _t_cached("passthrough", "cold"), False, ("raw", "ckptfs"), lambda run: _transport_problem(run, "passthrough", "cold")),
    Figure("ack_copy_single", "Copy mode, 1 file: ckptfs (kernel transport, fuse_passthrough=false) / raw disk throughput", "x", ">=", 0.85,
           _t_ack("copy", "single"), True, ("raw", "ckptfs_copy"), lambda run: _transport_problem(run, "copy")),
    Figure("ack_copy_sharded", "Copy mode, 8 writers: ckptfs (kernel transport, fuse_passthrough=false) / raw disk throughput", "x", ">=", 0.6,
           _t_ack("copy", "sharded"), True, ("raw", "ckptfs_copy"), lambda run: _transport_problem(run, "copy")),
    Figure("cpu_copy_ack", "Copy mode: daemon CPU seconds per GiB acknowledged (1-file phase; the floor is the raw disk's own write plus one copy, docs/benchmarks.md)", "s/GiB", "<=", 0.35,
           _t_cpu_ack("copy"), False, ("ckptfs_copy",), lambda run: _transport_problem(run, "copy")),
    Figure("cached_read_copy", "Copy mode: cached file, fresh open / raw disk read throughput (both in page cache)", "x", "", None,
           _t_cached("copy", "warm"), False, ("raw", "ckptfs_copy"), lambda run: _transport_problem(run, "copy")),
    Figure("cached_read_cold_copy", "Copy mode: cached file, fresh open / raw disk read throughput (the mount's pages dropped)", "x", ">=", 0.5,
           _t_cached("copy", "cold"), False, ("raw", "ckptfs_copy"), lambda run: _transport_problem(run, "copy")),
    Figure("ack_libfuse_single", f"pyfuse3, 1 file: ckptfs (fuse_transport=libfuse) / raw disk throughput (before: {LIBFUSE_BEFORE['single']})",
           "x", ">=", LIBFUSE_BEFORE["single"], _t_ack("libfuse", "single"), True, ("raw", "ckptfs_libfuse"),
           lambda run: _transport_problem(run, "libfuse")),
    Figure("ack_libfuse_sharded", f"pyfuse3, 8 writers: ckptfs (fuse_transport=libfuse) / raw disk throughput (before: {LIBFUSE_BEFORE['sharded']})",
           "x", ">=", LIBFUSE_BEFORE["sharded"], _t_ack("libfuse", "sharded"), True, ("raw", "ckptfs_libfuse"),
           lambda run: _transport_problem(run, "libfuse")),
    Figure("cpu_libfuse_ack", "pyfuse3: daemon CPU seconds per GiB acknowledged (1-file phase)", "s/GiB", "", None,
           _t_cpu_ack("libfuse"), False, ("ckptfs_libfuse",), lambda run: _transport_problem(run, "libfuse")),
    Figure("cached_read_libfuse", "pyfuse3: cached file, fresh open / raw disk read throughput (both in page cache)", "x", "", None,
           _t_cached("libfuse", "warm"), False, ("raw", "ckptfs_libfuse"), lambda run: _transport_problem(run, "libfuse")),
    Figure("rss_peak", "ckptfs daemon peak RSS over the run (writes + drain of all data)", "MiB", "<=", 300.0, _rss),
    Figure("replication", "Replication to a 2nd server, 4 files: faster s5cmd copy / ckptfs commit-to-replicated", "x", ">=", 0.9,
           _replication, True, ("replication",)),
    Figure("replication_rss", "ckptfs daemon peak RSS while replicating (VmRSS sampled from commit to replicated)", "MiB", "<=", 300.0,
           lambda run, meta: (lambda v: v / MiB if v else None)(_get(run, "replication", "rss_peak_bytes")), False, ("replication",)),
    Figure("cz_bf16", "Compressed cold tier: BF16 safetensors weights, stored / original", "x", "<=", 0.70,
           _cz_ratio("model.safetensors"), parts=CZ),
    Figure("cz_training", "Compressed cold tier: DCP training checkpoint (FP32 weights and AdamW state), stored / original", "x", "<=",
           0.88, _cz_ratio("dcp/__0_0.distcp", "dcp/.metadata"), parts=CZ),
    Figure("cz_torch_save", "Compressed cold tier: torch.save FP32 state dict, stored / original", "x", "", None,
           _cz_ratio("model.pt"), parts=CZ),
    Figure("cz_vs_byte_grouped", "Compressed cold tier, worst file: ckptfs / byte-grouped zstd -3 (same files, same run)", "x", "<=", 1.0,
           _cz_worst("byte_grouped_zstd3"), parts=CZ),
    Figure("cz_vs_zstd3", "Compressed cold tier, worst file: ckptfs / plain zstd -3 (same files, same run)", "x", "<", 1.0,
           _cz_worst("zstd3"), parts=CZ),
    Figure("cz_compress_gbps", "Compressed cold tier: compression per core (thread CPU time, layout included)", "GB/s", ">=", 0.4,
           _cz_speed("encode_cpu_s"), parts=CZ),
    Figure("cz_decode_gbps", "Compressed cold tier: decoding and checking per core (thread CPU time)", "GB/s", "", None,
           _cz_speed("decode_cpu_s"), parts=CZ),
    Figure("cz_compress_gbps_2", "Compressed cold tier: compression on 2 threads at once (wall time)", "GB/s", "", None,
           _cz_speed("parallel_encode_s"), parts=CZ),
    Figure("cz_restore", "Restore from the cold target (second server): uncompressed / compressed time, same files", "x", ">=", 1.0,
           _cz_daemon("restore_s"), True, CZ),
    Figure("cz_move", "Move to the cold target (verified deep): uncompressed / compressed time, same files", "x", "", None,
           _cz_daemon("move_s"), False, CZ),
    Figure("cpu_written", "ckptfs daemon CPU seconds per GiB written", "s/GiB", "", None,
           lambda run, meta: _get(run, "ckptfs", "daemon", "cpu_per_gib_written")),
    Figure("cpu_drained", "ckptfs daemon CPU seconds per GiB drained", "s/GiB", "", None,
           lambda run, meta: _get(run, "ckptfs", "daemon", "cpu_per_gib_drained")),
    Figure("cpu_s5cmd", "s5cmd CPU seconds per GiB uploaded (both workloads)", "s/GiB", "", None,
           lambda run, meta: _cpu_per_gib(run, meta, "s5cmd")),
    Figure("cpu_boto3", "boto3 transfer manager CPU seconds per GiB uploaded (both workloads)", "s/GiB", "", None,
           lambda run, meta: _cpu_per_gib(run, meta, "boto3")),
    *SMALL_FIGURES,
    *DRAIN_CPU_FIGURES,
    *TEMPORARY_DIR_FIGURES,
    *NFS_FIGURES,
    *PEERS_FIGURES,
    # absolute throughputs, for reading the ratios
    Figure("mibps_raw_single", "raw disk, 1 file write+fsync+close", "MiB/s", "", None, _mibps("single", "raw", "single", "ack_s")),
    Figure("mibps_ckptfs_single", "ckptfs, 1 file write+fsync+close", "MiB/s", "", None, _mibps("single", "ckptfs", "single", "ack_s")),
    Figure("mibps_raw_sharded", "raw disk, 8 writers", "MiB/s", "", None, _mibps("sharded", "raw", "sharded", "ack_s")),
    Figure("mibps_ckptfs_sharded", "ckptfs, 8 writers", "MiB/s", "", None, _mibps("sharded", "ckptfs", "sharded", "ack_s")),
    Figure("mibps_s5cmd_single", "s5cmd upload, 1 file", "MiB/s", "", None, _mibps("single", "s5cmd", "single", "upload_s")),
    Figure("mibps_boto3_single", "boto3 transfer manager upload, 1 file", "MiB/s", "", None, _mibps("single", "boto3", "single", "upload_s")),
    Figure("mibps_ckptfs_drain_single", "ckptfs drain, 1 file (close to durable)", "MiB/s", "", None,
           _mibps("single", "ckptfs", "single", "durable_from_close_s")),
    Figure("mibps_s5cmd_sharded", "s5cmd upload, 8 files", "MiB/s", "", None, _mibps("sharded", "s5cmd", "sharded", "upload_s")),
    Figure("mibps_boto3_sharded", "boto3 transfer manager upload, 8 files", "MiB/s", "", None, _mibps("sharded", "boto3", "sharded", "upload_s")),
    Figure("mibps_ckptfs_drain_sharded", "ckptfs drain, 8 files (last close to durable)", "MiB/s", "", None,
           _mibps("sharded", "ckptfs", "sharded", "durable_from_close_s")),
    Figure("mibps_replication", "ckptfs replication, commit to replicated", "MiB/s", "", None, _replication_mibps("replicate_s"),
           parts=("replication",)),
    Figure("mibps_s5cmd_pipe", "s5cmd cat piped into s5cmd pipe between the servers", "MiB/s", "", None, _replication_mibps("s5cmd", "pipe_s"),
           parts=("replication",)),
    Figure("mibps_s5cmd_via_disk", "s5cmd cp to local disk, then to the other server", "MiB/s", "", None,
           _replication_mibps("s5cmd", "via_disk_s"), parts=("replication",)),
    Figure("mibps_direct_download", "direct ranged download, 1 file", "MiB/s", "", None, _mibps("single", "cold_read", "direct_s")),
    Figure("mibps_cold_read", "ckptfs cold read through a fresh mount (kernel transport), 1 file", "MiB/s", "", None,
           _mibps("single", "cold_read", "mount", "read_s")),
    Figure("mibps_copy_single", "ckptfs kernel transport in copy mode, 1 file write+fsync+close", "MiB/s", "", None,
           _mibps("single", "ckptfs_copy", "single", "ack_s")),
    Figure("mibps_libfuse_single", "ckptfs through pyfuse3, 1 file write+fsync+close", "MiB/s", "", None,
           _mibps("single", "ckptfs_libfuse", "single", "ack_s")),
    Figure("mibps_raw_read_warm", "raw disk read, 1 file in page cache", "MiB/s", "", None, _mibps("single", "ckptfs", "cached_read", "warm", "raw_s")),
    Figure("mibps_passthrough_read_warm", "ckptfs read of a cached file in page cache (passthrough)", "MiB/s", "", None,
           _mibps("single", "ckptfs", "cached_read", "warm", "mount_s")),
    Figure("mibps_raw_read_cold", "raw disk read, 1 file not in page cache", "MiB/s", "", None, _mibps("single", "ckptfs", "cached_read", "cold", "raw_s")),
    Figure("mibps_passthrough_read_cold", "ckptfs read of a cached file not in page cache (passthrough)", "MiB/s", "", None,
           _mibps("single", "ckptfs", "cached_read", "cold", "mount_s")),
]


def _why_missing(runs: list[dict[str, Any]], fig: Figure) -> str:
    """The first error, skip or 'not available' reason among the parts of a run a figure reads."""
    for run in runs:
        for part in fig.parts:
            path = part.split(".")
            node = _get(run, *path)
            inside = (node.get("mount"), node.get("cached_read")) if isinstance(node, dict) else ()
            # the part, what it holds (a cold read's mount...), and what holds it (a workload that failed whole)
            for where in (node, *inside, *(_get(run, *path[:i]) for i in range(1, len(path)))):
                if isinstance(where, dict):
                    for key in ("error", "skipped", "not_available"):
                        if key in where:
                            return f"{part}: {where[key]}"
    return "not measured in this run"


def summarise(runs: list[dict[str, Any]], meta: dict[str, Any], figures: list[Figure] | None = None) -> list[dict[str, Any]]:
    out = []
    for fig in FIGURES if figures is None else figures:
        values = []
        problems = []
        for run in runs:
            problem = fig.check(run) if fig.check else None
            try:
                v = None if problem else fig.compute(run, meta)
            except (TypeError, KeyError, ZeroDivisionError):
                v = None
            if problem:
                problems.append(problem)
            values.append(None if v is None else float(v))
        known = [v for v in values if v is not None]
        entry: dict[str, Any] = {
            "id": fig.id, "label": fig.label, "unit": fig.unit, "op": fig.op, "target": fig.target,
            "values": values, "median": None, "min": None, "max": None, "holds": None, "chart": fig.chart,
        }
        if known:
            med = statistics.median(known)
            entry.update(median=med, min=min(known), max=max(known))
            if fig.op == ">=":
                entry["holds"] = med >= fig.target  # type: ignore[operator]
            elif fig.op == "<=":
                entry["holds"] = med <= fig.target  # type: ignore[operator]
            elif fig.op == "<":
                entry["holds"] = med < fig.target  # type: ignore[operator]
        else:
            entry["why_missing"] = problems[0] if problems else _why_missing(runs, fig)
        out.append(entry)
    return out


# ------------------------------------------------------------------ rendering
def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "x":
        return f"{v:.2f}"
    if unit in ("bytes", "count"):
        return f"{v:.0f}"
    if unit == "ms":
        return f"{v:.2f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def markdown(result: dict[str, Any], chart_name: str | None) -> str:
    meta = result["meta"]
    sizes = meta["sizes"]
    figs = result["figures"]
    lines = [
        f"Recorded {meta['finished']} on {meta['machine']}: {meta['runs']} run(s), "
        f"1 file of {sizes['single'] / MiB:.0f} MiB, {sizes['shards']} writers of {sizes['shard'] / MiB:.0f} MiB, "
        f"writes of {sizes['chunk'] / MiB:.0f} MiB (scale {meta['scale']:g})"
        + (f", {meta['small_files']:,} small files of 64 KiB. " if meta.get("small_files") else ". ") +
        f"Load average before/after: {meta['loadavg_before']} / {meta['loadavg_after']}. "
        f"Raw data: `{meta['results_file']}`.",
        "",
        *transport_notes(result["runs"]),
        "| figure | target | median | min | max | holds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for f in figs:
        if f["id"].startswith("mibps_"):
            continue
        target = f"{f['op']} {_fmt(f['target'], f['unit'])} {'' if f['unit'] == 'x' else f['unit']}".strip() if f["op"] else "(info)"
        holds = {True: "yes", False: "**no**", None: "n/a" if f["op"] else ""}[f["holds"]]
        median = _fmt(f["median"], f["unit"])
        if f["median"] is None and f.get("why_missing"):
            median = f"n/a ({f['why_missing']})"
        unit = "" if f["unit"] in ("x", "count") else f" {f['unit']}"
        lines.append(f"| {f['label']} | {target} | {median}{unit if f['median'] is not None else ''} | "
                     f"{_fmt(f['min'], f['unit'])} | {_fmt(f['max'], f['unit'])} | {holds} |")
    lines += ["", "Absolute throughputs behind the ratios (MiB/s):", "", "| what | median | min | max |", "| --- | --- | --- | --- |"]
    for f in figs:
        if f["id"].startswith("mibps_"):
            lines.append(f"| {f['label']} | {_fmt(f['median'], 'MiB/s')} | {_fmt(f['min'], 'MiB/s')} | {_fmt(f['max'], 'MiB/s')} |")
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    lines += ["", f"Versions: {versions}."]
    if chart_name:
        lines += ["", f"![ratios against their limits]({chart_name})"]
    return "\n".join(lines) + "\n"


def transport_notes(runs: list[dict[str, Any]]) -> list[str]:
    """One line per ckptfs mount: the FUSE transport it reported and the requests that reached the daemon."""
    lines = []
    for mode, part in TRANSPORT_PARTS.items():
        seen = []
        for run in runs:
            t = _get(run, part, "transport")
            if not isinstance(t, dict):
                continue
            acks = t.get("ack_requests") or {}
            writes = sum(v.get("write", 0) for v in acks.values())
            reads = _get(run, part, "cached_read", "warm", "daemon_reads")
            seen.append(f"{t.get('fuse_transport')}{', passthrough' if t.get('passthrough') else ''}: {writes:.0f} WRITE"
                        + (f", {reads:.0f} READ (cached read)" if reads is not None else ""))
        if seen:
            lines.append(f"- `{part}` ({mode}): " + "; ".join(sorted(set(seen))) + " requests reached the daemon.")
    return ["FUSE transports as the daemons reported them (per run):", "", *lines, ""] if lines else []


def chart(result: dict[str, Any], path: Path) -> bool:
    """Horizontal bars: median ratio per figure, min-max whiskers, the target as a red tick. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figs = [f for f in result["figures"] if f["chart"]]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(figs) + 1.5))
    for i, f in enumerate(figs):
        y = len(figs) - 1 - i
        if f["median"] is not None:
            color = "tab:green" if f["holds"] else "tab:orange"
            ax.barh(y, f["median"], color=color, alpha=0.8)
            ax.errorbar(f["median"], y, xerr=[[f["median"] - f["min"]], [f["max"] - f["median"]]], fmt="none", ecolor="black", capsize=3)
            ax.text(f["median"], y, f" {f['median']:.2f}", va="center", fontsize=8)
        else:
            ax.text(0.02, y, " n/a", va="center", fontsize=8, transform=ax.get_yaxis_transform())
        if f["target"] is not None:
            ax.plot([f["target"], f["target"]], [y - 0.4, y + 0.4], color="red", linewidth=2)
    ax.set_yticks(range(len(figs)))
    ax.set_yticklabels([f["label"] for f in reversed(figs)], fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="grey", linewidth=0.5)
    ax.set_xlabel("ratio against the limit measured in the same run (higher is better; red tick = target)")
    ax.set_title(f"ckptfs benchmarks ({result['meta']['runs']} runs: median, min-max)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


BEGIN = "<!-- bench:results:begin (generated by python -m bench; do not edit by hand) -->"
END = "<!-- bench:results:end -->"

DOC_SKELETON = f"""# Benchmarks

`make bench` (or `python -m bench`) runs every workload below against one local SeaweedFS server
in one run and rewrites the results section of this page, `bench/results/*.json` and
`docs/benchmarks.png`.

## Results

{BEGIN}
{END}
"""


def update_doc(doc: Path, block: str) -> None:
    """Replace the generated block between the markers; keep the hand-written rest of the page."""
    text = doc.read_text() if doc.exists() else DOC_SKELETON
    if BEGIN not in text or END not in text:
        text = text.rstrip() + "\n\n## Results\n\n" + BEGIN + "\n" + END + "\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(head + BEGIN + "\n" + block + END + tail)


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
