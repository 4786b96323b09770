"""Nodes of one bucket with peer durability, on one machine, and the node-loss trial (issue 36).

Each node is a real `ckptfs mount --daemon` with its own cache directory and `node_name`, all of
them mounting one bucket with `durability = peer`, listening for peers on 127.0.0.1 (port 0: any
free port, announced in the node record) and sharing one 0600 secret file. Each talks to the S3
server through a FaultProxy of its own, so the uploads of every node are counted per key
(`FaultProxy.writes`) and one node's store can be made unreachable without touching the others'.

`node_loss_trial()` is what the tests (tests/integration/test_peers.py) and the benchmark
(bench/peers.py) both run: a writer on the owner saves files (tmp, fsync, rename), the owner's
daemon is SIGKILLed at the given instant and its cache directory deleted, and the trial waits until
every acknowledged file is in the bucket, then says what it found: files lost, files under the wrong
name, bytes uploaded twice, how long it took, which survivor took over.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from tests.support.faultproxy import FaultProxy, ForwardedWrite
from tests.support.seaweed import SeaweedServer, free_port

ROOT = Path(__file__).resolve().parent.parent.parent
CKPTFS = [sys.executable, "-m", "ckptfs.cli"]
NODES_PREFIX = ".ckptfs/nodes/"
MiB = 1 << 20

# what a cluster of test nodes gets unless a test says otherwise: a short lease, so that a lost
# node is found dead in seconds; a short grace, so that leftover replicas show up in a test's time
PEER_DEFAULTS: dict[str, Any] = {
    "durability": "peer",
    "peer_addr": "127.0.0.1:0",
    "peer_lease_ttl": 3,
    "peer_timeout": 5,
    "peer_drop_grace": 2,
    "upload_delay": 0.2,
    "listing_timeout": 120,
}


def write_secret(path: Path, secret: bytes | None = None) -> Path:
    """A shared secret file as docs/peers.md says to make one: 48 random bytes, base64, chmod 600."""
    import base64

    path.write_bytes(base64.b64encode(secret or os.urandom(48)) + b"\n")
    path.chmod(0o600)
    return path


@dataclass
class Node:
    """One daemon: a mount of the cluster's bucket with a cache directory and a node name of its own."""

    name: str
    s3: SeaweedServer
    bucket: str
    prefix: str
    path: Path
    cache_dir: Path
    options: dict[str, Any]
    proxy: FaultProxy
    metrics_port: int = field(default_factory=free_port)
    pid: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. CKPTFS_TEST_FAULTS for the daemon

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.s3.env(), **self.extra_env}

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CKPTFS, *args], capture_output=True, text=True, env=self.env, timeout=timeout, cwd=ROOT)

    def mount_args(self) -> list[str]:
        args = ["mount", f"s3://{self.bucket}/{self.prefix}".rstrip("/"), str(self.path), "--cache-dir", str(self.cache_dir),
                "--endpoint-url", self.proxy.url, "--daemon", "--metrics-addr", f"127.0.0.1:{self.metrics_port}"]
        for k, v in self.options.items():
            args += ["-o", f"{k}={v}"]
        return args

    def start(self) -> "Node":
        self.path.mkdir(parents=True, exist_ok=True)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        proc = self.cli(*self.mount_args(), timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"mounting node {self.name} failed ({proc.returncode}): {proc.stderr}{proc.stdout}")
        self.pid = int(self.status()["pid"])
        return self

    def status(self) -> dict[str, Any]:
        proc = self.cli("status", str(self.path), "--json", timeout=60)
        assert proc.returncode == 0, f"ckptfs status on node {self.name}: {proc.stderr}"
        return dict(json.loads(proc.stdout))

    def flush(self, rel: str = "", timeout: float = 300, level: str | None = None) -> subprocess.CompletedProcess[str]:
        args = ["flush", str(self.path / rel), "--timeout", str(timeout)] + (["--level", level] if level else [])
        return self.cli(*args, timeout=timeout + 60)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=60) as r:
            return str(r.read().decode())

    def metric(self, name: str, labels: str | None = None) -> float:
        """The sum of a metric's samples (those whose labels contain `labels`, if given); 0 if it has none."""
        total = 0.0
        for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", self.metrics_text(), re.M):
            if labels is None or labels in (m.group(1) or ""):
                total += float(m.group(2))
        return total

    def state(self, rel: str) -> str:
        return os.getxattr(self.path / rel, "user.ckptfs.state").decode()

    def record(self) -> dict[str, Any] | None:
        """This node's record in the bucket (`.ckptfs/nodes/<node>.json`; with peer_membership = etcd, in etcd under
        etcd_prefix + bucket), None while it has none."""
        if self.options.get("peer_membership") == "etcd":
            from tests.support.etcd import etcd_value

            key = f"{self.options.get('etcd_prefix', '/ckptfs/')}{self.bucket}/{self.key(NODES_PREFIX + f'{self.name}.json')}"
            value = etcd_value(str(self.options["etcd_endpoints"]).split(",")[0], key)
            return None if value is None else dict(json.loads(value))
        client = self.s3.client()
        try:
            body = client.get_object(Bucket=self.bucket, Key=self.key(NODES_PREFIX + f"{self.name}.json"))["Body"].read()
        except client.exceptions.NoSuchKey:
            return None
        return dict(json.loads(body))

    def peer_port(self) -> int:
        """The port this node's peer listener took (peer_addr port 0), as its record announces it."""
        rec = self.record()
        assert rec is not None, f"node {self.name} has no record in the bucket"
        return int(str(rec["peer_addr"]).rpartition(":")[2])

    def replica_files(self, owner: str | None = None) -> list[Path]:
        """The replica data files this node holds for others (CACHE_DIR/peers/<owner>/<ino>)."""
        root = self.cache_dir / "peers"
        if not root.is_dir():
            return []
        owners = [root / owner] if owner else [p for p in root.iterdir() if p.is_dir()]
        return sorted(f for d in owners if d.is_dir() for f in d.iterdir() if f.is_file())

    # ------------------------------------------------------------- losing it
    def kill(self, delete_cache: bool = True) -> None:
        """The node is lost: its daemon SIGKILLed, its mount torn down, its cache directory deleted (unless kept)."""
        assert self.pid
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_until(f"node {self.name}'s daemon to be gone", lambda: not process_alive(self.pid), 60)
        self.unmount_dead()
        if delete_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    def unmount_dead(self) -> None:
        if str(self.path) in open("/proc/self/mounts").read():
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], check=False, capture_output=True)
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)

    def pause(self) -> None:
        assert self.pid
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.pid
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.pid and process_alive(self.pid):
            try:
                os.kill(self.pid, signal.SIGCONT)  # a paused daemon cannot unmount
            except ProcessLookupError:
                pass
        if os.path.ismount(self.path):
            self.cli("unmount", str(self.path), timeout=120)
        self.unmount_dead()


