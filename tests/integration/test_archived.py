"""Reading checkpoints in an archive storage class (GLACIER): a clear refusal naming `ckptfs restore PATH`.

SeaweedFS keeps the StorageClass given at PUT and reports it in listings and HEAD, but never
archives: the fault proxy in front of it (tests/support/faultproxy.py) answers as AWS does for
the objects a test archives (GET: 403 InvalidObjectState; RestoreObject: 202, then HEAD says
the restore is ongoing; `proxy.restored` finishes it). The mount and the server are real.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
from typing import Any

import pytest
import xxhash

from tests.conftest import Mount, sha256_file
from tests.support.faultproxy import FaultProxy

STATE = "user.ckptfs.state"


def put(m: Mount, rel: str, data: bytes, storage_class: str = "STANDARD") -> str:
    """An object as another node's upload leaves it (with its xxh3), in `storage_class`; its sha256."""
    m.s3.client().put_object(Bucket=m.bucket, Key=m.key(rel), Body=data, StorageClass=storage_class,
                             Metadata={"xxh3": xxhash.xxh3_128(data).hexdigest()})
    return hashlib.sha256(data).hexdigest()


def log_of(m: Mount) -> str:
    return (m.cache_dir / "ckptfs.log").read_text(errors="replace")


def refused_open(path: Any) -> OSError:
    with pytest.raises(OSError) as e:
        with open(path, "rb") as f:
            f.read()
    return e.value


def test_archived_file_is_refused_at_open_naming_the_restore_then_reads_once_restored(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(start=False, endpoint_url=proxy.url)
    data = random.Random(1).randbytes(3 << 20)
    sha = put(m, "run/step_1/model.pt", data, "GLACIER")
    put(m, "run/step_1/config.json", b'{"lr": 0.1}')
    proxy.archive(m.bucket, m.key("run/step_1/model.pt"))
    m.start()
    path = m.path / "run/step_1/model.pt"

    assert os.stat(path).st_size == len(data)  # the tree shows it as ever
    err = refused_open(path)
    # ENOMEDIUM ("No medium found"): the bytes are on a medium that is not online; never a bare EIO
    assert err.errno == errno.ENOMEDIUM, err
    assert os.getxattr(path, STATE) == b"archived"
    st = m.status()
    assert st["last_error"] == f"{path}: archived in GLACIER: run ckptfs restore {path}"
    assert st["last_error_age_seconds"] is not None
    assert refused_open(path).errno == errno.ENOMEDIUM  # again: one log line per file per minute
    assert log_of(m).count(f"archived in GLACIER: run ckptfs restore {path}") == 1
    assert m.status()["archived_reads_refused_total"] == 2
    # the objects around it read as ever
    assert (m.path / "run/step_1/config.json").read_bytes() == b'{"lr": 0.1}'

    # the restore: requested, reported in progress; the file says so and is still refused
    proc = m.cli("restore", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"ckptfs: {path}: 0 of 1 archived objects restored, 1 in progress (1 requested now); "
                                   f"run `ckptfs restore {path} --wait` to follow")
    assert proxy.archive_state(m.bucket, m.key("run/step_1/model.pt")) == "ongoing"
    assert os.getxattr(path, STATE) == b"restoring"
    assert refused_open(path).errno == errno.ENOMEDIUM
    assert "being restored from GLACIER" in m.status()["last_error"]
    again = m.cli("restore", str(path), "--json")  # asked again: not requested twice
    assert again.returncode == 0 and json.loads(again.stdout)["requested"] == 0 and json.loads(again.stdout)["ongoing"] == 1

    # the store finishes it: restore reports it, and the file reads back whole
    proxy.restored(m.bucket, m.key("run/step_1/model.pt"))
    done = m.cli("restore", str(path))
    assert done.returncode == 0 and done.stdout.strip() == f"ckptfs: {path}: all 1 archived objects are restored and readable"
    assert sha256_file(path) == sha
    assert os.getxattr(path, STATE) == b"durable"


def test_a_read_the_store_refuses_as_archived_gets_enomedium_not_eio(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    # the listing said STANDARD; the object went to GLACIER after it (a lifecycle transition): only the GET tells
    m: Mount = make_mount(start=False, endpoint_url=proxy.url, metadata_ttl=3600)
    data = random.Random(2).randbytes(1 << 20)
    put(m, "run/step_2/model.pt", data)
    m.start()
    path = m.path / "run/step_2/model.pt"
    assert os.stat(path).st_size == len(data)  # listed: STANDARD
    put(m, "run/step_2/model.pt", data, "GLACIER")  # same bytes, same ETag, now archived
    proxy.archive(m.bucket, m.key("run/step_2/model.pt"))
    with open(path, "rb") as f:  # the open goes ahead: nothing said archived yet
        with pytest.raises(OSError) as e:
            f.read()
    assert e.value.errno == errno.ENOMEDIUM, e.value
    assert f"archived in GLACIER: run ckptfs restore {path}" in log_of(m)
    assert m.status()["last_error"] == f"{path}: archived in GLACIER: run ckptfs restore {path}"
    # from now on the open itself says so
    assert refused_open(path).errno == errno.ENOMEDIUM
    assert os.getxattr(path, STATE) == b"archived"
    assert m.status()["read_errors_total"] == 0  # refused, not failed


@pytest.mark.one_transport  # the catalogue and verify: store-side
def test_checkpoints_and_deep_verify_of_an_archived_checkpoint_name_the_restore(make_mount, proxy: FaultProxy) -> None:  # type: ignore[no-untyped-def]
    m: Mount = make_mount(endpoint_url=proxy.url)
    ck = m.path / "run/step_3"
    ck.mkdir(parents=True)
    (ck / "model.pt").write_bytes(random.Random(3).randbytes(1 << 20))
    m.flush()
    commit = m.cli("checkpoint", "commit", str(ck))
    assert commit.returncode == 0, commit.stderr
    # a lifecycle rule moves the file to GLACIER (same bytes and ETag)
    key = m.key("run/step_3/model.pt")
    got = m.s3.client().get_object(Bucket=m.bucket, Key=key)
    m.s3.client().put_object(Bucket=m.bucket, Key=key, Body=got["Body"].read(), Metadata=got["Metadata"], StorageClass="GLACIER")
    proxy.archive(m.bucket, key)

    listed = m.cli("checkpoints", str(m.path / "run"))
    assert listed.returncode == 0, listed.stderr
    assert f"ckptfs restore {ck} " in listed.stdout
    shallow = m.cli("verify", str(ck))  # names, sizes, ETags: no read, no restore needed
    assert shallow.returncode == 0, shallow.stderr
    deep = m.cli("verify", "--deep", str(ck))
    assert deep.returncode != 0
    assert deep.stderr.strip().count("\n") == 0 and deep.stdout == ""
    assert f"run ckptfs restore {ck}," in deep.stderr and "archived in GLACIER" in deep.stderr

    # restore of the whole checkpoint directory: its archived objects only (the manifest is STANDARD)
    whole = m.cli("restore", str(ck))
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.strip() == (f"ckptfs: {ck}: 0 of 1 archived objects restored, 1 in progress (1 requested now); "
                                    f"run `ckptfs restore {ck} --wait` to follow")
    assert proxy.archive_state(m.bucket, key) == "ongoing"
    missing = m.cli("restore", str(m.path / "run/step_9"))
    assert missing.returncode != 0 and missing.stdout == ""
    assert missing.stderr.strip() == f"ckptfs: error: {m.path / 'run/step_9'}: no such file or directory"
