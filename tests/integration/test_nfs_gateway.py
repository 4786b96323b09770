"""Gateway mode: a ckptfs mount exported over NFSv3 by NFS-Ganesha (VFS FSAL), used through the libnfs client.

A file written over NFS reads back byte-identical over NFS and on the mount, and drains to the
bucket by itself (no `ckptfs flush`): Ganesha closes idle files (MDCACHE settings of the shipped
config), which is the last close ckptfs waits for.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.conftest import NFS_GROUP, Mount, sha256_file, write_random, wait_for
from tests.integration.test_core import xattr
from tests.support.ganesha import GaneshaServer, missing_tools

pytestmark = NFS_GROUP  # one Ganesha at a time on this host (tests/conftest.py)

MiB = 1 << 20


@pytest.fixture
def ganesha_for(tmp_path: Path):  # type: ignore[no-untyped-def]
    missing = missing_tools()
    if missing:
        pytest.skip(f"NFS gateway tools missing: {', '.join(missing)} (Debian: nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils)")
    servers: list[GaneshaServer] = []

    def start(export: Path) -> GaneshaServer:
        workdir = tmp_path / "ganesha"
        workdir.mkdir()
        server = GaneshaServer(workdir, export)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


def nfs(*args: str) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(list(args), capture_output=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(args)}: {proc.stderr.decode(errors='replace')}{proc.stdout[-500:]!r}"
    return proc


def test_write_read_and_drain_through_nfs(make_mount, ganesha_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(allow_other="true", upload_delay=0.2)
    (m.path / "step_7").mkdir()
    server = ganesha_for(m.path)

    src = tmp_path / "shard.bin"
    digest = write_random(src, 20 * MiB + 123, seed=110)  # above multipart_threshold: a multipart upload
    nfs("nfs-cp", str(src), server.url("step_7/shard.bin"))
    assert b"shard.bin" in nfs("nfs-ls", server.url("step_7")).stdout

    # read back over NFS, byte-identical
    back = nfs("nfs-cat", server.url("step_7/shard.bin")).stdout
    assert hashlib.sha256(back).hexdigest() == digest
    # the same bytes are on the ckptfs mount
    assert sha256_file(m.path / "step_7" / "shard.bin") == digest

    # Ganesha closes the idle file, so it drains without a flush
    wait_for("the NFS-written file becomes durable", lambda: xattr(m.path / "step_7" / "shard.bin", "state") == "durable")
    assert m.object_sha256("step_7/shard.bin") == digest
    assert m.key("step_7/shard.bin") in m.keys()
