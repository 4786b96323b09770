"""scripts/test_vm.py's choice of tests: what `make test` and `make test-vm` run in the 6.1 guest.

Why a unit test: the guest runs pytest on node ids written in the script, and a renamed test
would only show as a failing guest run an hour later; and the TCG/KVM choice decides whether
`make test` fits CI's time.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ckptfs_test_vm", ROOT / "scripts" / "test_vm.py")
assert spec is not None and spec.loader is not None
test_vm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(test_vm)


def _functions(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_node_id_names_a_test_that_exists() -> None:
    for node in test_vm.TESTS + test_vm.SMOKE:
        file, _, name = node.partition("::")
        assert name in _functions(ROOT / file), f"{node}: no such test"


def test_smoke_is_part_of_the_core_selection() -> None:
    assert test_vm.SMOKE and set(test_vm.SMOKE) <= set(test_vm.TESTS)


def test_auto_runs_everything_under_kvm_and_the_smoke_test_under_tcg(capsys) -> None:
    assert test_vm.selection_args("auto", "kvm")[2:] == test_vm.TESTS
    assert capsys.readouterr().out == ""
    assert test_vm.selection_args("auto", "tcg")[2:] == test_vm.SMOKE
    line = capsys.readouterr().out
    assert line.startswith("test-vm: TCG emulation") and line.count("\n") == 1
    assert test_vm.selection_args("core", "tcg")[2:] == test_vm.TESTS
    assert test_vm.selection_args("smoke", "kvm")[2:] == test_vm.SMOKE