def process_alive(pid: int | None) -> bool:
    """The process `pid` exists and is not a zombie (a daemon killed but not yet reaped counts as gone)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(what: str, check: Callable[[], Any], timeout: float = 300.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(interval)


class Cluster:
    """Nodes of one bucket, each with its own proxy to the S3 server; stop() unmounts all of them."""

    def __init__(self, s3: SeaweedServer, bucket: str, root: Path, prefix: str = "ckpt", secret: Path | None = None,
                 **common: Any) -> None:
        self.s3, self.bucket, self.root, self.prefix = s3, bucket, root, prefix
        self.secret = secret or write_secret(root / "peer.secret")
        self.common = {**PEER_DEFAULTS, "peer_secret_file": str(self.secret), **common}
        self.nodes: dict[str, Node] = {}
        self._proxies: list[FaultProxy] = []

    def node(self, name: str, start: bool = True, env: dict[str, str] | None = None, **options: Any) -> Node:
        """A node named `name` (its node_name, mount point and cache directory under the root); started unless told.
        `env`: more environment for its daemon (CKPTFS_TEST_FAULTS)."""
        proxy = FaultProxy(self.s3.s3_port)
        self._proxies.append(proxy)
        opts = {**self.common, "node_name": name, **options}
        n = Node(name, self.s3, self.bucket, self.prefix, self.root / f"{name}-mnt", self.root / f"{name}-cache", opts, proxy,
                 extra_env=dict(env or {}))
        self.nodes[name] = n
        if start:
            n.start()
        return n

    def restart(self, node: Node) -> Node:
        """The same node (name, cache directory as it was) mounted again after it was lost or stopped."""
        node.unmount_dead()
        return node.start()

    def wait_live(self, names: Iterable[str], timeout: float = 120) -> None:
        """Until every named node's record is in the bucket, live (each sees the others at its next read)."""
        names = list(names)
        for name in names:
            n = self.nodes[name]
            wait_until(f"node {name}'s record, live", lambda n=n: (n.record() or {}).get("state") == "live", timeout)
        # and each sees the others live (it reads the records every ttl/3): a node's first fsync then has its peers;
        # before that read it knows of none, and `degrade` acknowledges alone, as it must with no peer
        for name in names:
            others = {o for o in names if o != name}

            def sees(n: "Node" = self.nodes[name], others: set[str] = others) -> bool:
                st = n.status()
                live = {p["node"] for p in st.get("peers", []) if p.get("state") == "live"}
                return st.get("durability") != "peer" or others <= live

            wait_until(f"node {name} to see {sorted(others)} live", sees, timeout)

    def stop(self) -> None:
        for n in self.nodes.values():
            try:
                n.stop()
            except Exception as e:  # noqa: BLE001 - the others are still unmounted
                print(f"stopping node {n.name}: {e}")
        for p in self._proxies:
            p.close()

    # -------------------------------------------------------------- the bucket
    def object_sha256(self, key: str) -> str | None:
        client = self.s3.client()
        try:
            body = client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except client.exceptions.NoSuchKey:
            return None
        h = hashlib.sha256()
        for chunk in iter(lambda: body.read(8 << 20), b""):
            h.update(chunk)
        return h.hexdigest()

    def heads(self, keys: Iterable[str]) -> dict[str, tuple[str, Any]]:
        """ETag and LastModified of each key present."""
        client = self.s3.client()
        out = {}
        for k in keys:
            try:
                h = client.head_object(Bucket=self.bucket, Key=k)
            except client.exceptions.ClientError:
                continue
            out[k] = (h["ETag"], h["LastModified"])
        return out

    def writes(self) -> list[ForwardedWrite]:
        return sorted((w for p in self._proxies for w in p.writes), key=lambda w: w.started)


