"""Temporary directories (issue 24): a step written into `step_N.tmp/` reaches the bucket only under its final name.

A real mount on a real SeaweedFS. A watcher lists the bucket all along the writes, the rename and
the drain, and the test fails on any key with a temporary name; what is checked at the end is what
a user would check: the keys, their bytes against what was written, and the bytes the daemon sent
(`uploaded_bytes_total`) against the bytes written. The transport changes nothing here
(`one_transport`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterable

import pytest

from tests.conftest import Mount, mount_is_dead, wait_for, write_random
from tests.support.faultproxy import FaultProxy
from tests.support.watch import BucketWatcher

pytestmark = pytest.mark.one_transport

MiB = 1 << 20


def temporary(keys: Iterable[str]) -> list[str]:
    return sorted(k for k in keys if ".tmp" in k or "tmp-" in k)


def test_a_step_written_into_a_temporary_directory_is_uploaded_once_under_its_final_name(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(part_size="5MiB", multipart_threshold="5MiB")
    files = {"model.safetensors": 12 * MiB, "optim/shard_0.bin": 7 * MiB, "optim/shard_1.bin": 64 * 1024, "meta.json": 300}
    written: dict[str, str] = {}
    with BucketWatcher(m.s3.client(), m.bucket) as watcher:
        (m.path / "run" / "step_3.tmp" / "optim").mkdir(parents=True)
        for i, (name, size) in enumerate(files.items()):
            written[name] = write_random(m.path / "run" / "step_3.tmp" / name, size, seed=i)
            watcher.listed_once_more()  # the bucket listed between the writes
        # every file closed and held back: a state the daemon reports, not a time waited for
        wait_for("the files to be held", lambda: m.status()["temporary_held_files"] == len(files))
        watcher.listed_once_more()
        assert temporary(watcher.seen) == []
        (m.path / "run" / "step_3.tmp").rename(m.path / "run" / "step_3")
        m.flush()
        watcher.listed_once_more()
    assert temporary(watcher.seen) == []
    assert m.keys() == sorted(m.key(f"run/step_3/{name}") for name in files)
    for name, digest in written.items():
        assert m.object_sha256(f"run/step_3/{name}") == digest
    st = m.status()
    assert st["uploaded_bytes_total"] == sum(files.values())  # no byte sent twice
    assert st["temporary_held_files"] == 0 and st["dirty_files"] == 0


def test_a_temporary_directory_never_renamed_drains_under_its_name_once_the_hold_passes(make_mount) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(temporary_hold_seconds=1, part_size="5MiB", multipart_threshold="5MiB")
    (m.path / "1000.orbax-checkpoint-tmp-17" / "d").mkdir(parents=True)
    a = write_random(m.path / "1000.orbax-checkpoint-tmp-17" / "d" / "a", 6 * MiB, seed=1)
    b = write_random(m.path / "1000.orbax-checkpoint-tmp-17" / "b", 1000, seed=2)
    # the writer "crashed": nothing renames the directory, yet its bytes reach the bucket
    wait_for("the held files to drain", lambda: m.status()["dirty_files"] == 0)
    assert m.keys() == [m.key("1000.orbax-checkpoint-tmp-17/b"), m.key("1000.orbax-checkpoint-tmp-17/d/a")]
    assert m.object_sha256("1000.orbax-checkpoint-tmp-17/d/a") == a
    assert m.object_sha256("1000.orbax-checkpoint-tmp-17/b") == b
    # renamed late: the objects are copied inside the store, not sent again
    (m.path / "1000.orbax-checkpoint-tmp-17").rename(m.path / "1000")
    m.flush()
    wait_for("the old keys to be deleted", lambda: m.keys() == [m.key("1000/b"), m.key("1000/d/a")])
    assert m.object_sha256("1000/d/a") == a and m.object_sha256("1000/b") == b
    assert m.status()["uploaded_bytes_total"] == 6 * MiB + 1000


def test_a_directory_renamed_while_its_file_uploads_keeps_the_parts_sent(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    proxy.set_mode("pass", rate=4 * MiB)  # slow enough to rename the directory half way
    m: Mount = make_mount(endpoint_url=proxy.url, part_size="5MiB", multipart_threshold="5MiB", max_parts_in_flight=2,
                          temporary_hold_seconds=0)
    size = 40 * MiB
    (m.path / "step_5.tmp").mkdir()
    digest = write_random(m.path / "step_5.tmp" / "model.bin", size, seed=3)
    wait_for("a part to reach the bucket", lambda: m.status()["dirty_bytes_in_bucket"] > 0)
    (m.path / "step_5.tmp").rename(m.path / "step_5")
    proxy.set_mode("pass", rate=0)
    m.flush()
    wait_for("the old key to be deleted", lambda: m.keys() == [m.key("step_5/model.bin")])
    assert m.object_sha256("step_5/model.bin") == digest
    # the upload went on under the old key and was copied inside the store: each byte sent once
    assert m.status()["uploaded_bytes_total"] == size
    assert m.s3.client().list_multipart_uploads(Bucket=m.bucket).get("Uploads", []) == []


def test_an_upload_interrupted_by_a_crash_resumes_under_its_old_key_after_a_rename(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    proxy.set_mode("pass", rate=8 * MiB)  # slow enough to kill it half way
    m: Mount = make_mount(endpoint_url=proxy.url, part_size="5MiB", multipart_threshold="5MiB", max_parts_in_flight=2,
                          temporary_hold_seconds=0)
    size = 40 * MiB
    (m.path / "step_7.tmp").mkdir()
    digest = write_random(m.path / "step_7.tmp" / "model.bin", size, seed=4)
    wait_for("half the upload to reach the bucket", lambda: proxy.bytes_up >= 20 * MiB)
    os.kill(m.status()["pid"], signal.SIGKILL)
    wait_for("the mount to be dead", lambda: mount_is_dead(m.path))
    proxy.set_mode("pass", rate=0)
    m.options["upload_delay"] = 3600  # nothing starts on its own after the restart: the rename comes first
    m.start()
    (m.path / "step_7.tmp").rename(m.path / "step_7")
    proxy.bytes_up = 0
    m.flush()  # the upload resumes under step_7.tmp/, then the object is copied to step_7/
    wait_for("the old key to be deleted", lambda: m.keys() == [m.key("step_7/model.bin")])
    assert m.object_sha256("step_7/model.bin") == digest
    assert proxy.bytes_up < 0.7 * size, proxy.bytes_up  # the parts in the bucket were not sent again
    assert m.s3.client().list_multipart_uploads(Bucket=m.bucket).get("Uploads", []) == []


def test_options_reach_the_daemon(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(temporary_dir_patterns="wip-*", upload_delay=0.1)
    (m.path / "wip-1").mkdir()
    (m.path / "x.tmp").mkdir()
    write_random(m.path / "wip-1" / "f", 100, seed=1)
    write_random(m.path / "x.tmp" / "f", 100, seed=2)
    m.flush("x.tmp")  # not a temporary name here: drains as any file
    wait_for("the file under wip-1 to be held", lambda: m.status()["temporary_held_files"] == 1)
    assert m.keys() == [m.key("x.tmp/f")]
