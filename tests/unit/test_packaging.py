"""Every package folder is installed: pyproject.toml lists packages by hand (gateway/ is installed as ckptfs).
What only an optional feature needs is an extra, and a node without it imports and runs the rest."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"ckptfs", "ckptfs.cli"} | {
        "ckptfs." + ".".join(p.parent.relative_to(ROOT / "gateway").parts)
        for p in (ROOT / "gateway").rglob("__init__.py") if p.parent != ROOT / "gateway"
    }
    assert found == listed, "add the missing package to [tool.setuptools] packages in pyproject.toml"


def without(modules: str, code: str) -> subprocess.CompletedProcess[str]:
    """`code` run by a Python in which importing any of `modules` fails, as on a node without the extra."""
    block = f"import sys\nfor name in {modules.split()!r}: sys.modules[name] = None\n"
    return subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_optional_features_are_extras_and_core_keeps_the_http_server() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "hypercorn" in core  # /metrics on every node is served by it (httpserver.py)
    assert not {"numpy", "zstandard", "jinja2"} & {d.split(">")[0].split("=")[0].split("<")[0] for d in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["cold"]] == ["zstandard", "numpy"] and [d.split(">")[0] for d in extras["ui"]] == ["jinja2"]
    makefile = (ROOT / "Makefile").read_text()  # make run and make test install every feature
    for line in ("RUN_EXTRAS := ", "TEST_EXTRAS := "):
        assert {"cold", "ui"} <= set(makefile.split(line, 1)[1].split("\n", 1)[0].split(",")), line


def test_the_daemon_imports_without_the_extras_and_a_feature_that_needs_one_says_which() -> None:
    proc = without("numpy zstandard jinja2", """
import ckptfs.daemon, ckptfs.cli.main
from ckptfs.config import Config
from ckptfs.daemon import UserError, check_cold_extra
from ckptfs.lifecycle import codec
from ckptfs.ui.serve import UiError, require_extra
check_cold_extra(Config(bucket="b", mountpoint="/m", cache_dir="/c", tier_move_target="cold", cold_compression="none"))
for check in (lambda: check_cold_extra(Config(bucket="b", mountpoint="/m", cache_dir="/c", tier_move_target="cold")),
              lambda: codec.decode_body(b"", 0, 0, 0), require_extra):
    try:
        check()
    except (UserError, codec.CodecError, UiError) as e:
        print(e)
""")
    assert proc.returncode == 0, proc.stderr
    cold, decode, ui = proc.stdout.splitlines()
    assert cold == "cold_compression needs the 'cold' extra (numpy, zstandard): pip install 'ckptfs[cold]', or set cold_compression = \"none\""
    assert decode.startswith("cold_compression needs the 'cold' extra") and "numpy is not installed" in decode
    assert ui == "the catalogue page needs the 'ui' extra (jinja2): pip install 'ckptfs[ui]'"
