"""Gateway mode with the Linux kernel's NFSv4.1 client: ckptfs, NFS-Ganesha (the shipped config) and
kernel NFS mounts on this machine's loopback, as training nodes mount a gateway.

What the kernel client brings that libnfs does not: its write-back page cache (unstable WRITEs, then
COMMIT), close-to-open consistency between mounts, OPEN/CLOSE state, and hard mounts that ride out
a server restart. A machine whose kernel has no NFS client skips these; `make test-vm SELECTION=nfs`
runs them in the Linux 6.1 guest, whose init loads sunrpc, nfs and nfsv4.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import xxhash

from tests.conftest import NFS_GROUP, Mount, mount_is_dead, sha256_file, wait_for, write_random
from tests.integration.test_core import xattr
from tests.integration.test_lifecycle import catalogue, dcp_save, manifest
from tests.support.ganesha import GaneshaServer, missing_tools

MiB = 1 << 20


def kernel_nfs_client() -> str | None:
    """Why the kernel NFS client cannot be used here, or None."""
    if "nfs4" not in Path("/proc/filesystems").read_text().split():
        return "no kernel NFS client here (nfs4 not in /proc/filesystems): make test-vm SELECTION=nfs runs these in the Linux 6.1 guest"
    if shutil.which("mount.nfs4") is None and not os.path.exists("/sbin/mount.nfs4"):
        return "no mount.nfs4 (apt-get install nfs-common)"
    if os.geteuid() != 0:
        return "NFS mounts need root"
    return None


# NFS_GROUP: one Ganesha at a time on this host (tests/conftest.py)
pytestmark = [pytest.mark.skipif(kernel_nfs_client() is not None, reason=kernel_nfs_client() or ""), NFS_GROUP]

# one client process: a shard written to a tmp name, fsynced, renamed into place (as torch.save
# wrappers and DCP's .metadata do); its bytes follow from the seed
SHARD = """
import os, random, sys
directory, name, size, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = random.Random(seed).randbytes(size)
tmp = os.path.join(directory, name + ".tmp")
with open(tmp, "wb") as f:
    for off in range(0, size, 1 << 20):
        f.write(data[off:off + (1 << 20)])
    f.flush()
    os.fsync(f.fileno())
os.rename(tmp, os.path.join(directory, name))
"""

# a client that writes one file in 1 MiB chunks with an fsync every `every` MiB, and after each
# fsync returns notes in `progress` (a local file) how many bytes it was told are committed. Half
# way it writes 2 MiB more without an fsync, touches `ready` and waits for `go`: the test restarts
# the gateway there, with those writes sent unstable (or still in the page cache) and the next
# fsync about to be called.
STREAM = """
import os, random, sys, time
path, size, every, progress, ready, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
data = random.Random(7).randbytes(size)
with open(path, "wb") as f, open(progress, "a") as note:
    for i, off in enumerate(range(0, size, 1 << 20), 1):
        f.write(data[off:off + (1 << 20)])
        if i == size // 2 // (1 << 20) + 2:
            open(ready, "w").close()
            while not os.path.exists(go):
                time.sleep(0.05)
        if i % every == 0 or off + (1 << 20) >= size:
            f.flush()
            os.fsync(f.fileno())
            note.write(f"{min(off + (1 << 20), size)}\\n"); note.flush()
