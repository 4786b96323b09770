"""The optional Python dependencies some tests need: skipped where they are not installed, failed where they must be.

Why: `pytest.importorskip` turns a broken install (a torch wheel that does not import, an extra left out of the
environment) into a quiet skip, and the run still looks green. `make test` installs every extra the suite needs
(`pip install -e '.[test,train,bench,cold,ui]'`) and sets CKPTFS_REQUIRE_EXTRAS=1: there a module that does not
import fails the test, with the ImportError, instead of skipping it. A plain `pytest` elsewhere (no extras
installed on purpose) still skips, saying which extra to install.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

ENV = "CKPTFS_REQUIRE_EXTRAS"


def required() -> bool:
    """True where every optional dependency must import (CKPTFS_REQUIRE_EXTRAS=1: `make test`)."""
    return os.environ.get(ENV, "") not in ("", "0")


def need(module: str, extra: str) -> ModuleType:
    """`module`, imported; missing, the test is skipped (naming `extra`), or failed where extras are required."""
    if not required():
        return pytest.importorskip(module, reason=f"{module} is not installed (pip extra `{extra}`)")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} does not import although {ENV}=1 says the `{extra}` extra is installed: {e!r}", pytrace=False)
