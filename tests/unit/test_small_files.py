"""What one small file costs the daemon, counted (requests, SQL statements), never timed.

bench/small_files.py measures the time; these pin down the counts it depends on: the kernel
is told once that FLUSH is not needed, and the drainer's bookkeeping per upload is a fixed
number of statements whatever the number of files waiting.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import zlib
import time
from pathlib import Path

import pytest
import trio

from ckptfs.fs import CkptFS
from ckptfs.fuse import abi
from ckptfs.fuse import messages as P
from ckptfs.fuse.handlers import RequestHandlers
from ckptfs.fuse.iomode import IoModes
from ckptfs.fuse.ops import RequestContext
from ckptfs.journal import DURABLE, ROOT_INODE, Journal, UploadRecord
from ckptfs.objects import crc32_b64
from ckptfs.upload import Abandoned, read_whole
from tests.unit.test_encryption import store
from tests.unit.test_fuse_protocol import request
from tests.unit.test_journal import make_ns, write_file
from tests.unit.test_upload_queue import _statements, assert_in_step, take_all


def _error_of(parts: list[object]) -> int:
    """The errno of an encoded reply (0 for success)."""
    header = bytes(parts[0])[: abi.OUT_HEADER.size]
    return -abi.OUT_HEADER.unpack(header)[1]


def test_flush_is_answered_enosys_so_the_kernel_stops_sending_it(tmp_path: Path) -> None:
    # durability = local: fs.py has nothing to do at close(2): ENOSYS sets the kernel's no_flush, one request less per
    # close (with durability = peer a writer's close waits for the peers: tests/integration/test_peers_replicate.py)
    fs = CkptFS(make_ns(tmp_path), None, None, "")  # type: ignore[arg-type]  # FLUSH needs neither fetcher nor remote
    assert fs.peers is None
    handlers = RequestHandlers(fs, IoModes(lambda fd: 0, lambda i: None, enabled=False))
    req = P.parse_request(request(abi.Op.FLUSH, struct.pack("<QIIQ", 5, 0, 0, 77)))

    async def flush() -> int:
        try:
            parts, _ = await handlers.handle(req)
        except OSError as e:
            return e.errno or 0
        return _error_of(parts)
    assert trio.run(flush) == errno.ENOSYS


# ------------------------------------------------------------ the drainer's bookkeeping per upload
def _upload_statements(tmp_path: Path, waiting: int) -> int:
    """SQL statements the drainer runs on the trio thread for one small file: take, ticket, check, durable."""
    tmp_path.mkdir()
    ns = make_ns(tmp_path, upload_delay=0)
    d = ns.tree.mkdir(ns.tree.mkdir(ROOT_INODE, "a", 0o755, 0, 0).ino, "b", 0o755, 0, 0)
    for i in range(waiting):
        write_file(ns, d.ino, f"f{i}", b"x")
    take_all(ns, time.time() + 10)
    ino = write_file(ns, d.ino, "new", b"y")

    def upload() -> None:
        t = ns.uploads.begin_upload(ino)
        assert t is not None and ns.uploads.publishable(t)
        assert ns.uploads.finish_upload(t, "e", "h")
        ns.uploads.upload_ended(ino)
    count = _statements(ns, upload)
    row = ns.journal.get(ino)
    assert row is not None and row.state == DURABLE
    assert [r.state for r in (ns.journal.get(d.ino), ns.journal.get(d.parent or 0))] == [DURABLE, DURABLE]
    assert_in_step(ns)
    return count


def test_an_upload_costs_a_few_statements_however_many_files_wait(tmp_path: Path) -> None:
    few, many = _upload_statements(tmp_path / "few", 3), _upload_statements(tmp_path / "many", 300)
    assert few == many
    # no path walk to check the ticket (no rename since it was taken), one statement for the
    # directories above, no DELETE of multipart rows a small file never had
    assert few <= 11


def test_a_ticket_whose_key_the_drainer_switched_checks_its_path_again(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    t = ns.uploads.begin_upload(a)
    assert t is not None and ns.uploads.still_current(t)
    t.key = "p/old-name"  # resumed under the key of an upload from before a rename (drain._multipart)
    assert ns.uploads.publishable(t) and not ns.uploads.still_current(t)


def test_a_rename_makes_tickets_taken_before_it_check_their_paths(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    t = ns.uploads.begin_upload(a)
    assert t is not None
    ns.tree.rename(ROOT_INODE, "a", ROOT_INODE, "b", noreplace=False)
    b = write_file(ns, ROOT_INODE, "a", b"2")  # another file takes the old name
    assert b != a and not ns.uploads.publishable(t)


def test_multipart_rows_are_known_across_a_rollback_and_a_reopen(tmp_path: Path) -> None:
    ns = make_ns(tmp_path)
    a = write_file(ns, ROOT_INODE, "a", b"1")
    j = ns.journal
    j.start_upload(UploadRecord(a, "p/a", "id", 5, 10, "h", 1.0, {}))
    j.record_part(a, 1, "e1", "c1")
    with pytest.raises(RuntimeError):
        with j.transaction():
            j.forget_upload(a)
            raise RuntimeError("rolled back")
    rec = j.upload_of(a)
    assert rec is not None and rec.parts == {1: ("e1", "c1")}
    j.close()
    j2 = Journal(tmp_path / "journal.sqlite3", "ckpt", "p")
    j2.forget_upload(a)  # known from the rows, not from memory
    assert j2.upload_of(a) is None and j2.db.execute("SELECT COUNT(*) FROM parts").fetchone()[0] == 0
    j2.close()


# ------------------------------------------------------------ a small file's PutObject
def test_a_small_file_is_sent_as_the_bytes_it_was_hashed_from_with_the_mounts_encryption(tmp_path: Path) -> None:
    s, stub = store(sse="aws:kms", sse_kms_key_id="k1")
    body = os.urandom(1000)
    crc = crc32_b64(zlib.crc32(body))
    stub.add_response("put_object", {"ETag": '"e1"'}, {
        "Bucket": "ckpt", "Key": "a/f", "Body": body, "ContentLength": 1000, "ChecksumCRC32": crc,
        "Metadata": {"xxh3": "h"}, "ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "k1"})
    assert s.put_object_body("a/f", body, crc, {"xxh3": "h"}) == "e1"
    stub.assert_no_pending_responses()


def test_read_whole_reads_the_cache_file_and_a_truncated_one_is_abandoned(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 5000)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert read_whole(fd, 5000) == b"x" * 5000
        assert read_whole(fd, 0) == b""
        with pytest.raises(Abandoned):
            read_whole(fd, 6000)
    finally:
        os.close(fd)


# ------------------------------------------------------------ create + write + close through fs.py
class _Fresh:
    async def refresh(self, ino: int) -> None:
        return None  # every listing fresh: the journal alone answers


def _create_statements(tmp_path: Path, waiting: int) -> list[str]:
    """SQL of one LOOKUP (a new name), CREATE, RELEASE and the directory's GETATTR, with `waiting` files not uploaded."""
    tmp_path.mkdir()
    ns = make_ns(tmp_path, upload_delay=3600)
    fs = CkptFS(ns, None, _Fresh(), "")  # type: ignore[arg-type]
    d = ns.tree.mkdir(ROOT_INODE, "small", 0o755, 0, 0)
    ctx = RequestContext(0, 0, 1)
    for i in range(waiting):
        write_file(ns, d.ino, f"f{i}", b"x")
    seen: list[str] = []
    ns.journal.db.set_trace_callback(seen.append)
    try:
        with pytest.raises(OSError):
            trio.run(fs.lookup, d.ino, b"new", ctx)
        reply, attr = trio.run(fs.create, d.ino, b"new", stat.S_IFREG | 0o644, os.O_WRONLY, ctx)
        assert reply.passthrough_fd is not None
        fs.opened(reply.fh, True)
        os.pwrite(reply.passthrough_fd, b"y", 0)  # the kernel writing the cache file (passthrough)
        trio.run(fs.release, reply.fh)
        trio.run(fs.getattr, d.ino, None, ctx)
    finally:
        ns.journal.db.set_trace_callback(None)
    row = ns.journal.get(attr.ino)
    assert row is not None and row.atime is not None and row.closed_at is not None and row.size == 1
    return seen


def test_a_create_costs_the_same_statements_however_many_files_wait_and_commits_once(tmp_path: Path) -> None:
    few, many = _create_statements(tmp_path / "few", 3), _create_statements(tmp_path / "many", 300)
    assert len(few) == len(many)
    # the create's row, its LRU atime and the directory's times in one commit; the close's size and state in one statement
    assert [s for s in few if s in ("COMMIT", "BEGIN IMMEDIATE")] == ["BEGIN IMMEDIATE", "COMMIT"]
    assert len([s for s in few if s.startswith(("UPDATE", "INSERT"))]) == 3


def test_the_store_client_skips_botocores_parameter_validation() -> None:
    s, _ = store()
    assert type(s.client._serializer).__name__ != "ParamValidationDecorator"  # botocore wraps the serializer to validate
