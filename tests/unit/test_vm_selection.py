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


def _visible_in_guest(path: str, keep: list[str]) -> bool:
    """Whether the guest sees `path` of the host: outside its scratch tmpfs, or bound back over it."""
    under_scratch = any(path == top or path.startswith(top + "/") for top in test_vm.SCRATCH)
    return not under_scratch or any(path == k or path.startswith(k + "/") for k in keep)


def test_a_worktree_under_tmp_stays_visible_in_the_guest(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A clone in /tmp (a CI runner, a quick try): the guest's tmpfs on /tmp hid it (`cd: can't cd to /tmp/...`,
    vm-exit 127). The worktree and the venv are bound back over the tmpfs, after it is mounted."""
    monkeypatch.setattr(test_vm, "REPO", Path("/tmp/c15"))
    for python in (Path("/tmp/c15/.venv/bin/python"), Path("/var/tmp/venv/bin/python")):
        keep = test_vm.hidden_by_scratch(test_vm.guest_paths(python))
        run = test_vm.run_script(python, ["-v"])
        assert run.startswith("cd /tmp/c15\n") and f"exec {python} -m pytest" in run
        assert _visible_in_guest("/tmp/c15", keep) and _visible_in_guest(str(python), keep), keep
        init = test_vm.init_script(keep).splitlines()
        scratch = [i for i, line in enumerate(init) if line.startswith("mount -t tmpfs ") and line.split()[-1] in
                   {f"/host{top}" for top in test_vm.SCRATCH}]
        for kept in keep:
            aside = init.index(f"mkdir -p /keep{kept} && mount -o bind /host{kept} /keep{kept} || echo 'vm: cannot keep {kept}'")
            back = init.index(f"mkdir -p /host{kept} && mount -o bind /keep{kept} /host{kept} || echo 'vm: cannot bind back {kept}'")
            assert aside < min(scratch) and max(scratch) < back < init.index("chroot /host /bin/sh /run/ckptfs-vm.sh")


def test_a_worktree_elsewhere_binds_nothing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(test_vm, "REPO", Path("/work/wt/x"))
    assert test_vm.hidden_by_scratch(test_vm.guest_paths(Path("/work/wt/x/.venv/bin/python"))) == []
    assert "bind" not in test_vm.init_script([])
    # a path inside one already bound back is not bound twice; a neighbour with a common prefix is its own
    assert test_vm.hidden_by_scratch([Path("/tmp/c15/.venv"), Path("/tmp/c15"), Path("/tmp/c15-b")]) == ["/tmp/c15", "/tmp/c15-b"]


def test_the_nfs_selection_names_files_that_exist_and_loads_the_nfs_client() -> None:
    assert test_vm.NFS and all((ROOT / f).is_file() and "nfs" in f for f in test_vm.NFS)
    assert test_vm.selection_args("nfs", "tcg")[2:] == test_vm.NFS
    assert {"sunrpc", "nfs", "nfsv4"} <= set(test_vm.guest_modules("nfs"))
    assert test_vm.guest_modules("core") == test_vm.MODULES
    assert "ip addr add" in test_vm.init_script([])  # Ganesha's AI_ADDRCONFIG needs an address besides 127.0.0.1


def test_a_guest_run_whose_tests_all_skipped_is_a_failure() -> None:
    """Issue 43: `make test-vm SELECTION=nfs` on a fresh machine said `12 skipped`, exit 0: the guest lacked
    mount.nfs4. A run that tested nothing fails; one where some passed and some skipped does not."""
    assert test_vm.all_skipped(["...", "============ 12 skipped in 3.45s ============"])
    assert test_vm.all_skipped(["12 skipped, 1 warning in 3.45s"])
    assert not test_vm.all_skipped(["===== 3 passed, 2 skipped in 41.2s ====="])
    assert not test_vm.all_skipped(["no summary"])
