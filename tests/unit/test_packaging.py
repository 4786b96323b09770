"""Every package folder is installed: pyproject.toml lists packages by hand (gateway/ is installed as ckptfs)."""

from __future__ import annotations

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
