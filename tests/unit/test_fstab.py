"""Mount-helper arguments (`mount -t fuse.ckptfs`, /etc/fstab) become a `ckptfs mount --daemon` command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptfs.cli.fstab import FstabError, is_mount_helper_call, mount_args
from tests.conftest import ROOT

COMMANDS = {"mount", "unmount", "status", "flush", "warmup", "evict"}


def test_what_mount_fuse3_passes_becomes_ckptfs_mount() -> None:
    # as mount.fuse3 runs it for: s3://ckpt/runs /mnt/ckpt fuse.ckptfs cache_dir=/nvme/c,_netdev,nofail,x-systemd.automount 0 0
    argv = ["s3://ckpt/runs", "/mnt/ckpt", "-o", "rw,cache_dir=/nvme/c,_netdev,nofail,x-systemd.automount,allow_other,noatime,dev,suid"]
    assert is_mount_helper_call(argv, COMMANDS)
    assert mount_args(argv) == ["mount", "s3://ckpt/runs", "/mnt/ckpt", "--daemon",
                                "-o", "cache_dir=/nvme/c", "-o", "allow_other=true"]


def test_config_file_names_the_source() -> None:
    argv = ["ckptfs", "/mnt/ckpt", "-o", "config=/etc/ckptfs/ckpt.toml,metrics_addr=127.0.0.1:9464", "-n"]
    assert is_mount_helper_call(argv, COMMANDS)
    assert mount_args(argv) == ["mount", "/mnt/ckpt", "--daemon", "--config", "/etc/ckptfs/ckpt.toml",
                                "-o", "metrics_addr=127.0.0.1:9464"]


def test_fake_mount_does_nothing() -> None:
    assert mount_args(["s3://b", "/m", "-f", "-o", "rw"]) is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ckptfs", "/m", "-o", "cache_dir=/c"], "give one, or config=FILE"),
        (["s3://b", "/m", "-o", "ro"], "remove the ro option"),
        (["s3://b", "-o", "rw"], "expected SOURCE MOUNTPOINT"),
        (["s3://b", "/m", "-o"], "-o needs a list"),
        (["s3://b", "/m", "-q"], "unknown mount helper flag"),
    ],
)
def test_bad_helper_arguments_are_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(FstabError, match=message):
        mount_args(argv)


def test_commands_are_not_taken_for_mount_helper_calls() -> None:
    assert not is_mount_helper_call(["status", "/mnt/ckpt"], COMMANDS)
    assert not is_mount_helper_call(["stauts", "/mnt/ckpt"], COMMANDS)  # a typo stays typer's "no such command"
    assert not is_mount_helper_call(["--help"], COMMANDS)


def test_cli_reports_helper_errors_in_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "ckptfs.cli", "s3://b", "/nonexistent", "-o", "ro"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ckptfs: error: ckptfs mounts are read-write: remove the ro option"


@pytest.mark.parametrize("command", ["", "mount", "unmount", "status", "flush", "warmup", "evict"])
def test_every_help_page_renders(command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "ckptfs.cli", *([command] if command else []), "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout
