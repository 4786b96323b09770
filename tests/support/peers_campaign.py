"""The fault campaign for peers (issue 42, "Tests"): real daemons on one SeaweedFS, a trainer's writes on one of
them, a fault on one role of the protocol, and a checker of what the bucket holds afterwards.

Why it is built this way:

- **One cluster, many episodes.** Starting daemons is most of a short episode's cost on a small machine, so the
  cluster (tests/support/peer_nodes.py) lives across episodes: a node an episode lost is replaced by a fresh one
  (a new name, an empty cache) or restarted with its cache, as the fault says. Each episode writes under its own
  directory (`ep<N>/`) and the checker reads only that prefix of the bucket.
- **A seeded schedule.** An episode is drawn from `random.Random(f"{seed}:{episode}")`: its owner, its operations,
  the role and kind of its fault and the instant (after how many operations). The seed is printed with every
  violation; `CKPTFS_CAMPAIGN_SEED` reruns it, `CKPTFS_CAMPAIGN_EPISODE` runs one episode of it alone.
- **The writer is a separate process** on the owner's mount that prints an event only after the system call
  returned (fsync, close, rename, unlink): what it printed is what the application was told, whatever happened to
  the daemon afterwards. The harness replays the events into a model: final name -> the last version acknowledged
  there (sha256), the versions before it, the names that must be gone.
- **Roles.** owner: the node writing. holder: the node holding the owner's replicas (`Node.replica_files`, else
  the placement order of gateway/peers/records.py). taker: the node that claimed the lost owner's record. A fault on
  the holder is followed by the owner's loss once the owner had time to notice it and copy its files elsewhere
  (`REREPLICATE_WINDOW`): otherwise a holder's fault changes nothing the bucket shows.
- **The checker** (`check_episode`) is strict: every version whose fsync/close/rename returned is in the bucket
  under its final name with those bytes (or, if its owner still lives, readable on the owner's mount: "held"), no
  name holds an older acknowledged version, no temporary, deleted or renamed-away name is left, no commit marker
  (`.metadata`) or manifest stands over a missing or stale file, and a checkpoint whose save completed is committed
  (a manifest). With R = 1 only a fault that loses the owner and the node holding its replicas together (owner +
  holder at once, or the taker lost with its cache mid-takeover) may lose what was not yet durable: such a loss is
  counted as allowed, only for versions the bucket lacked at the double loss.

Written here rather than with Hypothesis's stateful testing: the schedule is a handful of coarse steps, each taking
seconds of real daemons, and shrinking would re-run them many times; the seed makes any failure replayable.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.peer_nodes import Cluster, Node, process_alive, wait_until
from tests.support.smallfs import SmallFs, can_mount_tmpfs

MiB = 1 << 20
KiB = 1 << 10

# ------------------------------------------------------------------ the switches
# Every fault kind per role, and the operations and checks, each with the case of issue 42 it met on the code before
# that fixes (None: none met). All are expected to hold now; a kind, an operation or a check is turned off
# here (DISABLED) or with CKPTFS_CAMPAIGN_DISABLE=owner:same_name_empty,op:dcp,... ("" enables all; "known" disables
# every entry that met a case then: a first cut when bisecting a regression); CKPTFS_CAMPAIGN_FAULTS=owner:kill,...
# runs only those fault kinds.
FAULTS: dict[str, int | None] = {
    "owner:kill": None,  # SIGKILL, cache deleted: the node is lost
    "owner:kill_keep_cache": None,  # SIGKILL, cache kept, restarted with it after its lease (a reboot)
    "owner:silent": None,  # SIGSTOP, never continued (power lost: no FIN, no RST), then lost
    "owner:pause": None,  # SIGSTOP past the lease, then SIGCONT (a long GC pause, a frozen VM)
    "owner:same_name_empty": 2,  # SIGKILL, cache deleted, at once a mount with the same node_name and an empty cache
    "owner:store_cut": None,  # cut from the store (its proxy black-holes) but not from its peers, past the lease
    "owner:kill_with_holder": None,  # the owner and the holder of its replicas lost at once: the allowed loss
    "holder:kill": 3,  # the holder lost loudly (RST), the owner lost after REREPLICATE_WINDOW
    "holder:kill_keep_cache": None,  # the holder rebooted (back with its replicas), the owner lost after
    "holder:silent": 3,  # the holder stopped silently, the owner lost after REREPLICATE_WINDOW
    "holder:pause": None,  # the holder paused past the lease then resumed, the owner lost after
    "holder:same_name_empty": 2,  # the holder back at once with its name and an empty cache, the owner lost after
    "holder:store_cut": None,  # the holder cut from the store past the lease, the owner lost after
    "holder:disk_full": None,  # the holder's cache disk (a tmpfs of its own) filled, the owner lost while it is full
    "taker:kill": None,  # the owner lost, its taker SIGKILLed with its cache deleted mid-takeover: the allowed loss
    "taker:kill_keep_cache": None,  # the owner lost, the taker SIGKILLed mid-takeover and restarted with its cache
    "taker:silent": None,  # the owner lost, the taker stopped for good mid-takeover (its disk lost with it)
    "taker:pause": None,  # the owner lost, the taker paused past the lease mid-takeover, then resumed
    "taker:store_cut": None,  # the owner lost, the taker cut from the store mid-takeover past the lease
    "taker:store_errors": None,  # the owner lost, the store answering 503 SlowDown to every node mid-takeover
    "taker:store_outage": None,  # the owner lost, the store hanging for every node mid-takeover, less than a lease
}
# what the writer does (what trainers do), with the case each is known to meet when the owner is then lost
OPS: dict[str, int | None] = {
    # (the rename of these two is lost with its node as case 4's is, now and then: seeds 2:2, 5:2; left on so that
    # "known" still has a save to make)
    "op:file": None,  # write name.tmp, fsync, close, rename to name (torch.save behind a tmp name)
    "op:close_only": None,  # write and close, no fsync (torch.save, safetensors)
    "op:dir": 1,  # a checkpoint written in a directory (files fsynced), the directory renamed, its parent fsynced
    "op:dir_durable": 1,  # the same, its files durable before the rename (a long save whose shards drained)
    "op:dcp": 4,  # DCP's layout: each file .tmp, fsync, close, rename, `.metadata` last, no directory fsync
    "op:overwrite": None,  # a file rewritten in place, fsynced
    "op:overwrite_old_mtime": 6,  # the same, then its mtime set back (cp -p, rsync -a, os.utime)
    "op:delete": None,  # a file removed
}
CHECKS: dict[str, int | None] = {
    "check:committed": 5,  # a checkpoint whose save completed is committed (a manifest) even if its node was lost
}
DISABLED: set[str] = set()  # e.g. {"owner:same_name_empty", "holder:silent", "op:dcp", "check:committed"}
ROLES = ("owner", "holder", "taker")


def disabled() -> set[str]:
    """DISABLED, or what CKPTFS_CAMPAIGN_DISABLE says instead ("known": every entry known to fail on main)."""
    env = os.environ.get("CKPTFS_CAMPAIGN_DISABLE")
    if env is None:
        return set(DISABLED)
    if env.strip() == "known":
        return {k for table in (FAULTS, OPS, CHECKS) for k, case in table.items() if case is not None}
    return {s.strip() for s in env.split(",") if s.strip()}


def enabled_faults() -> list[str]:
    only = {s.strip() for s in os.environ.get("CKPTFS_CAMPAIGN_FAULTS", "").split(",") if s.strip()}
    off = disabled()
    if not can_mount_tmpfs():
        off.add("holder:disk_full")  # a disk of its own for each node's cache is a tmpfs: root only
    return [k for k in FAULTS if k not in off and (not only or k in only)]


# the cluster's options: a short lease, so that a lost node is found dead in seconds; the drain held back a little,
# so that a fault finds bytes the bucket lacks; a short quiet period, so that checkpoints commit in an episode's time
# CKPTFS_CAMPAIGN_REPLICAS=2 (with CKPTFS_CAMPAIGN_NODES=4): every file on two peers, and then no loss is allowed: a
# fault that loses the owner and one holder (or a taker mid-takeover) leaves another holder with every copy
REPLICAS = int(os.environ.get("CKPTFS_CAMPAIGN_REPLICAS", "1"))
NODE_OPTIONS: dict[str, Any] = {
    "peer_lease_ttl": 3,
    "peer_timeout": 4,
    "peer_drop_grace": 2,
    "checkpoint_quiet_seconds": 2,
    "peer_replicas": REPLICAS,
    # CKPTFS_CAMPAIGN_ENCRYPTION=aes-gcm: the stream encrypted (docs/peers.md), every fault as before
    "peer_encryption": os.environ.get("CKPTFS_CAMPAIGN_ENCRYPTION", "none"),
}
# each node's drain waits one of these after a close (drawn per node from the seed): a quick drain, or one slow enough
# that a fault, even REREPLICATE_WINDOW after the holder's, finds files the bucket lacks (`ckptfs flush`, which the
# writer's durable directory saves call, uploads at once whatever the delay)
UPLOAD_DELAYS = (1.0, 1.0, 20.0)
LEASE = float(NODE_OPTIONS["peer_lease_ttl"])
# how long an owner is given to notice a holder's fault and copy its undrained files to another node before it is
# lost too: a peer_timeout to give the holder up, a lease for the records to say it is down, and as much again
REREPLICATE_WINDOW = 2 * float(NODE_OPTIONS["peer_timeout"]) + 2 * LEASE
STORE_ERRORS = 40  # requests of each node answered 503 by a store_errors fault
PAUSE_FOR = 2.5 * LEASE  # a pause or a store cut: well past the lease
SETTLE_TIMEOUT = float(os.environ.get("CKPTFS_CAMPAIGN_SETTLE", "90"))  # for the bucket to reach the expected state


# ------------------------------------------------------------------ the writer
# Runs on the owner's mount; prints one JSON event per system call that returned. Its plan is made by the harness.
WRITER = r"""
import hashlib, json, os, random, sys, time
root, plan = sys.argv[1], json.loads(sys.argv[2])
def say(**kw):
    print(json.dumps(kw), flush=True)