print("closed")
"""


def seeded(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


class Gateway:
    """A ckptfs mount exported by Ganesha, and kernel NFSv4.1 mounts of it (hard, as the docs say)."""

    def __init__(self, mount: Mount, server: GaneshaServer, tmp_path: Path) -> None:
        self.mount = mount
        self.server = server
        self.tmp_path = tmp_path
        self.clients: list[Path] = []

    def client(self, name: str) -> Path:
        """A new client mount. `nosharecache`: its own superblock and page cache, as on another node."""
        target = self.tmp_path / f"nfs-{name}"
        target.mkdir()
        opts = f"vers=4.1,hard,proto=tcp,port={self.server.nfs_port}" + (",nosharecache" if self.clients else "")
        proc = subprocess.run(["mount", "-t", "nfs4", "-o", opts, "127.0.0.1:/ckpt", str(target)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"mount -t nfs4 -o {opts}: {proc.stderr}{proc.stdout}"
        self.clients.append(target)
        return target

    def unmount(self, target: Path) -> None:
        subprocess.run(["umount", str(target)], capture_output=True, timeout=300)
        self.clients.remove(target)

    def durable(self, rel: str) -> bool:
        return xattr(self.mount.path / rel, "state") == "durable"


@pytest.fixture
def gateway(make_mount: Any, tmp_path: Path) -> Iterator[Any]:
    missing = missing_tools()
    if missing:
        pytest.skip(f"NFS gateway tools missing: {', '.join(missing)} (Debian: nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils)")
    gateways: list[Gateway] = []

    def start(**options: Any) -> Gateway:
        m: Mount = make_mount(allow_other="true", **options)
        workdir = tmp_path / "ganesha"
        workdir.mkdir()
        server = GaneshaServer(workdir, m.path)
        server.start(limit=300)
        gw = Gateway(m, server, tmp_path)
        gateways.append(gw)
        return gw

    yield start
    for gw in gateways:
        for target in list(gw.clients):
            # a hard mount whose server is gone would wait for it: force, then detach
            subprocess.run(["umount", "-f", "-l", str(target)], capture_output=True, timeout=300)
        gw.server.stop()


def run_all(procs: list[subprocess.Popen[bytes]], timeout: float = 600) -> None:
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err.decode(errors="replace")


def test_nfs_shards_from_two_clients_tmp_fsync_rename_and_close_to_open(gateway: Any) -> None:
    gw: Gateway = gateway()
    a, b = gw.client("a"), gw.client("b")
    (a / "step_1").mkdir()
    shards = {"shard_0.pt": (4 * MiB + 11, 1), "shard_1.pt": (3 * MiB + 5, 2)}
    # one process per client mount, at the same time, as two ranks on two nodes
    run_all([subprocess.Popen([sys.executable, "-c", SHARD, str(client / "step_1"), name, str(size), str(seed)], stderr=subprocess.PIPE)
             for client, (name, (size, seed)) in zip((a, b), shards.items())])
    digests = {name: hashlib.sha256(seeded(size, seed)).hexdigest() for name, (size, seed) in shards.items()}

    # close-to-open: each mount sees the other's file, at its size and with its bytes, once closed
    for client in (a, b):
        assert sorted(os.listdir(client / "step_1")) == sorted(shards)  # no .tmp left behind
        for name, (size, _) in shards.items():
            assert os.stat(client / "step_1" / name).st_size == size
            assert sha256_file(client / "step_1" / name) == digests[name]
    # they drain without a flush (NFSv4 CLOSE is the last close ckptfs waits for), byte-identical
    for name in shards:
        wait_for(f"step_1/{name} durable", lambda: gw.durable(f"step_1/{name}"))
        assert gw.mount.object_sha256(f"step_1/{name}") == digests[name]
    assert not [k for k in gw.mount.keys() if k.endswith(".tmp")]


def test_nfs_rename_of_a_step_directory_and_delete(gateway: Any) -> None:
    gw: Gateway = gateway()
    a = gw.client("a")
    # not a *.tmp name: ckptfs holds files under temporary names back; these drain, then the
    # whole directory is renamed with its files already in the bucket
    (a / "incoming_2").mkdir()
    digests = {name: write_random(a / "incoming_2" / name, size, seed=seed)
               for name, size, seed in (("model.pt", 5 * MiB + 1, 3), ("optim.pt", 2 * MiB + 7, 4))}
    scratch = write_random(a / "scratch.bin", MiB, seed=5)
    for name in digests:
        wait_for(f"incoming_2/{name} durable", lambda: gw.durable(f"incoming_2/{name}"))
    wait_for("scratch.bin durable", lambda: gw.durable("scratch.bin"))
    assert gw.mount.object_sha256("scratch.bin") == scratch

    os.rename(a / "incoming_2", a / "step_2")  # the whole step, as a job publishes it
    os.remove(a / "scratch.bin")

    def bucket_settled() -> bool:
        keys = gw.mount.keys()
        return (sorted(k for k in keys if "_2/" in k) == sorted(gw.mount.key(f"step_2/{n}") for n in digests)
                and gw.mount.key("scratch.bin") not in keys)
    wait_for("the bucket to hold step_2 only, and no scratch.bin", bucket_settled)
    for name, digest in digests.items():
        assert gw.mount.object_sha256(f"step_2/{name}") == digest
    # a second client sees the new names only
    b = gw.client("b")
    assert sorted(os.listdir(b)) == ["step_2"]
    assert sorted(os.listdir(b / "step_2")) == sorted(digests)
    assert sha256_file(b / "step_2" / "model.pt") == digests["model.pt"]


def test_nfs_cold_read_through_a_fresh_client_after_evict(gateway: Any) -> None:
    gw: Gateway = gateway()
    a = gw.client("a")
    size = 6 * MiB + 3
    digest = write_random(a / "weights.pt", size, seed=6)
    wait_for("weights.pt durable", lambda: gw.durable("weights.pt"))
    gw.unmount(a)

    def evicted() -> bool:  # Ganesha may still hold the file open for a moment (an open file is kept)
        proc = gw.mount.cli("evict", str(gw.mount.path / "weights.pt"))
        assert proc.returncode == 0, proc.stderr
        return "evicted 1 file" in proc.stdout
    wait_for("ckptfs to evict its copy of weights.pt", evicted)
    fetched = gw.mount.status()["fetched_bytes_total"]

    fresh = gw.client("fresh")
    assert sha256_file(fresh / "weights.pt") == digest
    assert gw.mount.status()["fetched_bytes_total"] - fetched >= size  # read from the bucket, not a local copy


def test_nfs_dcp_layout_of_two_ranks_is_committed(gateway: Any) -> None:
    gw: Gateway = gateway(checkpoint_quiet_seconds=1)
    a = gw.client("a")
    files = dcp_save(a / "run1" / "step_100", ranks=2)
    m = gw.mount
    wait_for("run1/step_100 committed", lambda: catalogue(m).get("run1/step_100", {}).get("state") == "committed")
    doc = manifest(m, "run1/step_100")
    assert doc["step"] == 100 and sorted(f["path"] for f in doc["files"]) == sorted(files)
    for f in doc["files"]:
        assert f["size"] == len(files[f["path"]])
        assert f["xxh3"] == xxhash.xxh3_128(files[f["path"]]).hexdigest()
        assert m.object_sha256(f"run1/step_100/{f['path']}") == hashlib.sha256(files[f["path"]]).hexdigest()


def test_nfs_gateway_restart_while_a_client_writes_loses_nothing(gateway: Any, tmp_path: Path) -> None:
    """kill -9 of the daemon in the middle of a client's writes and fsyncs, then ckptfs and Ganesha
    started again (systemd's Restart=, and PartOf= for Ganesha): the hard-mounted client's calls all
    complete (unstable writes re-sent on the new write verifier, opens reclaimed in the grace period)."""
    gw: Gateway = gateway()
    a = gw.client("a")
    size, every = 24 * MiB + 17, 4
    progress, ready, go = tmp_path / "progress", tmp_path / "ready", tmp_path / "go"
    progress.touch()
    writer = subprocess.Popen([sys.executable, "-c", STREAM, str(a / "stream.bin"), str(size), str(every), str(progress), str(ready), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def committed() -> int:
        lines = progress.read_text().split()
        return int(lines[-1]) if lines else 0
    wait_for("the client to be half way", lambda: ready.exists() or writer.poll() is not None)
    assert writer.poll() is None, f"the writer failed before the restart: {writer.communicate()[1].decode(errors='replace')}"
    os.kill(gw.mount.status()["pid"], signal.SIGKILL)
    gw.server.kill()
    go.touch()  # the client goes on writing and fsyncs while the gateway is down
    told_before_restart = committed()
    wait_for("the mount to be dead", lambda: mount_is_dead(gw.mount.path))
    gw.mount.start()  # replays the journal
    gw.server.start(limit=300)  # the same recovery directory: the client may reclaim

    out, err = writer.communicate(timeout=900)
    assert writer.returncode == 0 and out.strip() == b"closed", f"a client call failed: {err.decode(errors='replace')}"
    assert told_before_restart < size and committed() == size
    data = seeded(size, 7)
    wait_for("stream.bin durable", lambda: gw.durable("stream.bin"))
    assert gw.mount.object_sha256("stream.bin") == hashlib.sha256(data).hexdigest()
    assert sha256_file(a / "stream.bin") == hashlib.sha256(data).hexdigest()