def completions(writes: Iterable[ForwardedWrite], bucket: str) -> dict[str, list[ForwardedWrite]]:
    """Per object key: the requests that made the object (a whole PutObject, a CompleteMultipartUpload)."""
    out: dict[str, list[ForwardedWrite]] = {}
    for w in writes:
        if w.completes_object and not w.copy and w.key.startswith(f"/{bucket}/"):
            out.setdefault(w.key[len(bucket) + 2:], []).append(w)
    return out


def body_bytes(writes: Iterable[ForwardedWrite], bucket: str) -> dict[str, int]:
    """Per object key: the object bytes sent for it (PutObject and UploadPart bodies; copies send none)."""
    out: dict[str, int] = {}
    for w in writes:
        if w.sends_object_bytes and w.key.startswith(f"/{bucket}/"):
            k = w.key[len(bucket) + 2:]
            out[k] = out.get(k, 0) + w.length
    return out


# ------------------------------------------------------------------ the writer
# A save as training code does one: per file, write a tmp name, fsync, rename; it says on stdout
# when each fsync and each rename returned (monotonic clock), so the trial knows what was acknowledged.
WRITER = r"""
import hashlib, json, os, random, sys, time
root, spec = sys.argv[1], json.loads(sys.argv[2])
def say(**kw):
    print(json.dumps(kw), flush=True)
for f in spec:
    rng = random.Random(f["seed"])
    tmp, final = os.path.join(root, f["name"] + ".tmp"), os.path.join(root, f["name"])
    os.makedirs(os.path.dirname(final), exist_ok=True)
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            left = f["size"]
            while left:
                data = rng.randbytes(min(4 << 20, left))
                out.write(data)
                h.update(data)
                left -= len(data)
            out.flush()
            os.fsync(out.fileno())
            say(event="fsync", name=f["name"], sha256=h.hexdigest(), size=f["size"], at=time.monotonic())
        os.rename(tmp, final)
        say(event="rename", name=f["name"], at=time.monotonic())
    except OSError as e:
        say(event="error", name=f["name"], error=str(e), at=time.monotonic())
        sys.exit(3)
say(event="saved", at=time.monotonic())
"""


