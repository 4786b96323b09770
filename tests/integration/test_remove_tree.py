"""`rm -rf` of a tree that is in the bucket, while other programs list it (issue 13, section 2).

A listing that started before the tree's deletes finished used to merge the
deleted objects back: about one run in nine, `rm -rf` failed with ENOTEMPTY,
deleted directories reappeared, and `dir/` markers were written for them.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from tests.conftest import Mount

RUNS = 15


def _tree(root: Path, run: int) -> None:
    for d in ("a", "a/b", "a/b/c", "d", "e"):
        (root / d).mkdir(parents=True)
    for i, d in enumerate(("a", "a/b", "a/b/c", "d", "d", "e", "")):
        (root / d / f"f{i}.bin").write_bytes(os.urandom(1000 + run))


def _walk_until(stop: threading.Event, root: Path, errors: list[BaseException]) -> None:
    """Another program looking at the tree: lookups and listings (readdir) of every directory, over and over."""
    while not stop.is_set():
        try:
            for dirpath, _, filenames in os.walk(root):
                for name in filenames:
                    try:
                        os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:
                        pass
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            return


def test_rm_rf_of_an_uploaded_tree_while_it_is_listed(make_mount) -> None:  # type: ignore[no-untyped-def]
    # metadata_ttl=0: every lookup and readdir lists the bucket, so listings overlap the deletes
    m: Mount = make_mount(metadata_ttl=0)
    for run in range(RUNS):
        root = m.path / f"step_{run}"
        _tree(root, run)
        m.flush()
        prefix = m.key(f"step_{run}/")
        assert len([k for k in m.keys() if k.startswith(prefix) and not k.endswith("/")]) == 7
        stop, errors = threading.Event(), []  # type: ignore[var-annotated]
        walkers = [threading.Thread(target=_walk_until, args=(stop, m.path, errors)) for _ in range(2)]
        for w in walkers:
            w.start()
        try:
            rm = subprocess.run(["rm", "-rf", str(root)], capture_output=True, text=True, timeout=120)
        finally:
            stop.set()
            for w in walkers:
                w.join(60)
        assert rm.returncode == 0, f"run {run}: {rm.stderr}"
        assert not errors, errors
        assert not root.exists(), f"run {run}: {sorted(os.listdir(root))}"
        m.flush()
        assert not root.exists(), f"run {run}: deleted directories reappeared: {sorted(os.listdir(root))}"
        assert [k for k in m.keys() if k.startswith(prefix)] == [], f"run {run}: objects or markers left behind"
    assert os.listdir(m.path) == []
