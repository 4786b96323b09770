"""Peer durability on real daemons: two mounts of one bucket, nodes a and b (own cache directories), over a real
SeaweedFS. A's fsync and close return only once b holds the bytes; the replica goes once the file is durable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import xxhash

from tests.conftest import wait_for

STATE = "user.ckptfs.state"


def peer_options(tmp_path: Path, node: str, **extra: Any) -> dict[str, Any]:
    secret = tmp_path / "peer-secret"
    if not secret.exists():
        secret.write_bytes(os.urandom(48))
        secret.chmod(0o600)
    return {"node_name": node, "durability": "peer", "peer_addr": "127.0.0.1:0", "peer_secret_file": str(secret),
            "peer_timeout": 30, **extra}


def replica_files(cache_dir: Path, owner: str) -> list[Path]:
    d = cache_dir / "peers" / owner
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def xxh3_of(path: Path) -> str:
    return xxhash.xxh3_128_hexdigest(path.read_bytes())


def test_fsync_returns_once_the_peer_holds_the_bytes_and_the_replica_goes_once_durable(make_mount: Any, tmp_path: Path) -> None:
    b = make_mount("b", **peer_options(tmp_path, "b"))
    # a: fail rather than degrade, so an fsync that returns has a peer copy; a long upload_delay keeps the file
    # dirty until the flush below asks for it
    a = make_mount("a", **peer_options(tmp_path, "a", on_no_peer="fail", upload_delay=3600))
    data = os.urandom(24 << 20) + b"tail"
    path = a.path / "step_5" / "model.pt"
    path.parent.mkdir()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for off in range(0, len(data), 1 << 20):
            os.write(fd, data[off:off + (1 << 20)])
        os.fsync(fd)
        # fsync returned: b holds the whole file already, byte for byte
        held = replica_files(b.cache_dir, "a")
        assert len(held) == 1, held
        assert xxh3_of(held[0]) == xxhash.xxh3_128_hexdigest(data)
        assert os.getxattr(path, STATE) == b"replicated"
        os.write(fd, b"more")  # a new version: single-copy again until the close's flush
        assert os.getxattr(path, STATE) == b"dirty"
    finally:
        os.close(fd)
    # close(2) returned: the FLUSH waited for the new tail too
    assert xxh3_of(replica_files(b.cache_dir, "a")[0]) == xxhash.xxh3_128_hexdigest(data + b"more")
    assert os.getxattr(path, STATE) == b"replicated"
    a.flush()
    assert a.object_sha256("step_5/model.pt") == __import__("hashlib").sha256(data + b"more").hexdigest()
    assert os.getxattr(path, STATE) == b"durable"
    wait_for("b to drop a's replica once the file is durable", lambda: not replica_files(b.cache_dir, "a"), timeout=120)


def test_a_close_without_fsync_waits_for_the_peer(make_mount: Any, tmp_path: Path) -> None:
    b = make_mount("b", **peer_options(tmp_path, "b"))
    a = make_mount("a", **peer_options(tmp_path, "a", on_no_peer="fail", upload_delay=3600))
    data = os.urandom(5 << 20)
    (a.path / "weights.safetensors").write_bytes(data)  # write and close, as torch.save and safetensors do
    held = replica_files(b.cache_dir, "a")
    assert len(held) == 1 and xxh3_of(held[0]) == xxhash.xxh3_128_hexdigest(data)
    assert os.getxattr(a.path / "weights.safetensors", STATE) == b"replicated"


def test_no_peer_fail_answers_eio_and_degrade_acknowledges_and_says_so(make_mount: Any, tmp_path: Path) -> None:
    import errno

    import pytest

    # one node alone: no peer to hold a copy
    strict = make_mount("a", **peer_options(tmp_path, "a", on_no_peer="fail", upload_delay=3600))
    fd = os.open(strict.path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"alone")
        with pytest.raises(OSError) as e:
            os.fsync(fd)
        assert e.value.errno == errno.EIO
    finally:
        with pytest.raises(OSError):  # the close's FLUSH: EIO too
            os.close(fd)
    lenient = make_mount("c", prefix="other", **peer_options(tmp_path, "c", upload_delay=3600))
    with open(lenient.path / "g", "wb") as f:
        f.write(b"alone")
        f.flush()
        os.fsync(f.fileno())  # acknowledged on the local disk alone
    assert os.getxattr(lenient.path / "g", STATE) == b"dirty"
    log = (lenient.cache_dir / "ckptfs.log").read_text()
    assert "g: acknowledged with 0 of 1 peer copies" in log and log.count("single-copy on this node") == 1  # once per file


def test_a_node_lost_after_its_save_returned_is_finished_by_its_peer(make_mount: Any, tmp_path: Path) -> None:
    import hashlib
    import shutil
    import signal
    import subprocess

    b = make_mount("b", **peer_options(tmp_path, "b", peer_lease_ttl=3))
    a = make_mount("a", **peer_options(tmp_path, "a", on_no_peer="fail", upload_delay=3600, peer_lease_ttl=3))
    step = a.path / "step_9"
    step.mkdir()
    shards = {f"shard{i}.pt": os.urandom((3 << 20) + i) for i in range(3)}
    for name, body in shards.items():  # the torch.save way: written, closed (no fsync), renamed
        (step / f"{name}.tmp").write_bytes(body)
        os.rename(step / f"{name}.tmp", step / name)
    (step / ".metadata").write_bytes(b"meta")  # the commit marker, last
    # the save returned; the node is lost for good: daemon killed, cache disk gone
    os.kill(a.status()["pid"], signal.SIGKILL)
    shutil.rmtree(a.cache_dir)
    subprocess.run(["fusermount3", "-u", "-z", str(a.path)], check=False, capture_output=True)
    expected = {**{f"step_9/{n}": hashlib.sha256(body).hexdigest() for n, body in shards.items()},
                "step_9/.metadata": hashlib.sha256(b"meta").hexdigest()}

    def in_bucket() -> bool:
        keys = set(a.keys())
        return all(a.key(rel) in keys for rel in expected)

    wait_for("b to take a over and upload its files", in_bucket, timeout=180)
    assert {rel: a.object_sha256(rel) for rel in expected} == expected
    assert not [k for k in a.keys() if k.endswith(".tmp")]  # renamed before the loss: only the final names
    assert b.status()["pid"]  # b serves on
