"""What the object store answers, as plain data: objects, listings, and how a call failed.

`store.py` makes these from boto3's answers; the rest of the daemon passes them around
(the namespace merges a `Listing`, the drainer and the fetcher decide on a `StoreError`'s
kind). They live here, below the store, so that code can take them without importing
boto3 or the store itself. So does the one way ckptfs writes a JSON object into a bucket
(`json_document`): the lifecycle, replication and the Python API all need it.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from typing import Any

from isal.isal_zlib import crc32 as _isal_crc32

# kinds of failure
NETWORK = "network"  # unreachable, timed out, connection reset: retry
SERVER = "server"  # 5xx, SlowDown: retry
AUTH = "auth"  # bad credentials or no permission: retry slowly, report loudly
NO_BUCKET = "no-bucket"  # retry slowly, report loudly
NO_UPLOAD = "no-upload"  # the multipart upload is gone: start a new one
NO_OBJECT = "no-object"  # the key does not exist (deleted by someone else)
CHANGED = "changed"  # the object's ETag is not the one the read started from
ARCHIVED = "archived"  # the object is in an archive storage class: restore it first (ckptfs restore PATH)
PRECONDITION = "precondition"  # a conditional write found the object not as required (exists already, or another ETag)
OTHER = "other"


class StoreError(Exception):
    def __init__(self, kind: str, message: str, denied: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.denied = denied  # AUTH because the credentials are valid but lack the permission (AccessDenied)


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """zlib's CRC32 (S3's ChecksumCRC32) computed by ISA-L: a fifth of zlib's CPU per byte, with the GIL released."""
    return _isal_crc32(data, value)


def crc32_b64(crc: int) -> str:
    """S3's ChecksumCRC32 encoding: base64 of the big-endian 4-byte value."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


@dataclass
class RemotePart:
    etag: str
    size: int


@dataclass
class RemoteObject:
    """An object as a listing shows it; `name` is relative to the listed prefix."""

    name: str
    size: int
    etag: str
    mtime: float
    storage_class: str = "STANDARD"


@dataclass
class ObjectInfo:
    """An object as HeadObject shows it."""

    size: int
    etag: str
    version_id: str | None
    metadata: dict[str, str]
    modified: float = 0.0  # LastModified (wall clock, seconds): a takeover never overwrites an object written after its replica


@dataclass
class Listing:
    dirs: list[str]  # common prefixes, without the trailing '/'
    objects: list[RemoteObject]
    marker: bool  # the `prefix` object itself (an empty directory's marker) exists


@dataclass
class NoncurrentVersions:
    """Noncurrent versions and delete markers under a prefix of a versioned bucket."""

    objects: int = 0
    bytes: int = 0
    delete_markers: int = 0
    by_class: dict[str, int] = field(default_factory=dict)


def finite(value: Any) -> Any:
    """`value` with every float that is not finite (NaN, +-Infinity) replaced by None, in dicts and lists at any depth.

    JSON has no NaN: Python's json writes the token `NaN`, which strict parsers (and other tools reading a
    manifest) reject. A diverged loss is a common piece of checkpoint metadata, so it is stored as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_document(doc: Any, indent: int | None = None) -> bytes:
    """A JSON object ckptfs writes into a bucket: valid JSON whatever the floats in it (see `finite`), keys sorted.

    `allow_nan=False` after `finite`: a value that still is not JSON fails here, loudly, not in a reader."""
    return json.dumps(finite(doc), indent=indent, sort_keys=True, allow_nan=False).encode()
