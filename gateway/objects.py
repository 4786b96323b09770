"""What the object store answers, as plain data: objects, listings, and how a call failed.

`store.py` makes these from boto3's answers; the rest of the daemon passes them around
(the namespace merges a `Listing`, the drainer and the fetcher decide on a `StoreError`'s
kind). They live here, below the store, so that code can take them without importing
boto3 or the store itself.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

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
