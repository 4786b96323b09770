"""What a user sees of a checkpoint agrees wherever it is looked at (issue 35): `getfattr -n user.ckptfs.state`
on a checkpoint directory says what `ckptfs.state()` says, and `ckptfs checkpoints` run inside a run directory
prints paths valid from there."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

import ckptfs
from tests.conftest import CKPTFS, Mount, write_random

STATE = "user.ckptfs.state"


def xattr_state(path: os.PathLike[str] | str) -> str:
    return os.getxattr(path, STATE).decode()


def test_a_checkpoint_directory_has_the_state_attribute_ckptfs_state_gives(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(checkpoint_quiet_seconds=3600)  # committed only by the command below
    step = m.path / "run1/step_100"
    step.mkdir(parents=True)
    with open(step / "model.bin", "wb") as f:
        f.write(b"x" * 1000)
        f.flush()
        assert xattr_state(step) == ckptfs.state(step) == "writing"  # open for writing here
        assert STATE in os.listxattr(step)
    write_random(step / "optim.bin", 2000, seed=1)
    m.flush("run1/step_100")
    assert xattr_state(step) == ckptfs.state(step) == "writing"  # durable, no manifest yet
    ckptfs.commit(step)
    assert xattr_state(step) == ckptfs.state(step) == "committed"
    ckptfs.protect(step, "paper")
    assert xattr_state(step) == ckptfs.state(step) == "protected"
    assert xattr_state(step / "model.bin") == "durable"  # a file's own state, as before
    for not_a_checkpoint in (m.path / "run1", m.path):
        with pytest.raises(OSError) as e:
            os.getxattr(not_a_checkpoint, STATE)
        assert e.value.errno == errno.ENODATA
        assert STATE not in os.listxattr(not_a_checkpoint)


def test_checkpoints_prints_paths_valid_from_the_working_directory(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(checkpoint_quiet_seconds=3600)
    (m.path / "run1/step_100").mkdir(parents=True)
    write_random(m.path / "run1/step_100/model.bin", 1000)
    m.flush()

    def table(cwd: os.PathLike[str] | str, *args: str) -> list[str]:  # the one row of step_100: its cells
        proc = subprocess.run([*CKPTFS, "checkpoints", *args], cwd=cwd, env=m.env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        rows = [[c.strip() for c in line.split("│") if c.strip()] for line in proc.stdout.splitlines() if "step_100" in line]
        assert len(rows) == 1, proc.stdout
        return rows[0]  # step, path, state, ...

    row = table(m.path / "run1")
    assert row[:3] == ["100", "step_100", "writing"], row  # `ls step_100` works from here
    assert (m.path / "run1" / row[1]).is_dir()
    assert table(m.path)[1] == "run1/step_100"
    assert table("/", str(m.path))[1] == str(m.path / "run1/step_100")  # from outside the mount: the absolute path
