"""The ckptfs version: one place for `ckptfs --version`, `status`, the log's first line and `ckptfs_mount_info`.

From the installed distribution's metadata (importlib.metadata); a source
checkout that was never installed (`python -m ckptfs.cli` with the tree on
sys.path) reads it from pyproject.toml next to the package folders.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "ckptfs"
UNKNOWN = "0+unknown"


def _from_source_tree() -> str | None:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None
    if project.get("name") != DISTRIBUTION:
        return None
    version = project.get("version")
    return str(version) if version else None


def find_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return _from_source_tree() or UNKNOWN


VERSION = find_version()
