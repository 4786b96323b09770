"""An object store in memory, with faults on demand: the `storeapi.ObjectStore` the drain, the fetcher and
the listings are unit-tested against (mountpoint-s3 has its mock and failure clients for the same reason).

It lives under tests/ because only tests use it: the product always talks to a real store (store.Store),
and a fake in the wheel would be code no user runs, placed in the layers for nothing. It is never proof that
the product works: the SeaweedFS tests are.

What it keeps as S3 does: a part or object whose bytes do not match the CRC32 sent is refused (BadDigest),
CompleteMultipartUpload checks each part's ETag, a ranged read with another ETag fails (CHANGED), an aborted
or completed upload is gone (NO_UPLOAD). Faults, each armed for the next matching call(s):

* `fail(op, kind)`: the call raises StoreError(kind) (SERVER is a 5xx or SlowDown, NETWORK a timeout);
* `hang(op)`: the call blocks (in its worker thread) until `release()`; `hung(op)` tells when one has;
* `crash(op)`: a crash point: the call blocks for ever, as a daemon killed there would never see its answer
  (the test then stops the drain, reopens the journal and starts another: what survives is what was committed);
  with `after=True` the store carries the request out first (the upload is created, the object completed) and
  only the answer is lost: a crash between that step and the journal's record of it.

Calls are counted in `calls` (op -> list of argument tuples), for assertions on what was sent.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from ckptfs.objects import CHANGED, NO_OBJECT, NO_UPLOAD, OTHER, PRECONDITION, Listing, ObjectInfo, RemoteObject, RemotePart, StoreError, crc32_b64
from ckptfs.storageclass import ArchiveState


@dataclass
class StoredObject:
    body: bytes
    etag: str
    metadata: dict[str, str]
    mtime: float = field(default_factory=time.time)


@dataclass
class Upload:
    key: str
    metadata: dict[str, str]
    started: float
    parts: dict[int, tuple[bytes, str]] = field(default_factory=dict)  # number -> (bytes, etag)


@dataclass
class _Fault:
    op: str
    action: str  # "fail" | "hang" | "crash"
    kind: str = OTHER
    times: int = 1
    key: str | None = None
    message: str = ""
    skip: int = 0  # matching calls let through first
    after: bool = False  # a crash point after the store did the work


def _etag(body: bytes) -> str:
    return hashlib.md5(body).hexdigest()  # noqa: S324 - S3's ETag of a single PutObject, not security


class MemoryStore:
    def __init__(self, bucket: str = "ckpt") -> None:
        self.bucket = bucket
        self.clock: Callable[[], float] = time.time  # LastModified of what is written (a test moves it with its nodes')
        self.answered_at = 0.0
        self.objects: dict[str, StoredObject] = {}
        self.uploads: dict[str, Upload] = {}
        self.calls: dict[str, list[tuple[object, ...]]] = {}
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._hung: dict[str, threading.Event] = {}
        self._next_id = 0
        self._local = threading.local()  # a crash point after the work, for the call this thread is in

    # ------------------------------------------------------------ faults
    def fail(self, op: str, kind: str, times: int = 1, key: str | None = None, message: str = "") -> None:
        """The next `times` calls of `op` (on `key`, if given) raise StoreError(kind)."""
        self._faults.append(_Fault(op, "fail", kind, times, key, message or f"injected {kind} error in {op}"))

    def hang(self, op: str, times: int = 1, key: str | None = None, skip: int = 0) -> None:
        """The `times` calls of `op` after the next `skip` ones block until `release()`."""
        self._faults.append(_Fault(op, "hang", times=times, key=key, skip=skip))

    def crash(self, op: str, key: str | None = None, skip: int = 0, after: bool = False) -> None:
        """The call of `op` after the next `skip` ones never returns (it blocks until `release()`, its caller long
        gone); with `after`, once the store has done what it asked."""
        self._faults.append(_Fault(op, "crash", key=key, skip=skip, after=after))

    def hung(self, op: str) -> threading.Event:
        """Set once a call of `op` blocks on a hang or crash point."""
        with self._lock:
            return self._hung.setdefault(op, threading.Event())

    def release(self) -> None:
        """Let every blocked call go on (a test's cleanup: abandoned threads end)."""
        self._release.set()

    def _enter(self, op: str, key: str, *args: object) -> None:
        with self._lock:
            self.calls.setdefault(op, []).append((key, *args))
            fault = next((f for f in self._faults if f.op == op and f.key in (None, key) and f.times > 0), None)
            if fault is not None and fault.skip:
                fault.skip -= 1
                fault = None
            elif fault is not None:
                fault.times -= 1
                if fault.times == 0:
                    self._faults.remove(fault)
            hung = self._hung.setdefault(op, threading.Event())
        if fault is None:
            return
        if fault.action == "fail":
            raise StoreError(fault.kind, fault.message)
        if fault.after:
            self._local.crash = hung
            return
        hung.set()
        self._release.wait(300)
        if fault.action == "crash":
            raise StoreError(OTHER, "crashed here: nobody waits for this answer")

    def _answered(self) -> None:
        """The store did the work: the answer goes back (and counts as one), unless a crash point is here."""
        hung = getattr(self._local, "crash", None)
        if hung is not None:
            self._local.crash = None
            hung.set()
            self._release.wait(300)
            raise StoreError(OTHER, "crashed here: nobody waits for this answer")
        self.answered_at = time.monotonic()

    # ------------------------------------------------------------ objects
    def _condition(self, key: str, if_match: str | None, if_none_match: bool) -> None:
        """As S3's conditional writes: If-None-Match on an existing key or If-Match on another ETag 412 (PRECONDITION),
        If-Match on a missing key 404 (NO_OBJECT); checked in the same step as the write."""
        obj = self.objects.get(key)
        if if_none_match and obj is not None:
            raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile")
        if if_match is not None and obj is None:
            raise StoreError(NO_OBJECT, f"object not found ({key})")
        if if_match is not None and obj is not None and obj.etag != if_match:
            raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile")

    def _put(self, key: str, body: bytes, crc32: str | None, metadata: dict[str, str]) -> str:
        if crc32 is not None and crc32 != crc32_b64(zlib.crc32(body)):
            raise StoreError(OTHER, f"BadDigest: the CRC32 sent for {key} does not match its bytes")
        etag = _etag(body)
        self.objects[key] = StoredObject(body, etag, dict(metadata), self.clock())
        return etag

    def put_object(self, key: str, fd: int, size: int, crc32: str, metadata: dict[str, str], *, if_match: str | None = None,
                   if_none_match: bool = False) -> str:
        self._enter("put_object", key, size)
        self._condition(key, if_match, if_none_match)
        etag = self._put(key, os.pread(fd, size, 0), crc32, metadata)
        self._answered()
        return etag

    def put_object_body(self, key: str, body: bytes, crc32: str, metadata: dict[str, str], *, if_match: str | None = None,
                        if_none_match: bool = False) -> str:
        self._enter("put_object_body", key, len(body))
        self._condition(key, if_match, if_none_match)
        etag = self._put(key, bytes(body), crc32, metadata)
        self._answered()
        return etag

    def put_marker(self, key: str) -> None:
        self._enter("put_marker", key)
        self._put(key, b"", None, {})
        self._answered()

    def put_bytes(self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None,
                  content_type: str = "application/json") -> str:
        """A small object, conditional as S3 makes it: If-None-Match on an existing key and If-Match on another
        ETag answer 412 (PRECONDITION), If-Match on a missing key 404 (NO_OBJECT); check and write are one step."""
        self._enter("put_bytes", key, len(body))
        with self._lock:
            obj = self.objects.get(key)
            if if_none_match and obj is not None:
                raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile")
            if if_match is not None and obj is None:
                raise StoreError(NO_OBJECT, f"{key} does not exist")
            if if_match is not None and obj is not None and obj.etag != if_match:
                raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile")
            etag = self._put(key, bytes(body), None, {})
        self._answered()
        return etag

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        self._enter("get_bytes", key)
        obj = self.objects.get(key)
        if obj is None:
            raise StoreError(NO_OBJECT, f"{key} does not exist")
        self._answered()
        return obj.body, obj.etag

    def head_object(self, key: str) -> ObjectInfo:
        self._enter("head_object", key)
        obj = self.objects.get(key)
        if obj is None:
            raise StoreError(NO_OBJECT, f"{key} does not exist")
        self._answered()
        return ObjectInfo(len(obj.body), obj.etag, None, dict(obj.metadata), obj.mtime)

    def delete(self, key: str) -> None:
        self._enter("delete", key)
        self.objects.pop(key, None)
        self._answered()

    def delete_if_match(self, key: str, etag: str) -> None:
        """As S3's DeleteObject with If-Match: another ETag 412 (PRECONDITION), a missing key 404 (NO_OBJECT)."""
        self._enter("delete_if_match", key)
        with self._lock:
            obj = self.objects.get(key)
            if obj is None:
                raise StoreError(NO_OBJECT, f"{key} does not exist")
            if obj.etag != etag:
                raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile")
            del self.objects[key]
        self._answered()

    def copy(self, src: str, dst: str, size: int, part_size: int, multipart_threshold: int, *, if_match: str | None = None,
             if_none_match: bool = False) -> str:
        self._enter("copy", src, dst)
        obj = self.objects.get(src)
        if obj is None:
            raise StoreError(NO_OBJECT, f"{src} does not exist")
        self._condition(dst, if_match, if_none_match)
        self.objects[dst] = StoredObject(obj.body, obj.etag, dict(obj.metadata), self.clock())
        self._answered()
        return obj.etag

    def read_range(self, key: str, etag: str, start: int, length: int, fd: int) -> dict[str, str]:
        self._enter("read_range", key, start, length)
        obj = self.objects.get(key)
        if obj is None:
            raise StoreError(NO_OBJECT, f"{key} does not exist")
        if obj.etag != etag:
            raise StoreError(CHANGED, f"{key} changed: etag {obj.etag}, not {etag}")
        os.pwrite(fd, obj.body[start:start + length], start)
        self._answered()
        return dict(obj.metadata)

    def archive_state(self, key: str) -> ArchiveState:
        self._enter("archive_state", key)
        self._answered()
        return ArchiveState()

    def list(self, prefix: str, recursive: bool = False, on_page: Callable[[], None] | None = None) -> Listing:
        self._enter("list", prefix, recursive)
        dirs: list[str] = []
        objects: list[RemoteObject] = []
        marker = False
        for key in sorted(self.objects):
            if not key.startswith(prefix):
                continue
            name = key[len(prefix):]
            if not name:
                marker = True
                continue
            if not recursive and "/" in name:
                first = name.split("/", 1)[0]
                if first not in dirs:
                    dirs.append(first)
                continue
            obj = self.objects[key]
            objects.append(RemoteObject(name, len(obj.body), obj.etag, obj.mtime))
        if on_page is not None:
            on_page()
        self._answered()
        return Listing(dirs, objects, marker)

    # ------------------------------------------------------------ multipart
    def _upload(self, upload_id: str) -> Upload:
        upload = self.uploads.get(upload_id)
        if upload is None:
            raise StoreError(NO_UPLOAD, f"NoSuchUpload: {upload_id}")
        return upload

    def create_multipart(self, key: str, metadata: dict[str, str]) -> str:
        self._enter("create_multipart", key)
        with self._lock:
            self._next_id += 1
            upload_id = f"upload-{self._next_id}"
        self.uploads[upload_id] = Upload(key, dict(metadata), time.time())
        self._answered()
        return upload_id

    def upload_part(self, key: str, upload_id: str, number: int, fd: int, offset: int, length: int, crc32: str) -> str:
        self._enter("upload_part", key, upload_id, number)
        upload = self._upload(upload_id)
        body = os.pread(fd, length, offset)
        if crc32 != crc32_b64(zlib.crc32(body)):
            raise StoreError(OTHER, f"BadDigest: the CRC32 sent for part {number} of {key} does not match its bytes")
        etag = _etag(body)
        upload.parts[number] = (body, etag)
        self._answered()
        return etag

    def list_parts(self, key: str, upload_id: str) -> dict[int, RemotePart]:
        self._enter("list_parts", key, upload_id)
        upload = self._upload(upload_id)
        self._answered()
        return {n: RemotePart(etag, len(body)) for n, (body, etag) in upload.parts.items()}

    def complete(self, key: str, upload_id: str, parts: list[tuple[int, str, str]], *, if_match: str | None = None,
                 if_none_match: bool = False) -> str:
        self._enter("complete", key, upload_id)
        upload = self._upload(upload_id)
        self._condition(key, if_match, if_none_match)
        body = b""
        for n, etag, _crc in parts:
            have = upload.parts.get(n)
            if have is None or have[1] != etag:
                raise StoreError(OTHER, f"InvalidPart: part {n} of {key} is not the one uploaded")
            body += have[0]
        del self.uploads[upload_id]
        etag = f"{_etag(b''.join(bytes.fromhex(e) for _, e, _ in parts))}-{len(parts)}"
        self.objects[key] = StoredObject(body, etag, dict(upload.metadata), self.clock())
        self._answered()
        return etag

    def abort(self, key: str, upload_id: str) -> None:
        self._enter("abort", key, upload_id)
        self.uploads.pop(upload_id, None)
        self._answered()

    def list_uploads(self, prefix: str) -> list[tuple[str, str, float]]:
        self._enter("list_uploads", prefix)
        self._answered()
        return [(u.key, i, u.started) for i, u in self.uploads.items() if u.key.startswith(prefix)]
