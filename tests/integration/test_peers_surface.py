"""What a user sees of peer durability on real daemons (issue 36 items 3 and 6): two mounts of one bucket as nodes
a and b over a real SeaweedFS. `ckptfs status` lists the peer and its state, `flush --level replicated` and
`wait_durable(level="replicated")` return once b holds a's files, a checkpoint directory says `replicated`, the
metrics show the peer up and nothing single-copy; b unmounted shows as left (a node lost shows as down:
test_peers_operator.py). The durability = local side is in
test_metrics.py."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Mount, wait_for, write_random
from tests.support.seaweed import free_port

MiB = 1 << 20
STATE = "user.ckptfs.state"


def peer_options(tmp_path: Path, node: str, **extra: Any) -> dict[str, Any]:
    secret = tmp_path / "peer-secret"
    if not secret.exists():
        secret.write_bytes(os.urandom(48))
        secret.chmod(0o600)
    return {"node_name": node, "durability": "peer", "peer_secret_file": str(secret), "peer_timeout": 30, "peer_lease_ttl": 6,
            **extra}


def metric(port: int, name: str, **labels: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def peer_state(m: Mount, node: str) -> str | None:
    return next((p["state"] for p in m.status()["peers"] if p["node"] == node), None)


def test_status_flush_level_replicated_checkpoint_state_and_metrics_with_a_peer(make_mount: Any, tmp_path: Path) -> None:
    import ckptfs

    port_b = free_port()
    b = make_mount("b", **peer_options(tmp_path, "b", peer_addr=f"127.0.0.1:{port_b}"))
    a: Mount = make_mount("a", start=False, **peer_options(tmp_path, "a", peer_addr="127.0.0.1:0", peers=f"b=127.0.0.1:{port_b}",
                                                               on_no_peer="fail", upload_delay=3600))
    a.metrics_port = free_port()
    a.start()
    wait_for("a to see b live", lambda: peer_state(a, "b") == "live", timeout=120)
    st = a.status()
    assert st["durability"] == "peer" and st["node"] == "a" and st["peer_state"] == "live"
    assert [(p["node"], p["addr"], p["state"]) for p in st["peers"]] == [("b", f"127.0.0.1:{port_b}", "live")]

    (a.path / "step_5").mkdir()
    write_random(a.path / "step_5" / "model.pt", 6 * MiB, seed=36)  # write, fsync, close: on b's disk when it returns
    write_random(a.path / "step_5" / "optim.pt", 2 * MiB, seed=37, fsync=False)  # close only: its FLUSH waited for b
    flushed = a.cli("flush", "--level", "replicated", str(a.path / "step_5"), "--timeout", "120", timeout=180)
    assert flushed.returncode == 0, flushed.stderr
    assert flushed.stdout.splitlines()[-1] == f"ckptfs: {a.path / 'step_5'} is replicated"
    ckptfs.wait_durable(a.path / "step_5", timeout=120, level="replicated")
    assert os.getxattr(a.path / "step_5" / "model.pt", STATE) == b"replicated"
    assert os.getxattr(a.path / "step_5", STATE) == b"replicated"  # the checkpoint: every file on b's disk, none in the bucket
    assert ckptfs.state(a.path / "step_5") == "replicated"
    st = a.status()
    assert st["single_copy_bytes"] == 0 and st["dirty_bytes"] == 8 * MiB  # dirty, yet on two nodes
    assert metric(a.metrics_port, "ckptfs_single_copy_bytes") == 0
    assert metric(a.metrics_port, "ckptfs_peer_up", peer="b") == 1
    assert (metric(a.metrics_port, "ckptfs_peer_replicated_bytes_total") or 0) >= 8 * MiB
    # issue 43: the table said `replicated │ 0 files │ 0 B` (the bucket's listing) and the status `2 dirty files`
    listed = a.cli("checkpoints", str(a.path), "--json", timeout=60)
    assert listed.returncode == 0, listed.stderr
    step = next(c for c in json.loads(listed.stdout) if c["path"] == "step_5")
    assert (step["state"], step["files"], step["bytes"]) == ("replicated", 2, 8 * MiB), step
    screen = a.cli("status", str(a.path), timeout=30).stdout
    assert "8.0 MiB of it replicated on peers" in screen, screen

    a.flush()  # level durable: in the bucket now
    assert os.getxattr(a.path / "step_5" / "model.pt", STATE) == b"durable"
    wait_for("the checkpoint to leave replicated", lambda: os.getxattr(a.path / "step_5", STATE) != b"replicated", timeout=120)

    b.stop()  # a clean unmount with nothing undrained: b leaves the cluster, a lists it as left (issue 43)
    wait_for("a to see b left", lambda: peer_state(a, "b") == "left", timeout=120)
    assert metric(a.metrics_port, "ckptfs_peer_up", peer="b") is None  # gone, not down: no alert fires on it
    screen = a.cli("status", str(a.path), timeout=30).stdout
    assert "b left" in screen and "a live" in screen, screen


def test_a_busy_peer_addr_is_one_line_and_leaves_the_cache_directory_as_found(make_mount: Any, tmp_path: Path) -> None:
    """Issue 43, a new user's first mount: the sentence that names the fix was the last line of a 75-line
    ExceptionGroup in the log, behind `the daemon exited during start-up`, and the cache directory kept the journal
    and the replica index the failed start made."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        m: Mount = make_mount("a", start=False, **peer_options(tmp_path, "a", peer_addr=f"127.0.0.1:{busy.getsockname()[1]}"))
        before = sorted(os.listdir(m.cache_dir))
        failed = m.cli(*m.mount_args())
    assert failed.returncode != 0 and "Traceback" not in failed.stderr and "+-" not in failed.stderr, failed.stderr
    errors = [line for line in failed.stderr.splitlines() if not line.startswith("ckptfs: warning: ")]  # the safe-default one
    assert len(errors) == 1 and "peer_addr = 127.0.0.1:" in errors[0], failed.stderr
    assert "cannot be listened on" in failed.stderr and "give a free port" in failed.stderr
    assert not os.path.ismount(m.path)
    assert sorted(n for n in os.listdir(m.cache_dir) if n != "ckptfs.log") == [n for n in before if n != "ckptfs.log"]

