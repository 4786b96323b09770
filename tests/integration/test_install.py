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
    """Staged with DESTDIR, as a package build does, then moved to PREFIX (a package's install): it runs from there.

    PREFIX is under tmp_path so that the test can put the tree at its final place without a chroot; before,
    the venv's scripts started with `#!DESTDIR/PREFIX/bin/python3` and did not run once moved."""
    dest = tmp_path / "root"
    prefix = tmp_path / "opt-ckptfs"
    proc = subprocess.run(["make", "-C", str(ROOT), "install", f"DESTDIR={dest}", f"PREFIX={prefix}"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    staged = dest / str(prefix).lstrip("/")
    script = (staged / "bin/ckptfs").read_text()  # `#!PREFIX/bin/python3`, or /bin/sh exec'ing it for a long path
    assert f"{prefix}/bin/python3" in script and str(dest) not in script, script
    shutil.move(staged, prefix)  # what installing the package does
    shutil.rmtree(dest / "tmp")  # nothing of the staging tree is left for the moved one to lean on
    named = subprocess.run(["grep", "-rlF", str(dest), str(prefix)], capture_output=True, text=True, timeout=120)
    assert named.returncode == 1 and named.stdout == "", f"the staging directory is still named in: {named.stdout}"

    link = dest / "usr/local/bin/ckptfs"
    assert link.is_symlink() and os.readlink(link) == f"{prefix}/bin/ckptfs"
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
    exe = prefix / "bin/ckptfs"
    assert subprocess.run([str(exe), "--help"], capture_output=True, timeout=120).returncode == 0
    # a regular (not editable) install: the version comes from the distribution's metadata, run from anywhere
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert version.returncode == 0 and version.stdout == f"ckptfs {tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['version']}\n"
    # the catalogue page's templates are installed with the package (package-data); rendering them needs the
    # ui extra (jinja2), which `make install` leaves out
    python = prefix / "bin/python"
    listed = "import importlib.resources as r; print(sorted(t.name for t in (r.files('ckptfs.ui') / 'templates').iterdir()))"
    templates = subprocess.run([str(python), "-c", listed], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert templates.stdout == "['base.html', 'checkpoint.html', 'run.html', 'runs.html']\n", templates
    bad = tmp_path / "bad.toml"
    bad.write_text('source = "s3://ckpt"\nmountpoint = "/mnt/x"\ncache_dir = "/var/cache/x"\npart_size = "1MiB"\n')
    run = subprocess.run([str(exe), "mount", "--config", str(bad)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == "ckptfs: error: part_size = 1.0 MiB is below the S3 minimum of 5 MiB: raise it"
    # the venv's own tools and its activate script name the final place too
    activated = subprocess.run(["bash", "-c", f". {prefix}/bin/activate && command -v ckptfs && pip --version"],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert activated.returncode == 0 and activated.stdout.startswith(f"{prefix}/bin/ckptfs\n"), activated
    assert f"{prefix}/lib/" in activated.stdout, activated.stdout