@dataclass
class Acknowledged:
    name: str
    sha256: str
    size: int
    fsynced_at: float
    renamed_at: float | None = None


@dataclass
class TrialResult:
    """What one node-loss trial found (plain values: the benchmark stores it as JSON)."""

    acknowledged: int  # files whose fsync returned before the loss (the owner's daemon gone)
    acknowledged_bytes: int
    undrained_bytes: int  # of those, not in the bucket when the node was lost: > 0 needs a takeover
    lost: list[str]  # acknowledged files in the bucket under neither name, or with other bytes
    misnamed: list[str]  # its rename returned before the loss, but in the bucket under the tmp name only
    under_tmp_name: list[str]  # its rename had not returned when the node was lost: in the bucket under the tmp name
    durable_s: float | None  # from the loss until every acknowledged file was in the bucket
    taken_over_by: list[str]  # survivors whose ckptfs_peer_takeovers_total went up
    completed_twice: dict[str, int]  # object key -> times its object was made beyond the first
    twice_bytes: int  # bytes of those extra completions
    killed_after_first_fsync_s: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def file_spec(count: int, size: int, seed: int = 0, directory: str = "run/step_1") -> list[dict[str, Any]]:
    return [{"name": f"{directory}/shard_{i}.bin", "size": size + i, "seed": seed * 1000 + i} for i in range(count)]


