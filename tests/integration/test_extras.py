"""A node installed without the optional extras (pyproject.toml: `cold` = numpy + zstandard, `ui` = jinja2):
it mounts and drains as any other, and a feature configured without its extra stops the start in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Mount, run_cli, write_random
from tests.integration.test_cli import one_line_error
from tests.integration.test_replication import write_config
from tests.support.seaweed import free_port

# store-side wiring: the FUSE transport changes nothing here
pytestmark = pytest.mark.one_transport

MiB = 1 << 20


def without_extras(tmp_path: Path, m: Mount) -> dict[str, str]:
    """The mount's environment, in which every Python (the command, the daemon it starts) fails to import the extras."""
    site = tmp_path / "no-extras"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("import sys\nfor name in ('numpy', 'zstandard', 'jinja2'):\n    sys.modules[name] = None\n")
    return {**m.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), m.env.get("PYTHONPATH")]))}


def test_a_node_without_the_extras_mounts_and_a_feature_needing_one_says_which(make_mount, second_s3, second_bucket, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(start=False)
    env = without_extras(tmp_path, m)
    for name in ("numpy", "zstandard", "jinja2"):  # the blocking works
        probe = subprocess.run([sys.executable, "-c", f"import {name}"], env=env, capture_output=True, text=True, timeout=60)
        assert probe.returncode == 1 and f"import of {name} halted" in probe.stderr, probe.stderr

    # no cold tier, no page: mounts, writes, drains
    run_cli(*m.mount_args(), env=env, timeout=120, check=True)
    digest = write_random(m.path / "plain.bin", 3 * MiB, seed=131)
    m.flush()
    assert m.object_sha256("plain.bin") == digest
    m.stop()

    # a cold tier that compresses (cold_compression = auto, the default): one line at mount, nothing mounted
    config = write_config(tmp_path / "cold.toml", {"cold": {"source": f"s3://{second_bucket}/c", "endpoint_url": second_s3.endpoint_url}})
    m.options["tier_move_target"] = "cold"
    one_line_error(run_cli(*m.mount_args(), "--config", config, env=env, timeout=120),
                   "cold_compression needs the 'cold' extra", "pip install 'ckptfs[cold]'", 'cold_compression = "none"')
    assert not os.path.ismount(m.path)
    # the same without compression: mounts
    m.options["cold_compression"] = "none"
    run_cli(*m.mount_args(), "--config", config, env=env, timeout=120, check=True)
    assert os.path.ismount(m.path)
    assert m.object_sha256("plain.bin") == digest

    # the page: `ckptfs ui` and ui_enabled, one line each
    one_line_error(run_cli("ui", str(m.path), env=env, timeout=60), "the catalogue page needs the 'ui' extra", "pip install 'ckptfs[ui]'")
    m.stop()
    del m.options["tier_move_target"], m.options["cold_compression"]
    m.metrics_port = free_port()
    m.options["ui_enabled"] = "true"
    one_line_error(run_cli(*m.mount_args(), env=env, timeout=120), "ui_enabled: the catalogue page needs the 'ui' extra", "pip install 'ckptfs[ui]'")
    assert not os.path.ismount(m.path)
