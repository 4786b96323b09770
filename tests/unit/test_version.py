"""One version everywhere: the installed distribution's, or pyproject.toml's in a source checkout never installed."""

from __future__ import annotations

import tomllib
from importlib import metadata

import pytest

from ckptfs import version
from tests.conftest import ROOT


def pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_installed_version_is_the_distributions() -> None:
    assert version.VERSION == metadata.version("ckptfs") == pyproject_version()


def test_source_checkout_reads_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version.metadata, "version", not_installed)
    assert version.find_version() == pyproject_version()
