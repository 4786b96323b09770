"""An unexpected error in one service never takes the mount down (gateway/supervisor.py).

A real daemon on a real mount: a service made to fail (a malformed control request, which reached an
unguarded path; or, through the test-only `CKPTFS_TEST_FAULTS` hook, an exception raised inside a
running service) is restarted, counted in /metrics and `status --json`'s `services`, and the mount keeps
serving: reads and writes work and the bytes reach the bucket. Only the FUSE session failing stops the
daemon, and then cleanly: the mount detached, open files recorded, one line saying why, exit status 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from typing import Any

from tests.conftest import CKPTFS, ROOT, Mount, mount_answers, mount_is_dead, run_cli, sha256_file, wait_for, write_random
from tests.integration.test_metrics import scrape, value
from tests.support.faultproxy import FaultProxy
from tests.support.seaweed import free_port

MiB = 1 << 20
FAULTY = "control,metrics,fetcher,listings,drainer,lifecycle,fuse"


def ask(m: Mount, raw: bytes) -> list[dict[str, Any]]:
    """Send one raw line to the daemon's control socket; every line it answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(m.cache_dir / "control.sock"))
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def start_with_faults(m: Mount) -> None:
    run_cli(*m.mount_args(), env={**m.env, "CKPTFS_TEST_FAULTS": FAULTY}, timeout=120, check=True)


def restarted(m: Mount, service: str, times: int) -> bool:
    proc = m.cli("status", str(m.path), "--json", timeout=30)
    if proc.returncode != 0:
        assert service == "control", proc.stderr  # only while the control socket itself restarts
        return False
    s = json.loads(proc.stdout)["services"].get(service)
    return s is not None and s["state"] == "running" and s["restarts"] == times


def test_a_malformed_control_request_is_answered_and_the_daemon_keeps_serving(make_mount) -> None:  # type: ignore[no-untyped-def]
    """Found by reading control.py: a request that is JSON but not an object raised AttributeError in the
    handler, which ended the control server and with it the whole daemon (a dead mount)."""
    m: Mount = make_mount()
    digest = write_random(m.path / "before.bin", 2 * MiB, seed=1)
    for raw in (b"[1]\n", b'"status"\n', b"17\n", b"null\n", b'{"cmd": "warmup", "paths": 3}\n'):
        replies = ask(m, raw)
        assert len(replies) == 1 and replies[0]["ok"] is False, (raw, replies)
        assert "bad request" in replies[0]["error"] and "\n" not in replies[0]["error"], replies
    # still serving: the control socket, reads, writes, the drain
    st = m.status()
    assert st["services"]["control"] == {"state": "running", "restarts": 0, "last_error": None}
    after = write_random(m.path / "after.bin", 3 * MiB, seed=2)
    assert sha256_file(m.path / "before.bin") == digest
    m.flush()
    assert m.object_sha256("before.bin") == digest and m.object_sha256("after.bin") == after
    assert "Traceback" not in (m.cache_dir / "ckptfs.log").read_text()


