"""The `ckptfs` command as a platform team scripts it (issue 25): JSON errors, hints that work when pasted, messages
that add up, full-width tables in a pipe, and a failed mount that leaves nothing behind.

Real mounts on a real SeaweedFS server; the command runs as a user runs it, from a directory outside the mount
unless a test says otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CKPTFS, Mount, run_cli, wait_for, write_random
from tests.support.seaweed import SeaweedServer

MiB = 1 << 20


def cli_from(cwd: Path, m: Mount, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CKPTFS, *args], capture_output=True, text=True, env=m.env, cwd=cwd, timeout=300)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("ckptfs: error: "), proc.stderr
    return lines[0]


def hint_of(line: str) -> list[str]:
    m = re.search(r"`(ckptfs [^`]+)`", line)
    assert m, line
    return shlex.split(m.group(1))[1:]


@pytest.mark.one_transport
def test_json_errors_and_pasteable_hints(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()
    ck = m.path / "run1" / "step_400"
    ck.mkdir(parents=True)
    write_random(ck / "model.pt", 1 * MiB, seed=1)
    m.flush()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # verify of an uncommitted checkpoint, the path given relative to where the user stands (the mount's parent)
    rel = os.path.relpath(ck, m.path.parent)
    proc = cli_from(m.path.parent, m, "verify", rel)
    line = one_line(proc)
    assert f"`ckptfs checkpoint commit {rel}`" in line, line
    # the same under --json: the object on stdout, the line on stderr, the same exit status
    proc = cli_from(m.path.parent, m, "verify", rel, "--json")
    err = json.loads(proc.stdout)
    assert err["code"] == proc.returncode == 1 and err["hint"] == f"ckptfs checkpoint commit {rel}" and "\n" not in err["error"]
    assert proc.stderr.startswith("ckptfs: error: ")
    # from elsewhere the hint is absolute; pasted, it works
    hint = hint_of(one_line(cli_from(elsewhere, m, "verify", str(ck))))
    assert hint == ["checkpoint", "commit", str(ck)], hint
    assert cli_from(elsewhere, m, *hint).returncode == 0
    assert cli_from(elsewhere, m, "verify", str(ck)).returncode == 0

    # replicate status --json without targets: a JSON error; every --json command keeps its fields when it works
    proc = m.cli("replicate", "status", str(m.path), "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["error"].startswith("no replica targets configured")
    listed = json.loads(ok(m.cli("checkpoints", str(m.path), "--json")))
    assert listed[0]["path"] == "run1/step_400" and {"step", "state", "files", "bytes"} <= set(listed[0])


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


@pytest.mark.one_transport
def test_messages_that_add_up(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()
    ck = m.path / "a_rather_long_run_name_to_see_the_whole_path_column_in_a_pipe" / "step_1"
    ck.mkdir(parents=True)
    for i in range(3):
        (ck / f"f{i}.bin").write_bytes(b"x" * 100)
    m.flush()
    ok(m.cli("checkpoint", "commit", str(ck)))

    # restore: its 3 files, not the manifest and markers beside them
    out = ok(m.cli("restore", str(ck)))
    assert "none of its 3 files is in an archive class: nothing to restore" in out, out
    assert json.loads(ok(m.cli("restore", str(ck), "--json")))["objects"] >= 4  # the JSON keeps counting objects

    # lifecycle plan without tier settings: one line saying so, no empty rule set
    out = ok(m.cli("lifecycle", "plan", str(m.path)))
    assert "Rules" not in out and "nothing to apply" in out and len(out.strip().splitlines()) == 1, out

    # a piped table is as wide as its text, for every command
    out = ok(m.cli("checkpoints", str(m.path)))
    assert "a_rather_long_run_name_to_see_the_whole_path_column_in_a_pipe/step_1" in out and "committed" in out, out
    assert "…" not in out

    # drill --dir with a missing parent: refused, nothing created; --parents says what it creates
    missing = tmp_path / "no" / "such" / "dir"
    line = one_line(m.cli("drill", str(ck), "--dir", str(missing)))
    assert f"{tmp_path / 'no'} does not exist" in line and "--parents" in line
    assert not (tmp_path / "no").exists()
    proc = m.cli("drill", str(ck), "--dir", str(missing), "--parents")
    assert proc.returncode == 0 and f"creating {tmp_path / 'no'}, {tmp_path / 'no' / 'such'}, {missing}" in proc.stderr, proc.stderr
    assert missing.is_dir()

    # unmount --flush ends saying it is durable, then unmounted
    (m.path / "late.bin").write_bytes(b"y" * 5)
    lines = ok(m.cli("unmount", str(m.path), "--flush")).strip().splitlines()
    assert lines[-2] == f"ckptfs: everything in {m.path} is durable in the bucket" and lines[-1].startswith("ckptfs: unmounted"), lines


def test_status_counts_a_file_still_being_written(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount()
    with open(m.path / "open.bin", "wb") as f:
        f.write(os.urandom(1 * MiB))
        f.flush()
        st = m.status()
        assert st["dirty_files"] == 1 and st["dirty_bytes"] == 1 * MiB, st
        assert st["cache_used_bytes"] >= 1 * MiB and st["cache_dirty_bytes"] == 1 * MiB, st
        assert "1 dirty file (1.0 MiB)" in ok(m.cli("status", str(m.path)))
    m.flush()


@pytest.mark.one_transport
def test_failed_mount_leaves_nothing_bound(make_mount, s3: SeaweedServer, bucket: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        m: Mount = make_mount("a", start=False)
        (m.cache_dir / "notes.txt").write_text("the operator's, not ckptfs's\n")
        m.metrics_port = busy.getsockname()[1]
        proc = run_cli(*m.mount_args(), env=m.env, timeout=120)
        assert proc.returncode != 0 and "cannot listen for metrics" in proc.stderr, proc.stderr
    finally:
        busy.close()
    assert not (m.cache_dir / "journal.sqlite3").exists()
    # as docs/cli.md says: the cache directory as the start found it (no log, lock, data/ or socket left)
    assert sorted(os.listdir(m.cache_dir)) == ["notes.txt"]
    assert (m.cache_dir / "notes.txt").read_text() == "the operator's, not ckptfs's\n"
    # the cache directory takes a mount of another prefix
    other = Mount(s3, bucket, "other", m.path, m.cache_dir, m.options)
    other.start()
    try:
        log = (m.cache_dir / "ckptfs.log").read_text()
        # a second mount of it is refused on its own stderr, not in the running daemon's log
        again = run_cli(*other.mount_args(), env=other.env, timeout=120)
        assert again.returncode != 0 and "in use by a running ckptfs" in again.stderr, again.stderr
        assert (m.cache_dir / "ckptfs.log").read_text() == log
    finally:
        other.stop()


@pytest.mark.one_transport
@pytest.mark.parametrize("daemon", [True, False], ids=["daemon", "foreground"])
def test_mount_of_a_missing_bucket_leaves_the_cache_dir_as_found(make_mount, daemon: bool) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount("a", start=False)
    m.bucket = "no-such-bucket-here"
    proc = run_cli(*m.mount_args(daemon=daemon), env=m.env, timeout=120)
    assert proc.returncode != 0 and "bucket 'no-such-bucket-here' does not exist" in proc.stderr, proc.stderr
    assert os.listdir(m.cache_dir) == []
    assert os.listdir(m.path) == [] and not os.path.ismount(m.path)


@pytest.mark.one_transport
def test_https_against_a_plain_http_server_says_so(make_mount, s3: SeaweedServer) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(start=False, endpoint_url=s3.endpoint_url.replace("http://", "https://"))
    proc = run_cli(*m.mount_args(), env=m.env, timeout=300)
    assert proc.returncode != 0 and "use http:// in endpoint_url" in proc.stderr, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr
    wait_for("nothing mounted", lambda: not os.path.ismount(m.path))
