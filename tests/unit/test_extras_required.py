"""tests/support/extras.py: an optional dependency that does not import is a skip in a plain run, a failure
where CKPTFS_REQUIRE_EXTRAS=1 (`make test`, which installs every extra) says it must import."""

from __future__ import annotations

import pytest

from tests.support.extras import need


def test_a_missing_extra_is_skipped_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPTFS_REQUIRE_EXTRAS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="pip extra `train`"):
        need("ckptfs_no_such_module", "train")


def test_a_missing_extra_fails_where_extras_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTFS_REQUIRE_EXTRAS", "1")
    with pytest.raises(pytest.fail.Exception, match="ckptfs_no_such_module does not import"):
        need("ckptfs_no_such_module", "train")


def test_an_installed_module_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTFS_REQUIRE_EXTRAS", "1")
    assert need("json", "test").dumps([1]) == "[1]"