def p(rel):
    return os.path.join(root, rel)
def write(rel, size, seed, fsync=True):
    data = random.Random(seed).randbytes(size)
    fd = os.open(p(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, size, 1 << 20):
            os.write(fd, data[off:off + (1 << 20)])
        if fsync:
            os.fsync(fd)
            say(ev="ack", path=rel, sha=hashlib.sha256(data).hexdigest(), size=size, how="fsync")
    finally:
        os.close(fd)
    if not fsync:
        say(ev="ack", path=rel, sha=hashlib.sha256(data).hexdigest(), size=size, how="close")
def rename(src, dst, is_dir=False):
    say(ev="renaming", src=src, dst=dst)
    os.rename(p(src), p(dst))
    say(ev="rename", src=src, dst=dst, dir=is_dir)
def fsync_dir(rel):
    fd = os.open(p(rel), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
try:
    for i, op in enumerate(plan):
        kind = op["kind"]
        say(ev="op", i=i, kind=kind, path=op.get("path"))
        if kind in ("file", "close_only"):
            os.makedirs(p(os.path.dirname(op["path"])), exist_ok=True)
            write(op["path"] + ".tmp", op["size"], op["seed"], fsync=kind == "file")
            rename(op["path"] + ".tmp", op["path"])
        elif kind in ("dir", "dir_durable"):
            tmp, final = op["tmp"], op["final"]
            os.makedirs(p(tmp))
            for j, size in enumerate(op["sizes"]):
                write(f"{tmp}/shard_{j}.bin", size, op["seed"] + j)
            if kind == "dir_durable":
                import ckptfs
                ckptfs.wait_durable(p(tmp), timeout=120)
                say(ev="durable", path=tmp)
            rename(tmp, final, is_dir=True)
            fsync_dir(os.path.dirname(final) or ".")
            say(ev="checkpoint", dir=final)
        elif kind == "dcp":
            d = op["dir"]
            os.makedirs(p(d))
            names = [f"__{j}_0.distcp" for j in range(len(op["sizes"]) - 1)] + [".metadata"]
            for j, (name, size) in enumerate(zip(names, op["sizes"])):
                write(f"{d}/{name}.tmp", size, op["seed"] + j)
                rename(f"{d}/{name}.tmp", f"{d}/{name}")
            say(ev="checkpoint", dir=d)
        elif kind in ("overwrite", "overwrite_old_mtime"):
            before = os.stat(p(op["path"])).st_mtime
            write(op["path"], op["size"], op["seed"])
            if kind == "overwrite_old_mtime":
                os.utime(p(op["path"]), (before - 3600, before - 3600))
                say(ev="utime", path=op["path"])
        elif kind == "delete":
            os.unlink(p(op["path"]))
            say(ev="unlink", path=op["path"])
        say(ev="op_done", i=i)
        time.sleep(op.get("pause", 0))
except OSError as e:
    say(ev="error", error=f"op {i} {kind}: {type(e).__name__}: {e}")
    sys.exit(3)
except Exception as e:  # ckptfs.wait_durable on a dead mount: a CkptfsError
    say(ev="error", error=f"op {i} {kind}: {type(e).__name__}: {e}")
    sys.exit(4)
say(ev="done")
"""


def plan_ops(rng: random.Random, base: str, count: int, off: set[str]) -> list[dict[str, Any]]:
    """A trainer's operations under `base`: saves first, then rewrites and removals of what was saved."""
    kinds = [k.removeprefix("op:") for k in OPS if k not in off]
    savers = [k for k in kinds if k in ("file", "close_only", "dir", "dir_durable", "dcp")] or ["file"]
    later = [k for k in kinds if k in ("overwrite", "overwrite_old_mtime", "delete")]
    ops: list[dict[str, Any]] = []
    files: list[str] = []  # names a later op may rewrite or remove
    n_ckpt = 0

    def size() -> int:
        return rng.choice([64 * KiB, 300 * KiB, 1 * MiB + 17, 2 * MiB + 3, 4 * MiB + 1])

    for i in range(count):
        kind = rng.choice(later) if later and files and rng.random() < 0.3 else rng.choice(savers)
        seed = rng.randrange(1 << 30)
        op: dict[str, Any] = {"kind": kind, "seed": seed, "pause": rng.choice([0, 0, 0.2, 0.5])}
        if kind in ("file", "close_only"):
            op.update(path=f"{base}/files/f{i}.bin", size=size())
            files.append(op["path"])
        elif kind in ("dir", "dir_durable"):
            n_ckpt += 1
            suffix = rng.choice([".tmp", ".partial"]) if kind == "dir" else ".partial"  # .tmp: a temporary directory
            op.update(tmp=f"{base}/checkpoint-{n_ckpt}{suffix}", final=f"{base}/checkpoint-{n_ckpt}",
                      sizes=[size() for _ in range(rng.randint(1, 3))])
            files += [f"{op['final']}/shard_{j}.bin" for j in range(len(op["sizes"]))]
        elif kind == "dcp":
            n_ckpt += 1
            op.update(dir=f"{base}/step_{n_ckpt}", sizes=[size() for _ in range(rng.randint(1, 2))] + [8 * KiB])
        elif kind in ("overwrite", "overwrite_old_mtime"):
            op.update(path=rng.choice(files), size=size())
        elif kind == "delete":
            op.update(path=files.pop(rng.randrange(len(files))))
        ops.append(op)
    return ops


def keep_lost_log(node: Node) -> None:
    """A lost node's log, kept beside its cache directory before the directory goes (keep_logs copies it with the rest):
    an owner's own account of its last seconds is what a violation's analysis needs first."""
    log = node.cache_dir / "ckptfs.log"
    if log.exists():
        kept = node.cache_dir.parent / "lost-logs"
        kept.mkdir(exist_ok=True)
        shutil.copyfile(log, kept / f"{node.name}-{time.strftime('%H%M%S')}-{os.getpid()}-{len(list(kept.iterdir()))}.log")


# ------------------------------------------------------------------ the model
@dataclass
class Version:
    sha: str
    size: int
    how: str  # fsync | close
    op: int  # the writer's operation that acknowledged it
    older: list[str] = field(default_factory=list)  # shas acknowledged before at the same file (overwritten)
    op_kind: str = ""


@dataclass
class Model:
    """What the application was told, replayed from the writer's events."""

    files: dict[str, Version] = field(default_factory=dict)  # final name -> last acknowledged version
    gone: dict[str, str] = field(default_factory=dict)  # names that must not be in the bucket -> why
    checkpoints: dict[str, str] = field(default_factory=dict)  # directories whose save completed -> op kind
    durable_before_rename: set[str] = field(default_factory=set)
    utimed: set[str] = field(default_factory=set)
    ops_done: int = 0
    ops_started: dict[int, str] = field(default_factory=dict)
    # a file whose rewrite began (open with O_TRUNC returned) and was never acknowledged: its content is what the
    # application left half-written; the checker accepts the version before, or nothing, and counts it as unsettled
    unsettled: set[str] = field(default_factory=set)
    # a rename that began and never returned (its node lost under it): it happened or it did not, so what was under
    # `src` may be in the bucket under `dst` instead, under one name, never both
    renaming: tuple[str, str] | None = None
    # an unlink that began and never returned (its node lost under it): it happened or it did not (campaign seed
    # 307462893 episode 18: the unlink reached the owner and its holder, then the node was lost; the file was gone
    # from the bucket as the application may have been told)
    deleting: str | None = None
    error: str | None = None
    done: bool = False

    def apply(self, ev: dict[str, Any]) -> None:
        kind = ev["ev"]
        if kind == "op":
            self.ops_started[ev["i"]] = ev["kind"]
            if ev["kind"].startswith("overwrite") and ev.get("path"):
                self.unsettled.add(ev["path"])
            self.deleting = ev.get("path") if ev["kind"] == "delete" else None
        elif kind == "ack":
            op = max(self.ops_started, default=-1)
            prev = self.files.get(ev["path"])
            older = ([*prev.older, prev.sha] if prev else [])
            self.files[ev["path"]] = Version(ev["sha"], ev["size"], ev["how"], op, older, self.ops_started.get(op, ""))
            self.gone.pop(ev["path"], None)
            self.unsettled.discard(ev["path"])
        elif kind == "renaming":
            self.renaming = (ev["src"], ev["dst"])
        elif kind == "rename":
            self.renaming = None
            src, dst = ev["src"], ev["dst"]
            moved = {k: v for k, v in self.files.items() if k == src or k.startswith(src + "/")}
            for k, v in moved.items():
                del self.files[k]
                new = dst + k[len(src):]
                self.files[new] = v
                self.gone[k] = "renamed away"
                self.gone.pop(new, None)
                if ev["dir"] and src in self.durable_before_rename:
                    self.durable_before_rename.add(new)
        elif kind == "unlink":
            self.deleting = None
            self.files.pop(ev["path"], None)
            self.gone[ev["path"]] = "deleted"
        elif kind == "durable":
            self.durable_before_rename.add(ev["path"])
        elif kind == "utime":
            self.utimed.add(ev["path"])
        elif kind == "checkpoint":
            self.checkpoints[ev["dir"]] = self.ops_started.get(max(self.ops_started, default=-1), "")
        elif kind == "op_done":
            self.ops_done += 1
        elif kind == "error":
            self.error = ev["error"]
        elif kind == "done":
            self.done = True


class WriterRun:
    """The writer process on a node's mount, its events read as they come."""

    def __init__(self, node: Node, plan: list[dict[str, Any]]) -> None:
        self.model = Model()
        self.mountpoint = node.path
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(node.path), json.dumps(plan)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=Path(__file__).resolve().parent.parent.parent)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.changed:
                self.model.apply(ev)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_ops(self, n: int, timeout: float) -> None:
        """Until `n` operations returned, or the writer ended (or stopped answering: a paused mount)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while self.model.ops_done < n and self.proc.poll() is None and self.reader.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.changed.wait(min(left, 0.5))

    def end(self, timeout: float = 60) -> None:
        """Wait for the writer to end (its node's mount answers or is dead), then for its last events. A writer killed
        while its node's daemon is stopped (a silent death) may not die: the kernel sends the FLUSH of its open files
        at exit and waits for the answer whatever the signal. On a real node it dies with the machine; here the
        mount's FUSE connection is aborted, which is what the rest of the machine sees of a node that is gone."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                abort_fuse_connection(self.mountpoint)
                self.proc.wait(timeout=60)
        self.reader.join(timeout=30)


def abort_fuse_connection(mountpoint: Path) -> None:
    """Abort the FUSE connection of the mount at `mountpoint` (/sys/fs/fuse/connections/<minor>/abort): its requests
    fail at once. Found through /proc/self/mountinfo: a stat of the mount would wait on its stopped daemon."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(mountpoint):
                minor = fields[2].split(":")[1]
                connections = Path("/sys/fs/fuse/connections")
                if not (connections / minor).exists():  # fusectl not mounted here yet
                    subprocess.run(["mount", "-t", "fusectl", "none", str(connections)], check=False, capture_output=True)
                (connections / minor / "abort").write_text("1")
                return


# ------------------------------------------------------------------ the cluster of the campaign
class CampaignCluster:
    """N live nodes kept across episodes: a node an episode lost is replaced by a new one."""

    def __init__(self, cluster: Cluster, size: int, seed: int = 0) -> None:
        self.cluster = cluster
        self.size = size
        self.seed = seed
        self.serial = 0
        self.live: list[Node] = []
        # each node's cache directory on a file system of its own (a tmpfs), where one can be mounted (root): a
        # disk that fills is then the node's alone, as on a real node
        self.disks: dict[str, SmallFs] = {}
        self.disk_size = 512 * MiB

    def new_node(self) -> Node:
        self.serial += 1
        delay = random.Random(f"{self.seed}:node:{self.serial}").choice(UPLOAD_DELAYS)
        n = self.cluster.node(f"n{self.serial}", start=False, upload_delay=delay, **NODE_OPTIONS)
        if can_mount_tmpfs():
            n.cache_dir.mkdir(parents=True, exist_ok=True)
            self.disks[n.name] = SmallFs(n.cache_dir, self.disk_size)
        n.start()
        self.live.append(n)
        return n

    def close(self) -> None:
        """Unmount the nodes' cache disks (after the cluster stopped: lazily, a dead daemon may hold files)."""
        for disk in self.disks.values():
            disk.close()

    def fill(self) -> None:
        """Back to `size` live nodes, each seeing the others."""
        while len(self.live) < self.size:
            self.new_node()
        self.cluster.wait_live([n.name for n in self.live], timeout=180)

    def lose(self, node: Node, delete_cache: bool = True, writer: "WriterRun | None" = None) -> None:
        """The node is gone for good (its disk with it unless kept): killed, unmounted, out of the live set.
        `writer`, the application on its mount, ends (its next call fails) before the mount is detached: after that
        its calls would reach the directory under the mount point and "succeed"."""
        if node.pid and process_alive(node.pid):
            os.kill(node.pid, signal.SIGKILL)
            wait_until(f"node {node.name}'s daemon to be gone", lambda: not process_alive(node.pid), 60)
        if writer is not None:
            writer.end(timeout=60)
        node.unmount_dead()
        if delete_cache:
            keep_lost_log(node)
            shutil.rmtree(node.cache_dir, ignore_errors=True)  # on its own disk: what it held (the disk stays mounted)
            disk = self.disks.get(node.name)
            if disk is not None:
                disk.empty()
        if node in self.live:
            self.live.remove(node)

    def restart_same_name(self, node: Node, empty_cache: bool) -> None:
        """The node's name mounted again (its cache kept, or a new empty one: a rescheduled pod)."""
        if empty_cache:
            keep_lost_log(node)
            shutil.rmtree(node.cache_dir, ignore_errors=True)
        node.proxy.set_mode("pass")
        self.cluster.restart(node)
        if node not in self.live:
            self.live.append(node)


def holder_of(owner: Node, live: list[Node]) -> Node | None:
    """The node holding `owner`'s replicas now (R = 1): the one with its replica files, else the placement order's
    first (gateway/peers/records.py: score xxh3_64(owner NUL candidate), highest first)."""
    others = [n for n in live if n is not owner]
    holding = [n for n in others if n.replica_files(owner.name)]
    if holding:
        return max(holding, key=lambda n: len(n.replica_files(owner.name)))
    import xxhash

    return max(others, key=lambda n: xxhash.xxh3_64_intdigest(f"{owner.name}\0{n.name}".encode()), default=None)


# ------------------------------------------------------------------ the bucket's side
class Bucket:
    """The objects under an episode's prefix, their bytes hashed once per ETag."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.client = cluster.s3.client()
        self._sha: dict[tuple[str, str], str] = {}

    def listing(self, prefix: str) -> dict[str, str]:
        """key -> ETag of every object under `prefix`."""
        out: dict[str, str] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.cluster.bucket, Prefix=prefix):
            out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
        return out

    def sha(self, key: str, etag: str) -> str | None:
        if (key, etag) not in self._sha:
            h = hashlib.sha256()
            try:
                body = self.client.get_object(Bucket=self.cluster.bucket, Key=key)["Body"]
            except self.client.exceptions.NoSuchKey:
                return None
            for chunk in iter(lambda: body.read(8 << 20), b""):
                h.update(chunk)
            self._sha[key, etag] = h.hexdigest()
        return self._sha[key, etag]

    def json(self, key: str) -> dict[str, Any] | None:
        try:
            body = self.client.get_object(Bucket=self.cluster.bucket, Key=key)["Body"].read()
            return dict(json.loads(body))
        except Exception:  # noqa: BLE001 - gone meanwhile, or not JSON: the checker says so
            return None


# ------------------------------------------------------------------ the checker
@dataclass
class Finding:
    what: str  # lost | misnamed | regressed | corrupt | left | marker_over_missing | manifest_stale | manifest_missing_file | not_committed | held
    name: str
    detail: str
    allowed: bool = False
    case: str = ""


def check_episode(bucket: Bucket, prefix: str, model: Model, double_loss: dict[str, str] | None,
                  owner_alive: Node | None, off: set[str], seen: dict[str, int] | None = None) -> list[Finding]:
    """What is wrong with the bucket under `prefix` (the mount's prefix + the episode's directory) against the
    model. `double_loss`: the bucket's listing (key -> ETag) when the owner and its replicas' holder were lost
    together (then a version the bucket lacked at that moment may be lost: allowed); `owner_alive`: the owner, if
    it still lives (a version it still holds is not lost); `seen`: per name, the newest version index an earlier
    check saw in the bucket (a later check that sees an older one reports the regression)."""
    mount_prefix = bucket.cluster.prefix + "/" if bucket.cluster.prefix else ""
    objects = bucket.listing(prefix)
    found: list[Finding] = []
    by_sha: dict[str, list[str]] = collections.defaultdict(list)
    for k, etag in objects.items():
        if "/.ckptfs" not in k:
            s = bucket.sha(k, etag)
            if s:
                by_sha[s].append(k[len(mount_prefix):])

    def was_durable_at_double_loss(rel: str, v: Version) -> bool:
        if double_loss is None:
            return True
        key = mount_prefix + rel
        return key in double_loss and bucket._sha.get((key, double_loss[key])) == v.sha

    def held(rel: str, v: Version) -> bool:
        if owner_alive is None:
            return False
        try:
            h = hashlib.sha256()
            with open(owner_alive.path / rel, "rb") as f:
                for chunk in iter(lambda: f.read(8 << 20), b""):
                    h.update(chunk)
            return h.hexdigest() == v.sha
        except OSError:
            return False

    def renamed_in_doubt(rel: str) -> str | None:
        """The name `rel` has if the rename that never returned happened."""
        if model.renaming is None:
            return None
        src, dst = model.renaming
        return dst + rel[len(src):] if rel == src or rel.startswith(src + "/") else None

    expected_keys = {mount_prefix + r for r in model.files}
    for rel, v in sorted(model.files.items()):
        key = mount_prefix + rel
        got = bucket.sha(key, objects[key]) if key in objects else None
        moved = renamed_in_doubt(rel)
        if got is None and moved is not None and mount_prefix + moved in objects:
            # the rename in doubt happened: the file is under its new name, and only there
            key, rel = mount_prefix + moved, moved
            got = bucket.sha(key, objects[key])
            expected_keys.add(key)
        index = len(v.older) if got == v.sha else v.older.index(got) if got in v.older else None
        if index is not None and seen is not None:
            if index < seen.get(rel, index):
                found.append(Finding("regressed", rel, f"the bucket went back from version {seen[rel] + 1} to {index + 1} "
                                                       f"of {len(v.older) + 1} (op {v.op_kind})"))
            seen[rel] = max(index, seen.get(rel, index))
        if got == v.sha:
            continue
        if rel in model.unsettled and (got is None or got in v.older):
            continue  # its rewrite never returned: the version before it, or nothing, is what the application left
        if rel == model.deleting and got is None:
            continue  # its unlink never returned: gone is one of the two outcomes
        allowed = not was_durable_at_double_loss(rel, v)
        elsewhere = [o for o in by_sha.get(v.sha, []) if o != rel]
        if held(rel, v):
            found.append(Finding("held", rel, f"not in the bucket, still on its live owner ({v.how}, op {v.op_kind})"))
        elif got is None and elsewhere:
            found.append(Finding("misnamed", rel, f"acknowledged ({v.how}, op {v.op_kind}) but in the bucket only as {elsewhere}", allowed))
        elif got is None:
            found.append(Finding("lost", rel, f"acknowledged ({v.how}, op {v.op_kind}), {v.size} bytes, in the bucket under no name", allowed))
        elif got in v.older:
            found.append(Finding("regressed", rel, f"the bucket holds version {v.older.index(got) + 1} of {len(v.older) + 1} (op {v.op_kind})", allowed))
        else:
            found.append(Finding("corrupt", rel, f"the bucket's bytes are none acknowledged there (op {v.op_kind})", allowed))
    for key in sorted(objects):
        rel = key[len(mount_prefix):]
        if key in expected_keys or "/.ckptfs" in key or key.endswith("/"):
            continue
        why = model.gone.get(rel, "never acknowledged under this name")
        # a name left behind: allowed only where the double loss took the rename or delete that removed it
        allowed = double_loss is not None and rel in model.gone
        found.append(Finding("left", rel, f"in the bucket, but {why}", allowed))
    # commit markers and manifests
    for ckpt, op_kind in sorted(model.checkpoints.items()):
        inside = {r: v for r, v in model.files.items() if r.startswith(ckpt + "/")}
        if not inside:
            continue  # every file of it removed since
        marker = mount_prefix + ckpt + "/.metadata"
        if marker in objects:
            for r, v in inside.items():
                if r.endswith("/.metadata"):
                    continue
                k = mount_prefix + r
                if k not in objects or bucket.sha(k, objects[k]) != v.sha:
                    found.append(Finding("marker_over_missing", r, f"{ckpt}/.metadata is in the bucket, this file is not (with its bytes)"))
        mkey = mount_prefix + ckpt + "/.ckptfs-manifest.json"
        if mkey not in objects:
            if "check:committed" not in off:
                # allowed after a double loss only: with R = 1 the owner and the holder (or the taker mid-takeover)
                # are the only nodes that know a save completed, whether or not its files reached the bucket
                found.append(Finding("not_committed", ckpt, f"its save completed ({op_kind}), no manifest",
                                     allowed=double_loss is not None))
            continue
        doc = bucket.json(mkey) or {}
        listed = {str(e.get("path")): e for e in doc.get("files", [])}
        for r, v in inside.items():
            sub = r[len(ckpt) + 1:]
            e = listed.get(sub)
            k = mount_prefix + r
            if e is None:
                found.append(Finding("manifest_missing_file", r, f"acknowledged in {ckpt}, not in its manifest (generation {doc.get('generation')})"))
            elif k not in objects or objects[k].strip('"') != str(e.get("etag")).strip('"') or bucket.sha(k, objects[k]) != v.sha:
                found.append(Finding("manifest_stale", r, f"the manifest (generation {doc.get('generation')}) lists "
                                                          f"etag {e.get('etag')}, the bucket has {objects.get(k)}, acknowledged bytes there: "
                                                          f"{k in objects and bucket.sha(k, objects[k]) == v.sha}"))
        for sub in listed:
            if ckpt + "/" + sub not in inside:
                found.append(Finding("manifest_stale", ckpt + "/" + sub, "in the manifest, not an acknowledged file of the checkpoint"))
    return found


def classify(f: Finding, fault: str, model: Model) -> str:
    """Which case of issue 42 a finding is (its number), or NEW."""
    role, kind = fault.split(":")
    v = model.files.get(f.name)
    op_kind = v.op_kind if v else ""
    if f.what == "held":
        return "held"
    if role == "holder" and kind in ("silent", "kill", "same_name_empty") and f.what in ("lost", "corrupt"):
        return "3"  # the holder's copies gone (silently or not) and the owner's undrained files not copied elsewhere
    if role == "owner" and kind == "same_name_empty" and f.what in ("lost", "corrupt"):
        return "2"  # the new incarnation under the old name: its predecessor never taken over
    if f.what == "not_committed":
        return "5"
    if f.what in ("regressed", "manifest_stale") and f.name in model.utimed:
        return "6"
    if kind in ("pause", "store_cut") and f.what in ("regressed", "corrupt"):
        return "7/8"
    if op_kind == "dcp" or f.name.rsplit("/", 1)[-1].startswith((".metadata", "__")):
        return "4"
    if op_kind in ("dir", "dir_durable") or "/checkpoint-" in f.name:
        return "1"  # a directory renamed (its files durable or not), then its node lost
    if f.what == "misnamed" and ".tmp'" in f.detail or f.what == "left" and (f.name.endswith(".tmp") or "renamed away" in f.detail):
        return "4"  # a file renamed from its .tmp name (no directory fsync), then its node lost: the rename not on a peer
    return "NEW"


# ------------------------------------------------------------------ one episode
@dataclass
class EpisodeResult:
    episode: int
    seed: str
    fault: str
    owner: str
    target: str
    ops: int
    files: int
    findings: list[Finding]
    violations: list[Finding]
    allowed: list[Finding]
    notes: list[str]
    seconds: float


class Campaign:
    def __init__(self, cluster: Cluster, seed: int, nodes: int = 3, ops: int = 8) -> None:
        self.cc = CampaignCluster(cluster, nodes, seed)
        self.bucket = Bucket(cluster)
        self.seed = seed
        self.ops = ops
        self.off = disabled()
        self.faults = enabled_faults()
        assert self.faults, "every fault kind is disabled"

    def episode(self, index: int) -> EpisodeResult:
        started = time.monotonic()
        rng = random.Random(f"{self.seed}:{index}")
        self.cc.fill()
        roles = sorted({f.split(":")[0] for f in self.faults}, key=ROLES.index)
        role = roles[index % len(roles)]  # every role in turn, the kind drawn from the seed
        fault = rng.choice([f for f in self.faults if f.startswith(role + ":")])
        kind = fault.split(":")[1]
        owner = rng.choice(self.cc.live)
        base = f"ep{index}"
        plan = plan_ops(rng, base, self.ops, self.off)
        # the fault comes after this many operations returned: at any point for the owner; for the holder and the
        # taker once the owner has saved at least half, so that they hold something when it strikes
        trigger = rng.randint(1 if role == "owner" else (len(plan) + 1) // 2, len(plan))
        notes: list[str] = []
        w = WriterRun(owner, plan)
        w.wait_ops(trigger, timeout=240)
        double_loss: dict[str, str] | None = None
        prefix = (self.bucket.cluster.prefix + "/" if self.bucket.cluster.prefix else "") + base + "/"
        owner_alive: Node | None = owner
        target = owner
        silent: list[Node] = []

        def snapshot() -> dict[str, str]:
            snap = self.bucket.listing(prefix)
            for k, e in snap.items():
                self.bucket.sha(k, e)
            return snap

        if role == "owner":
            if kind == "kill":
                self.cc.lose(owner, writer=w)
                owner_alive = None
            elif kind == "kill_keep_cache":
                self.cc.lose(owner, delete_cache=False, writer=w)
                w.end()
                time.sleep(rng.choice([0.0, 2 * LEASE]))  # back at once, or after its takeover began
                self.cc.restart_same_name(owner, empty_cache=False)
            elif kind == "silent":
                owner.pause()
                silent.append(owner)
                self.cc.live.remove(owner)
                owner_alive = None
                w.end(timeout=1)  # blocked on the stopped daemon: what it was told before is all it was told
            elif kind == "pause":
                owner.pause()
                time.sleep(PAUSE_FOR)
                owner.resume()
            elif kind == "same_name_empty":
                self.cc.lose(owner, writer=w)
                w.end()
                self.cc.restart_same_name(owner, empty_cache=True)
                owner_alive = None  # its new incarnation holds none of it
            elif kind == "store_cut":
                owner.proxy.set_mode("blackhole")
                time.sleep(PAUSE_FOR)
                owner.proxy.set_mode("pass")
            elif kind == "kill_with_holder":
                holder = holder_of(owner, self.cc.live)
                assert holder is not None
                target = holder
                double_loss = snapshot()
                for n in (owner, holder):
                    if n.pid:
                        os.kill(n.pid, signal.SIGKILL)  # both at once, then torn down
                self.cc.lose(owner, writer=w)
                self.cc.lose(holder)
                owner_alive = None
        elif role == "holder":
            holder = holder_of(owner, self.cc.live)
            assert holder is not None
            target = holder
            if kind == "kill":
                self.cc.lose(holder)
            elif kind == "kill_keep_cache":
                self.cc.lose(holder, delete_cache=False)
                time.sleep(rng.choice([0.0, 2 * LEASE]))
                self.cc.restart_same_name(holder, empty_cache=False)
            elif kind == "silent":
                holder.pause()
                silent.append(holder)
                self.cc.live.remove(holder)
            elif kind == "pause":
                holder.pause()
                time.sleep(PAUSE_FOR)
                holder.resume()
            elif kind == "same_name_empty":
                self.cc.lose(holder)
                self.cc.restart_same_name(holder, empty_cache=True)
            elif kind == "store_cut":
                holder.proxy.set_mode("blackhole")
                time.sleep(PAUSE_FOR)
                holder.proxy.set_mode("pass")
            elif kind == "disk_full":
                disk = self.cc.disks.get(holder.name)
                assert disk is not None, "disk_full needs the nodes' caches on disks of their own (root)"
                disk.fill()
            # the owner had REREPLICATE_WINDOW to notice and copy its files elsewhere; its writer goes on meanwhile
            time.sleep(REREPLICATE_WINDOW)
            self.cc.lose(owner, writer=w)
            owner_alive = None
            if kind == "disk_full":
                time.sleep(PAUSE_FOR)  # the takeover starts on a full disk
                self.cc.disks[holder.name].empty()
        else:  # taker
            self.cc.lose(owner, writer=w)
            owner_alive = None
            taker, done = self._wait_claim(owner, notes)
            if taker is None:
                taker = holder_of(owner, self.cc.live)
                done = True  # no claim in 6 leases: nothing was left to take over (or a bug): its loss loses nothing
                notes.append("no claim seen in time: the fault went to the holder")
            assert taker is not None
            target = taker
            # a taker lost with its disk mid-takeover loses the only copy left of what it had not uploaded: allowed;
            # once its takeover is done it has nothing left to lose
            if kind == "kill":
                double_loss = None if done else snapshot()
                self.cc.lose(taker)
            elif kind == "kill_keep_cache":
                self.cc.lose(taker, delete_cache=False)
                self.cc.restart_same_name(taker, empty_cache=False)
            elif kind == "silent":
                double_loss = None if done else snapshot()
                taker.pause()
                silent.append(taker)
                self.cc.live.remove(taker)
            elif kind == "pause":
                taker.pause()
                time.sleep(PAUSE_FOR)
                taker.resume()
            elif kind == "store_cut":
                taker.proxy.set_mode("blackhole")
                time.sleep(PAUSE_FOR)
                taker.proxy.set_mode("pass")
            elif kind == "store_errors":  # the store fails for everyone: the takeover retries, nobody regresses
                for n in self.cc.live:
                    n.proxy.fail(503, "SlowDown", STORE_ERRORS)
                time.sleep(PAUSE_FOR)
                for n in self.cc.live:
                    n.proxy.set_mode("pass")
            elif kind == "store_outage":  # the store hangs for everyone, shorter than a lease: no lease lapses
                for n in self.cc.live:
                    n.proxy.set_mode("blackhole")
                time.sleep(LEASE / 2)
                for n in self.cc.live:
                    n.proxy.set_mode("pass")
        if REPLICAS > 1:
            double_loss = None  # one holder lost with the owner (or a taker): another holds every copy
        if owner_alive is None:
            w.end()
        else:
            w.end(timeout=300)
        model = w.model
        if model.error:
            notes.append(f"writer stopped: {model.error}")
        # the silent nodes stay silent until the checker has its answer: then they are lost (their disks with them)
        findings = self._settle(prefix, model, double_loss, owner_alive if owner_alive in self.cc.live else None)
        for n in silent:
            self.cc.lose(n)
        for n in list(self.cc.live):  # a node that died on its own (not a fault of ours) is a finding too
            if not process_alive(n.pid):
                notes.append(f"node {n.name}'s daemon died")
                findings.append(Finding("daemon_died", n.name, "a daemon the campaign did not kill is gone"))
                self.cc.lose(n, delete_cache=False)
        for f in findings:
            f.case = classify(f, fault, model)
        violations = [f for f in findings if not f.allowed and f.what != "held"]
        allowed = [f for f in findings if f.allowed]
        return EpisodeResult(index, f"{self.seed}:{index}", fault, owner.name, target.name, model.ops_done,
                             len(model.files), findings, violations, allowed, notes, time.monotonic() - started)

    def _wait_claim(self, owner: Node, notes: list[str]) -> tuple[Node | None, bool]:
        """The node that claims the lost owner's record (mid-takeover, if caught before it is done), and whether its
        record already says the takeover is done."""
        deadline = time.monotonic() + 6 * LEASE
        while time.monotonic() < deadline:
            rec = owner.record() or {}
            by = rec.get("taken_over_by")
            if rec.get("state") == "taken_over" and by:
                done = bool(rec.get("takeover_done"))
                if done:
                    notes.append("the takeover was done before the taker's fault")
                return next((n for n in self.cc.live if n.name == by), None), done
            time.sleep(0.1)
        return None, False

    def _settle(self, prefix: str, model: Model, double_loss: dict[str, str] | None, owner_alive: Node | None) -> list[Finding]:
        """Until the bucket is as the model says (nothing found, or only allowed losses), or SETTLE_TIMEOUT."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        seen: dict[str, int] = {}
        regressions: dict[str, Finding] = {}
        while True:
            findings = check_episode(self.bucket, prefix, model, double_loss, None, self.off, seen)
            regressions.update({f.name: f for f in findings if f.what == "regressed" and "went back" in f.detail})
            if all(f.allowed for f in findings) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if owner_alive is not None and any(not f.allowed for f in findings):
            findings = check_episode(self.bucket, prefix, model, double_loss, owner_alive, self.off)
        return findings + [f for f in regressions.values() if f not in findings]


@dataclass
class Report:
    seed: int
    episodes: int = 0
    operations: int = 0
    files_checked: int = 0
    faults_per_role: collections.Counter[str] = field(default_factory=collections.Counter)
    faults_per_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    violations: int = 0
    violations_by_case: collections.Counter[str] = field(default_factory=collections.Counter)
    allowed_losses: int = 0
    held_not_durable: int = 0
    failing: dict[str, list[str]] = field(default_factory=dict)  # episode seed -> what
    seconds: float = 0.0

    def add(self, r: EpisodeResult) -> None:
        self.episodes += 1
        self.operations += r.ops
        self.files_checked += r.files
        self.faults_per_role[r.fault.split(":")[0]] += 1
        self.faults_per_kind[r.fault] += 1
        self.violations += len(r.violations)
        self.allowed_losses += len(r.allowed)
        self.held_not_durable += sum(1 for f in r.findings if f.what == "held")
        for f in r.violations:
            self.violations_by_case[f.case] += 1
        if r.violations:
            self.failing[r.seed] = [f"{r.fault} (owner {r.owner}, target {r.target}): case {f.case}: {f.what} {f.name}: {f.detail}"
                                    for f in r.violations]

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "episodes": self.episodes, "operations": self.operations,
                "files_checked": self.files_checked, "faults_per_role": dict(self.faults_per_role),
                "faults_per_kind": dict(self.faults_per_kind), "violations": self.violations,
                "violations_by_case": dict(self.violations_by_case), "allowed_losses": self.allowed_losses,
                "held_not_durable": self.held_not_durable, "failing_episodes": self.failing,
                "run_time_s": round(self.seconds, 1)}
