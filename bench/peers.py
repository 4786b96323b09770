"""Peer durability (issue 36, docs/peers.md): what acknowledging on a peer costs, and what losing a node costs.

Nodes are ckptfs daemons on this machine, each with its own cache directory and `node_name`,
mounting one bucket (tests/support/peer_nodes.py, shared with tests/integration/test_peers.py);
every cache is on tmpfs (/dev/shm), so the disk's noise does not decide the ratios. Both nodes of
a pair share this machine's cores: the sender and the receiver compete for the same two CPUs, which
a real pair of nodes would not (the result says how many cores there were).

What is measured, in one run:

* acknowledge: write + fsync + close of 1 file of SIZE, then 4 writers of SIZE / 4 each at once
  (bench/writer.py, one process each), on a node with `durability = local` and on a node with
  `durability = peer` (R = 1: one peer); the ratio is local's time / peer's (>= 0.6 targeted).
  The raw results keep each writer's written / fsynced / closed times (`each`): the fsync's wait
  is the stream's lag behind the writer plus the seal.
  Both nodes hold their uploads back (`upload_delay = 3600`), so the S3 server's ingest is not in the
  window: the ratio is what acknowledging costs, not what draining does.
* the floor (bench/peerfloor.py), first: the same writers on tmpfs with no ckptfs, then with each file
  streamed by sendfile to another process that holds every byte before fsync returns; plain / that is the
  highest ratio any implementation could reach on this machine (with and without the design's hashes).
* the sender's CPU: the owner daemon's CPU seconds over the peer windows per GiB replicated (<= 0.3
  targeted), and the same less the local node's over the same writes (what replication adds).
* the drain rate: `ckptfs flush` of the local node's files after its windows (bytes / seconds).
* encryption: the same pair and windows with `peer_encryption = aes-gcm` on both nodes (ack ratios, sender and
  receiver CPU per GiB beside the clear run's).
* node lost: the owner saves 4 files (tmp, fsync, rename) with its drain held back and is lost right
  after (SIGKILL, cache deleted); the time until every file is in the bucket, against
  `peer_lease_ttl` + 1.5 x its undrained bytes / the drain rate of this run (<= 1 targeted).
* trials: TRIALS owners (5 with --quick), each lost at a random instant within 1.5 s of its first
  fsync while its drain runs: files lost, bytes uploaded twice (whole objects made twice, counted
  per key by a proxy in front of each node), replicas left on the survivors `peer_drop_grace` + 30 s
  after the files were durable. Each must be 0.

`python -m bench.peers [--quick]` runs it alone; `make bench` runs it as the `peers` target
(`python -m bench --only peers`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from bench import peerfloor, report
from bench.env import GiB, MiB, ROOT, BenchServer, cpu_seconds, disk_free, guarded, loadavg, log, run_writers
from tests.support.peer_nodes import Cluster, Node, file_spec, node_loss_trial, wait_until

SIZE = 1 * GiB
QUICK_SIZE = 64 * MiB
WRITERS = 4
TRIALS = 50
QUICK_TRIALS = 5
CHUNK = 4 * MiB
TTL = 5.0  # peer_lease_ttl of the bench's nodes
GRACE = 5.0  # peer_drop_grace
HELD = {"upload_delay": 3600}
TMPFS = Path("/dev/shm")


def scratch_root(work: Path) -> tuple[Path, bool]:
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK):
        return TMPFS / f"ckptfs-bench-peers-{os.getpid()}", True
    return work / "peers", False


def acknowledge(node: Node, size: int, label: str) -> dict[str, Any]:
    """1 file of `size`, then WRITERS files of size / WRITERS at once: seconds to acknowledge, daemon CPU."""
    out: dict[str, Any] = {}
    assert node.pid
    for part, names, each in (("single", ["single.bin"], size), ("writers", [f"w{i}.bin" for i in range(WRITERS)], size // WRITERS)):
        d = node.path / label / part
        d.mkdir(parents=True)
        load0 = loadavg()
        cpu0 = cpu_seconds(node.pid)
        w = run_writers([d / n for n in names], each, CHUNK)
        out[part] = {"ack_s": w.ack_seconds, "bytes": each * len(names), "cpu_daemon_s": cpu_seconds(node.pid) - cpu0,
                     "loadavg_before": load0, "loadavg_after": loadavg(),
                     # each writer's written / fsynced / closed, seconds from the common start: how long its fsync
                     # waited for the tail and the seal, against how long writing took
                     "each": [{k: round(v - w.started, 3) for k, v in r.items() if k != "started"} for r in w.per_writer]}
    return out


def local_node(cluster: Cluster, size: int) -> dict[str, Any]:
    node = cluster.node("local", durability="local", **HELD)
    out = acknowledge(node, size, "ack")
    written = sum(p["bytes"] for p in out.values())
    started = time.monotonic()
    r = node.flush(timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"ckptfs flush failed: {(r.stderr or r.stdout).strip()[:300]}")
    out["drain"] = {"bytes": written, "flush_s": time.monotonic() - started}
    st = node.status()
    out["transport"] = {"fuse_transport": st.get("fuse_transport"), "passthrough": bool(st.get("passthrough"))}
    node.stop()
    shutil.rmtree(node.cache_dir, ignore_errors=True)
    return out


def peer_pair(cluster: Cluster, size: int, drain_rate: float | None) -> dict[str, Any]:
    owner = cluster.node("owner", **HELD)
    peer = cluster.node("peer")
    cluster.wait_live(["owner", "peer"])
    assert peer.pid
    peer_cpu0 = cpu_seconds(peer.pid)
    out = acknowledge(owner, size, "ack")
    out["cpu_receiver_s"] = cpu_seconds(peer.pid) - peer_cpu0
    states = {owner.state(f"ack/{p}/{n}") for p, ns in (("single", ["single.bin"]), ("writers", [f"w{i}.bin" for i in range(WRITERS)]))
              for n in ns}
    out["states"] = sorted(states)  # "replicated", unless a write was degraded
    out["replicated_bytes"] = owner.metric("ckptfs_peer_replicated_bytes_total")
    out["degraded_writes"] = owner.metric("ckptfs_peer_degraded_writes_total")
    st = owner.status()
    out["transport"] = {"fuse_transport": st.get("fuse_transport"), "passthrough": bool(st.get("passthrough"))}
    # drain what was acknowledged, then lose the owner right after a save
    r = owner.flush(timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"ckptfs flush failed: {(r.stderr or r.stdout).strip()[:300]}")
    trial = node_loss_trial(cluster, owner, [peer], file_spec(WRITERS, size // WRITERS, seed=1, directory="loss/step_1"),
                            kill_after=None, timeout=3600)
    loss = trial.as_dict()
    if drain_rate:
        loss["bound_s"] = TTL + 1.5 * trial.undrained_bytes / drain_rate
    out["node_lost"] = loss
    peer.stop()
    shutil.rmtree(peer.cache_dir, ignore_errors=True)
    return out


def encrypted_pair(cluster: Cluster, size: int) -> dict[str, Any]:
    """The acknowledge windows of `peer_pair` with peer_encryption = aes-gcm on both nodes: what encryption costs."""
    owner = cluster.node("owner", peer_encryption="aes-gcm", **HELD)
    peer = cluster.node("peer", peer_encryption="aes-gcm")
    cluster.wait_live(["owner", "peer"])
    assert peer.pid
    peer_cpu0 = cpu_seconds(peer.pid)
    out = acknowledge(owner, size, "ack")
    out["cpu_receiver_s"] = cpu_seconds(peer.pid) - peer_cpu0
    out["degraded_writes"] = owner.metric("ckptfs_peer_degraded_writes_total")
    return out


def trials(cluster: Cluster, count: int, size: int, rng: random.Random, log: Callable[[str], None]) -> dict[str, Any]:
    survivors = [cluster.node("s1"), cluster.node("s2")]
    results = []
    for i in range(count):
        owner = cluster.node(f"t{i}", upload_delay=0.5)
        cluster.wait_live([s.name for s in survivors] + [owner.name])
        r = node_loss_trial(cluster, owner, survivors, file_spec(4, size, seed=100 + i, directory=f"trials/step_{i}"),
                            kill_after=rng.uniform(0.0, 1.5), timeout=900)
        left = 0
        try:
            wait_until("the replicas to be dropped", lambda: not any(s.replica_files(owner.name) for s in survivors), GRACE + 30)
        except AssertionError:
            left = sum(len(s.replica_files(owner.name)) for s in survivors)
        results.append({**r.as_dict(), "replicas_left": left})
        shutil.rmtree(owner.path, ignore_errors=True)
        if (i + 1) % 10 == 0 or i + 1 == count:
            log(f"peers: {i + 1} of {count} node-loss trials")
    return {
        "trials": len(results),
        "acknowledged_files": sum(r["acknowledged"] for r in results),
        "lost_files": sum(len(r["lost"]) + len(r["misnamed"]) for r in results),
        "twice_bytes": sum(r["twice_bytes"] for r in results),
        "replicas_left": sum(r["replicas_left"] for r in results),
        "not_durable": sum(1 for r in results if r["durable_s"] is None),
        "durable_s_max": max((r["durable_s"] for r in results if r["durable_s"] is not None), default=None),
        "each": results,
    }


def peers(server: BenchServer, work: Path, tag: str, log: Callable[[str], None], size: int = SIZE,
          count: int = TRIALS, index: int = 1) -> dict[str, Any]:
    """Local, then the peer pair (node loss included), then the trials, each on a fresh bucket."""
    root, on_tmpfs = scratch_root(work)
    need = 3 * size + GiB
    if disk_free(root.parent) < need:
        return {"skipped": f"{root.parent} has {disk_free(root.parent) / GiB:.1f} GiB free, the peers workload needs about "
                           f"{need / GiB:.1f} GiB there: free some or use a smaller size"}
    out: dict[str, Any] = {"size": size, "writers": WRITERS, "tmpfs": on_tmpfs, "cores": len(os.sched_getaffinity(0)),
                           "peer_lease_ttl": TTL}
    rng = random.Random(index)
    log(f"peers: the floor of acknowledging on a peer here (no ckptfs), 1 file of {size >> 20} MiB, then {WRITERS} writers")
    out["floor"] = guarded(lambda: peerfloor.floor(root / "floor", size, WRITERS, CHUNK))
    shutil.rmtree(root, ignore_errors=True)
    for part in ("local", "peer", "encrypted", "trials"):
        bucket = f"bench-{tag}-peers-{part}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        server.make_bucket(bucket)
        cluster = Cluster(server, bucket, root, peer_lease_ttl=TTL, peer_drop_grace=GRACE)
        try:
            if part == "local":
                log(f"peers: durability=local, 1 file of {size >> 20} MiB, then {WRITERS} writers")
                out["local"] = guarded(lambda: local_node(cluster, size))
            elif part == "peer":
                drain = (out.get("local") or {}).get("drain") or {}
                rate = drain["bytes"] / drain["flush_s"] if drain.get("flush_s") else None
                log("peers: durability=peer on a pair of nodes, then the owner lost after a save")
                out["peer"] = guarded(lambda: peer_pair(cluster, size, rate))
            elif part == "encrypted":
                log("peers: the same pair with peer_encryption = aes-gcm")
                out["encrypted"] = guarded(lambda: encrypted_pair(cluster, size))
            else:
                log(f"peers: {count} node-loss trials at random instants")
                out["trials"] = guarded(lambda: trials(cluster, count, max(MiB, size // 16), rng, log))
        finally:
            cluster.stop()
            shutil.rmtree(root, ignore_errors=True)
            server.drop_bucket(bucket)
    return out


def figures(result: dict[str, Any]) -> dict[str, Any]:
    return {f["id"]: f["median"] if f["median"] is not None else f.get("why_missing")
            for f in report.summarise([{"peers": result}], {}, report.PEERS_FIGURES)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=SIZE // MiB, help=f"MiB of the one file (the 4 writers write as much together; default {SIZE // MiB})")
    p.add_argument("--trials", type=int, default=TRIALS, help=f"node-loss trials at random instants (default {TRIALS})")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_SIZE // MiB} MiB, {QUICK_TRIALS} trials")
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "tmp",
                   help="scratch directory for the S3 server (the caches go to /dev/shm)")
    p.add_argument("--out", type=Path, default=None, help="write the raw results as JSON here")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    size = QUICK_SIZE if args.quick else args.size_mib * MiB
    count = QUICK_TRIALS if args.quick else args.trials
    if size < 4 * MiB or count < 0:
        p.error("--size-mib must be at least 4 and --trials at least 0")
    work = args.work.absolute() / f"peers-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    server = BenchServer(work / "seaweed")
    try:
        server.start()
        result = peers(server, work, f"p{os.getpid()}", log, size, count)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(figures(result), indent=1))
    return 0 if all("error" not in (result.get(k) or {}) for k in ("local", "peer", "trials")) else 1


if __name__ == "__main__":
    sys.exit(main())
