"""What the services ask of the object store, as Protocols: the drain, the fetcher, the listings and
the lifecycle are written against these, not against boto3's `store.Store`.

Why: the drain's state machine (retries, resumed and abandoned multipart uploads, a cache file that
cannot be read) and the services' handling of a store that fails or hangs must be testable in
milliseconds with faults injected at any step (tests/support/memstore.py, as mountpoint-s3 has its
mock and failure clients), while the SeaweedFS tests stay the proof that the product works. Each
Protocol names exactly the methods its users call, so a second implementation knows what it owes.

Every method blocks and runs in a worker thread (threads.py); every failure is a `StoreError`.
`read_json` is the one way a small JSON object (a manifest, a lease, a node record) is read with its
ETag, for the conditional write that replaces it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Protocol

from .objects import NO_OBJECT, Listing, NoncurrentVersions, ObjectInfo, RemotePart, StoreError
from .storageclass import ArchiveState


class ObjectStore(Protocol):
    """The drain (uploads, copies, deletes, `dir/` markers), the fetcher (ranged reads) and the listings."""

    bucket: str
    # time.monotonic() of the last request the store answered with success (0 before any): news that it
    # answers, whoever asked (remote.py clears "the store does not answer" with it); written by worker threads
    answered_at: float

    def list(self, prefix: str, recursive: bool = False, on_page: Callable[[], None] | None = None) -> Listing: ...

    def put_object(self, key: str, fd: int, size: int, crc32: str, metadata: dict[str, str], *, if_match: str | None = None,
                   if_none_match: bool = False) -> str: ...

    def put_object_body(self, key: str, body: bytes, crc32: str, metadata: dict[str, str], *, if_match: str | None = None,
                        if_none_match: bool = False) -> str: ...

    def create_multipart(self, key: str, metadata: dict[str, str]) -> str: ...

    def upload_part(self, key: str, upload_id: str, number: int, fd: int, offset: int, length: int, crc32: str) -> str: ...

    def list_parts(self, key: str, upload_id: str) -> dict[int, RemotePart]: ...

    def complete(self, key: str, upload_id: str, parts: list[tuple[int, str, str]], *, if_match: str | None = None,
                 if_none_match: bool = False) -> str: ...

    def abort(self, key: str, upload_id: str) -> None: ...

    def list_uploads(self, prefix: str) -> list[tuple[str, str, float]]: ...

    def copy(self, src: str, dst: str, size: int, part_size: int, multipart_threshold: int, *, if_match: str | None = None,
             if_none_match: bool = False) -> str: ...

    def delete(self, key: str) -> None: ...

    def delete_if_match(self, key: str, etag: str) -> None: ...

    def put_marker(self, key: str) -> None: ...

    def read_range(self, key: str, etag: str, start: int, length: int, fd: int) -> dict[str, str]: ...

    def archive_state(self, key: str) -> ArchiveState: ...


class LifecycleStore(ObjectStore, Protocol):
    """What the lifecycle (and replication) ask besides: small objects (manifests, leases, audit records),
    ranged reads into memory, streamed and cross-bucket copies, and the bucket's governance (object lock
    and legal holds, tags, lifecycle rules, versioning, restores)."""

    def get_bytes(self, key: str) -> tuple[bytes, str]: ...

    def put_bytes(self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None,
                  content_type: str = "application/json") -> str: ...

    def head_object(self, key: str) -> ObjectInfo: ...

    def get_range(self, key: str, etag: str, start: int, length: int) -> bytes: ...

    def get_range_into(self, key: str, etag: str, start: int, view: memoryview) -> None: ...

    def put_object_from(self, key: str, view: memoryview, crc32: str, metadata: dict[str, str]) -> str: ...

    def upload_part_from(self, key: str, upload_id: str, number: int, view: memoryview, crc32: str) -> str: ...

    def copy_from(self, src_bucket: str, src_key: str, src_etag: str, dst: str, size: int, metadata: dict[str, str],
                  part_size: int, multipart_threshold: int) -> str: ...

    def storage_state(self, key: str) -> tuple[str, str]: ...

    def object_lock_enabled(self) -> bool: ...

    def set_legal_hold(self, key: str, on: bool, version_id: str | None = None) -> None: ...

    def legal_hold(self, key: str, version_id: str | None = None) -> bool: ...

    def get_tags(self, key: str) -> dict[str, str]: ...

    def put_tags(self, key: str, tags: dict[str, str]) -> None: ...

    def lifecycle_rules(self) -> list[dict[str, Any]]: ...

    def set_lifecycle_rules(self, rules: list[dict[str, Any]]) -> None: ...

    def versioning(self) -> str: ...

    def noncurrent(self, prefix: str) -> NoncurrentVersions: ...

    def restore(self, key: str, days: int, tier: str) -> bool: ...


def read_json(store: LifecycleStore, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object stored at `key` and its ETag; (None, None) if there is no such object.

    A body that is not a JSON object reads as {} with its ETag: the object is there (written by
    another version, or damaged), and a conditional write over it needs that ETag. A blocking
    store call: run it in a worker thread. Other store errors propagate."""
    try:
        body, etag = store.get_bytes(key)
    except StoreError as e:
        if e.kind == NO_OBJECT:
            return None, None
        raise
    try:
        doc = json.loads(body)
    except ValueError:
        doc = {}
    return (doc if isinstance(doc, dict) else {}), etag
