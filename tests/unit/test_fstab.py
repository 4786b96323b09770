"""Mount-helper arguments (`mount -t fuse.ckptfs`, /etc/fstab) become a `ckptfs mount --daemon` command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptfs.cli.fstab import FstabError, is_mount_helper_call, mount_args
from ckptfs.cli.errors import CliError
from ckptfs.cli.mount import parse_options
from ckptfs.client import _not_allowed_on_mount
from ckptfs.config import load_config
from tests.conftest import ROOT

COMMANDS = {"mount", "unmount", "status", "flush", "warmup", "evict"}


def test_what_mount_fuse3_passes_becomes_ckptfs_mount() -> None:
    # as mount.fuse3 runs it for: s3://ckpt/runs /mnt/ckpt fuse.ckptfs cache_dir=/nvme/c,_netdev,nofail,x-systemd.automount 0 0
    argv = ["s3://ckpt/runs", "/mnt/ckpt", "-o", "rw,cache_dir=/nvme/c,_netdev,nofail,x-systemd.automount,allow_other,noatime,dev,suid"]
    assert is_mount_helper_call(argv, COMMANDS)
    assert mount_args(argv) == ["mount", "s3://ckpt/runs", "/mnt/ckpt", "--daemon",
                                "-o", "cache_dir=/nvme/c", "-o", "allow_other"]


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
    proc = subprocess.run([sys.executable, "-m", "ckptfs.cli", "s3://b", "/nonexistent", "-q"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ckptfs: error: unknown mount helper flag '-q'"


def test_fstab_yes_no_words_reach_the_config() -> None:
    """`ro` and `allow_other` in an fstab line mean read_only and allow_other, as for any FUSE file system."""
    args = mount_args(["s3://b", "/m", "-o", "rw,ro,allow_other,nodirect_io_writes,cache_dir=/c"])
    assert args == ["mount", "s3://b", "/m", "--daemon", "-o", "ro", "-o", "allow_other", "-o", "nodirect_io_writes",
                    "-o", "cache_dir=/c"]
    overrides = parse_options([a for a in args[4:] if a != "-o"])
    cfg = load_config(overrides={**overrides, "bucket": "bucket-b", "mountpoint": "/m"}, environ={})
    assert (cfg.read_only, cfg.allow_other, cfg.direct_io_writes, cfg.cache_dir) == (True, True, False, "/c")


@pytest.mark.parametrize("command", ["", "mount", "unmount", "status", "flush", "warmup", "evict"])
def test_every_help_page_renders(command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "ckptfs.cli", *([command] if command else []), "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout


def test_mount_takes_yes_no_options_as_words() -> None:
    """`-o allow_other`, as the permission message says and every FUSE mount takes it; `noNAME` clears; ro/rw."""
    assert parse_options(["allow_other"]) == {"allow_other": "true"}
    assert parse_options(["noallow_other", "ro"]) == {"allow_other": "false", "read_only": "true"}
    assert parse_options(["allow_other,ro"]) == {"allow_other": "true", "read_only": "true"}
    assert parse_options(["rw", "allow-other=false", "commit_markers=a,b"]) == {
        "read_only": "false", "allow_other": "false", "commit_markers": "a,b"}


@pytest.mark.parametrize(
    "option, message",
    [
        ("part_size", "-o 'part_size' needs a value: -o part_size=VALUE"),
        ("alow_other", "did you mean allow_other?"),
        ("allow_other,part_size=1G", "one option per -o"),
        ("nopart_size", "neither KEY=VALUE nor a yes/no option"),
    ],
)
def test_mount_option_words_that_are_no_option_are_one_line(option: str, message: str) -> None:
    with pytest.raises(CliError, match=re.escape(message)):
        parse_options([option])


def test_the_permission_hint_works_when_pasted(tmp_path: Path) -> None:
    """The message quoted in docs/cli.md says `mount with -o allow_other`: the mount command takes it.

    The mount then fails on the missing mount point, after the options were read.
    """
    message = str(_not_allowed_on_mount("/mnt/ckpt", 0))
    option = re.search(r"mount with (-o \S+)", message).group(1).split()
    proc = subprocess.run([sys.executable, "-m", "ckptfs.cli", "mount", "s3://bucket-b", str(tmp_path / "missing"),
                           "--cache-dir", str(tmp_path), *option], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode != 0
    assert "allow_other" not in proc.stderr and "missing" in proc.stderr, proc.stderr
