"""`make install DESTDIR=...`: the command, the unit, the example config, the directories and the docs land in their FHS places."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from ckptfs.config import load_config
from tests.conftest import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_install_stages_everything(tmp_path: Path) -> None:
    dest = tmp_path / "root"
    proc = subprocess.run(["make", "-C", str(ROOT), "install", f"DESTDIR={dest}"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    link = dest / "usr/local/bin/ckptfs"
    assert link.is_symlink() and os.readlink(link) == "/opt/ckptfs/bin/ckptfs"
    unit = (dest / "etc/systemd/system/ckptfs@.service").read_text()
    assert "ExecStart=/usr/local/bin/ckptfs mount --config /etc/ckptfs/%i.toml" in unit
    assert stat.S_IMODE((dest / "var/cache/ckptfs").stat().st_mode) == 0o700
    sample = dest / "etc/ckptfs/example.toml.sample"
    cfg = load_config(str(sample), environ={})
    assert cfg.mountpoint == "/mnt/ckpt" and cfg.cache_dir.startswith("/var/cache/ckptfs/")
    for doc in ("install.md", "operations.md", "configuration.md", "metrics.md", "deploy/grafana/ckptfs.json",
                "deploy/prometheus/alerts.yml", "deploy/nfs/ganesha.conf"):
        assert (dest / "usr/local/share/doc/ckptfs" / doc).exists(), doc

    # the installed command works, and reports a bad config in one line (exit 2, as the unit expects)
    exe = dest / "opt/ckptfs/bin/ckptfs"
    assert subprocess.run([str(exe), "--help"], capture_output=True, timeout=120).returncode == 0
    # a regular (not editable) install: the version comes from the distribution's metadata, run from anywhere
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert version.returncode == 0 and version.stdout == f"ckptfs {tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['version']}\n"
    # the catalogue page's templates are installed with the package (package-data): it renders from the install
    python = dest / "opt/ckptfs/bin/python"
    render = "from ckptfs.ui.app import templates; print(len(templates().list_templates()))"
    assert subprocess.run([str(python), "-c", render], capture_output=True, text=True, timeout=120, cwd=tmp_path).stdout == "4\n"
    bad = tmp_path / "bad.toml"
    bad.write_text('source = "s3://ckpt"\nmountpoint = "/mnt/x"\ncache_dir = "/var/cache/x"\npart_size = "1MiB"\n')
    run = subprocess.run([str(exe), "mount", "--config", str(bad)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == "ckptfs: error: part_size = 1.0 MiB is below the S3 minimum of 5 MiB: raise it"
