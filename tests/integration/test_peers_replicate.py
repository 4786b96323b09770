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