def test_a_service_that_fails_is_restarted_counted_and_the_mount_keeps_serving(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    proxy.set_mode("pass", rate=6 * MiB)  # slow enough to fail the drainer half way through an upload
    m: Mount = make_mount(start=False, endpoint_url=proxy.url, part_size="5MiB", multipart_threshold="5MiB", max_parts_in_flight=1)
    m.metrics_port = free_port()
    start_with_faults(m)
    st = m.status()
    assert set(st["services"]) >= {"control", "metrics", "fetcher", "listings", "fuse", "drainer", "lifecycle"}
    assert all(s == {"state": "running", "restarts": 0, "last_error": None} for s in st["services"].values()), st["services"]

    # the drainer fails in the middle of a multipart upload: after its restart the upload resumes and completes
    size = 30 * MiB
    first = write_random(m.path / "model.bin", size, seed=3)
    wait_for("two parts in the bucket", lambda: proxy.bytes_up >= 12 * MiB)
    assert ask(m, b'{"cmd": "inject_fault", "service": "drainer"}\n') == [{"ok": True}]
    wait_for("the drainer to restart", lambda: restarted(m, "drainer", 1), timeout=120)
    proxy.set_mode("pass", rate=0)
    m.flush()
    assert m.object_sha256("model.bin") == first
    assert proxy.bytes_up < size + 12 * MiB, proxy.bytes_up  # the parts already sent were kept (ListParts), not sent again

    # every other service too, one after another; the mount answers between them
    (m.path / "dir").mkdir()
    for i, service in enumerate(("listings", "fetcher", "metrics", "lifecycle", "control")):
        replies = ask(m, json.dumps({"cmd": "inject_fault", "service": service}).encode() + b"\n")
        assert replies in ([{"ok": True}], []), replies  # the control server may go down before its answer
        wait_for(f"{service} to restart", lambda: restarted(m, service, 1), timeout=120)
        digest = write_random(m.path / "dir" / f"after-{service}.bin", 1 * MiB, seed=10 + i)
        assert sha256_file(m.path / "dir" / f"after-{service}.bin") == digest
        assert f"after-{service}.bin" in os.listdir(m.path / "dir")

    # the drainer a second time: counted again, and the same error logged in one line, without a traceback
    assert ask(m, b'{"cmd": "inject_fault", "service": "drainer"}\n') == [{"ok": True}]
    wait_for("the drainer to restart again", lambda: restarted(m, "drainer", 2), timeout=120)
    last = write_random(m.path / "last.bin", 7 * MiB, seed=20)
    m.flush()
    assert m.object_sha256("last.bin") == last
    for service in ("listings", "fetcher", "metrics", "lifecycle", "control"):
        assert m.object_sha256(f"dir/after-{service}.bin") == sha256_file(m.path / "dir" / f"after-{service}.bin")

    st = m.status()
    assert st["services"]["drainer"]["restarts"] == 2
    assert st["services"]["drainer"]["last_error"] == "InjectedFault: fault injected into drainer by a test (CKPTFS_TEST_FAULTS)"
    assert st["services"]["fuse"] == {"state": "running", "restarts": 0, "last_error": None}
    text = scrape(m.metrics_port)
    assert value(text, "ckptfs_service_restarts_total", service="drainer") == 2
    for service in ("listings", "fetcher", "metrics", "lifecycle", "control"):
        assert value(text, "ckptfs_service_restarts_total", service=service) == 1
    assert value(text, "ckptfs_service_restarts_total", service="fuse") == 0
    human = m.cli("status", str(m.path))
    assert "drainer running again (2 restarts): InjectedFault" in human.stdout, human.stdout
    log = (m.cache_dir / "ckptfs.log").read_text()
    assert log.count("service drainer failed unexpectedly") == 1  # with its traceback, once
    assert "service drainer failed again with the same error (2 times in a row)" in log


def test_the_fuse_session_failing_stops_the_daemon_cleanly(make_mount) -> None:  # type: ignore[no-untyped-def]
    """The one failure not restarted: the mount is detached (not left dead), a file still open for writing is
    recorded, one line says why, the exit status is 1; the next mount uploads what was written."""
    m: Mount = make_mount(start=False, upload_delay=3600)
    proc = subprocess.Popen([*CKPTFS, *m.mount_args(daemon=False)], env={**m.env, "CKPTFS_TEST_FAULTS": FAULTY}, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("the mount", lambda: mount_answers(m.path))
        closed = write_random(m.path / "closed.bin", 2 * MiB, seed=30)
        data = os.urandom(3 * MiB)
        fd = os.open(m.path / "open.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            assert os.write(fd, data) == len(data)
            os.fsync(fd)
            assert ask(m, b'{"cmd": "inject_fault", "service": "fuse"}\n') == [{"ok": True}]
            _, stderr = proc.communicate(timeout=180)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass  # the mount went away under it
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    assert not os.path.ismount(m.path) and not mount_is_dead(m.path)  # detached, not a corpse
    lines = [line for line in stderr.splitlines() if "ckptfs stopped:" in line]
    assert len(lines) == 1 and "the FUSE session failed (InjectedFault" in lines[0], stderr
    assert f"{m.path} is unmounted" in lines[0] and "for the next mount" in lines[0]
    m.options["upload_delay"] = 0.2
    m.start()
    m.flush()
    assert m.object_sha256("closed.bin") == closed
    assert m.object_sha256("open.bin") == hashlib.sha256(data).hexdigest()


