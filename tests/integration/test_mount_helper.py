"""`mount` from an fstab line: mount(8) -> /sbin/mount.fuse (fuse3) -> `ckptfs SOURCE DIR -o OPTIONS`.

mount(8) runs its helpers with no PATH, so the shell finds `ckptfs` in the default path
(/usr/local/bin, where `make install` links it). To run this checkout's code without
installing anything, the test works in a private mount namespace (unshare -m) where a
directory holding a `ckptfs` wrapper is bind-mounted over /usr/local/bin; the FUSE mount
is made and removed inside that namespace with the real mount(8) and umount(8).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, fuse_usable, write_random, wait_for

MiB = 1 << 20

SCRIPT = """
set -eu
mount --bind "$WRAPPER_DIR" /usr/local/bin
mount -T "$FSTAB" "$MNT"
findmnt -n -o FSTYPE "$MNT"
cp "$SRC" "$MNT/step_1.bin"
ckptfs flush "$MNT" --timeout 120
sha256sum "$MNT/step_1.bin"
umount "$MNT"
"""


def namespaces_usable() -> bool:
    if shutil.which("unshare") is None or not os.path.exists("/sbin/mount.fuse"):
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not namespaces_usable(), reason="needs unshare -m (root) and fuse3's /sbin/mount.fuse")
@pytest.mark.parametrize("form", ["fuse.ckptfs", "ckptfs#"])
def test_fstab_line_mounts_with_mount8(s3, bucket: str, tmp_path: Path, form: str, fuse_transport: str | None) -> None:  # type: ignore[no-untyped-def]
    if not fuse_usable():
        pytest.skip("/dev/fuse is not usable here")
    mnt, cache, wrappers = tmp_path / "mnt", tmp_path / "cache", tmp_path / "bin"
    for d in (mnt, cache, wrappers):
        d.mkdir()
    wrapper = wrappers / "ckptfs"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m ckptfs.cli "$@"\n')
    wrapper.chmod(0o755)
    src = tmp_path / "step_1.bin"
    digest = write_random(src, 6 * MiB, seed=80)
    options = f"cache_dir={cache},endpoint_url={s3.endpoint_url},upload_delay=0.2,_netdev,nofail,noatime,x-systemd.requires=network-online.target"
    if fuse_transport:  # once per FUSE transport (tests/conftest.py)
        options += f",fuse_transport={fuse_transport}"
    if form == "fuse.ckptfs":
        line = f"s3://{bucket}/fstab {mnt} fuse.ckptfs {options} 0 0\n"
    else:
        line = f"ckptfs#s3://{bucket}/fstab {mnt} fuse {options} 0 0\n"
    fstab = tmp_path / "fstab"
    fstab.write_text(line)
    env = {**os.environ, **s3.env(), "WRAPPER_DIR": str(wrappers), "FSTAB": str(fstab), "MNT": str(mnt), "SRC": str(src)}
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", SCRIPT],
                          capture_output=True, text=True, env=env, timeout=300)
    log = (cache / "ckptfs.log").read_text() if (cache / "ckptfs.log").exists() else ""
    assert proc.returncode == 0, proc.stderr + proc.stdout + log
    lines = proc.stdout.splitlines()
    assert "fuse.ckptfs" in lines  # findmnt: the mount's type
    assert f"{digest}  {mnt}/step_1.bin" in lines
    # the bytes reached the bucket, and umount(8) stopped the daemon
    body = s3.client().get_object(Bucket=bucket, Key="fstab/step_1.bin")["Body"].read()
    assert hashlib.sha256(body).hexdigest() == digest
    wait_for("the daemon stops after umount", lambda: "stopped; everything is durable" in (cache / "ckptfs.log").read_text())