def node_loss_trial(cluster: Cluster, owner: Node, survivors: list[Node], spec: list[dict[str, Any]],
                    kill_after: float | None = None, delete_cache: bool = True, timeout: float = 240.0,
                    after_save: Callable[[], None] | None = None) -> TrialResult:
    """Save `spec` on `owner` and lose the owner: `kill_after` seconds after the first fsync returned (a random
    instant, while the save may still run), or None: right after the save returned (and `after_save` ran).
    Then wait until every acknowledged file is in the bucket (sha256) and report."""
    takeovers_before = {n.name: n.metric("ckptfs_peer_takeovers_total") for n in survivors}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(owner.path), json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    acked: dict[str, Acknowledged] = {}
    lock = threading.Lock()
    first_fsync = threading.Event()
    saved = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with lock:
                if ev["event"] == "fsync":
                    acked[ev["name"]] = Acknowledged(ev["name"], ev["sha256"], ev["size"], ev["at"])
                    first_fsync.set()
                elif ev["event"] == "rename" and ev["name"] in acked:
                    acked[ev["name"]].renamed_at = ev["at"]
                elif ev["event"] == "saved":
                    saved.set()
        first_fsync.set()  # the writer ended (or died) without one: do not wait forever

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if kill_after is None:
            if not saved.wait(timeout):
                raise AssertionError(f"the save on node {owner.name} did not return within {timeout:.0f}s")
            if after_save:
                after_save()
        else:
            if not first_fsync.wait(timeout):
                raise AssertionError(f"no fsync returned on node {owner.name} within {timeout:.0f}s")
            time.sleep(kill_after)
        kill_started = time.monotonic()
        assert owner.pid
        os.kill(owner.pid, signal.SIGKILL)
        wait_until(f"node {owner.name}'s daemon to be gone", lambda: not process_alive(owner.pid), 60)
        # the writer's next call on the dead mount fails: it ends before the mount is detached (after that, its
        # calls would reach the directory under the mount point, and an fsync there "succeed")
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        # taken once the daemon is gone: an fsync that returned while the kill was under way was acknowledged too,
        # and is checked like the others (taken before the kill, it was counted as never acknowledged)
        lost_at = time.monotonic()
        owner.kill(delete_cache=delete_cache)  # the daemon is dead already: the mount detached, the cache deleted
    finally:
        try:
            proc.wait(timeout=60)  # its next request on the dead mount fails
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=30)
    with lock:
        files = [a for a in acked.values() if a.fsynced_at <= lost_at]
    first = min((a.fsynced_at for a in files), default=lost_at)
    keys = {a.name: (cluster.prefix + "/" + a.name if cluster.prefix else a.name) for a in files}
    present = cluster.heads(keys.values()) | cluster.heads(k + ".tmp" for k in keys.values())
    undrained = sum(a.size for a in files if keys[a.name] not in present and keys[a.name] + ".tmp" not in present)

    def rename_confirmed(a: Acknowledged) -> bool:
        """Under durability = peer a rename survives the node's loss once it returned: the peers held the new name
        (docs/semantics.md, issue 42)."""
        return a.renamed_at is not None and a.renamed_at <= lost_at

    def where(a: Acknowledged) -> str | None:
        k = keys[a.name]
        if cluster.object_sha256(k) == a.sha256:
            return "final"
        if cluster.object_sha256(k + ".tmp") == a.sha256:
            return "misnamed" if rename_confirmed(a) else "tmp"
        return None

    durable_at: float | None = None
    deadline = time.monotonic() + timeout
    found: dict[str, str | None] = {}
    while True:
        found = {a.name: where(a) for a in files}
        if all(v in ("final", "tmp") for v in found.values()):
            durable_at = time.monotonic()
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    def takers_now() -> list[str]:
        return [n.name for n in survivors if n.metric("ckptfs_peer_takeovers_total") > takeovers_before[n.name]]

    takers = takers_now()
    if undrained and durable_at is not None and not takers:
        # bytes the bucket lacked at the loss reached it: someone took the owner over, and counts it once its record
        # says done, just after the uploads the loop above saw; wait for that count (the test asserts on it)
        end = time.monotonic() + 60
        while not takers and time.monotonic() < end:
            time.sleep(0.2)
            takers = takers_now()
    made = completions(cluster.writes(), cluster.bucket)
    twice = {k: len(v) - 1 for k, v in made.items() if len(v) > 1 and k.removesuffix(".tmp") in {*keys.values()}}
    sizes = {keys[a.name]: a.size for a in files} | {keys[a.name] + ".tmp": a.size for a in files}
    return TrialResult(
        acknowledged=len(files), acknowledged_bytes=sum(a.size for a in files), undrained_bytes=undrained,
        lost=sorted(n for n, v in found.items() if v is None), misnamed=sorted(n for n, v in found.items() if v == "misnamed"),
        under_tmp_name=sorted(n for n, v in found.items() if v == "tmp"),
        durable_s=None if durable_at is None else durable_at - lost_at, taken_over_by=takers,
        completed_twice=twice, twice_bytes=sum(sizes.get(k, 0) * n for k, n in twice.items()),
        killed_after_first_fsync_s=kill_started - first)


def random_instant(rng: random.Random, spread: float) -> float:
    """A random moment within `spread` seconds after the first fsync returned."""
    return rng.uniform(0.0, spread)
