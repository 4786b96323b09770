"""Server-side encryption of a mount's objects: which mode, and the request parameters each S3 call needs.

Three modes (docs/security.md), chosen by the options `sse`, `sse_kms_key_id`, `sse_c_key_file`:

* SSE-S3 (`sse = "AES256"`): the store encrypts with its own keys; only requests that create
  an object (PutObject, CreateMultipartUpload, CopyObject) say so.
* SSE-KMS (`sse = "aws:kms"`, `sse_kms_key_id`): the same, with a KMS key named by id or ARN.
* SSE-C (`sse_c_key_file`): the store encrypts with a 256-bit key we send on every request that
  touches the object's bytes or metadata: PUT, multipart create / upload part / complete, GET
  (ranged or whole), HEAD, and the copy source of CopyObject and UploadPartCopy. The key file
  holds 32 raw bytes or their base64, must be a regular file owned by the mounting user and
  readable by nobody else; anything else is refused with one line.

The key lives only in this object (never in `repr`, `describe`, logs, status, metrics or
errors): `describe()` names the mode and the key file, nothing more. botocore computes the key's
MD5 and base64 from the raw bytes itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from typing import Any

SSE_S3 = "AES256"
SSE_KMS = "aws:kms"
MODES = ("", SSE_S3, SSE_KMS)
KEY_BYTES = 32
_HEADERS = {  # boto3's parameter -> the header it becomes (the S3 API reference)
    "ServerSideEncryption": "x-amz-server-side-encryption",
    "SSEKMSKeyId": "x-amz-server-side-encryption-aws-kms-key-id",
    "SSECustomerAlgorithm": "x-amz-server-side-encryption-customer-algorithm",
}


class EncryptionError(ValueError):
    """The encryption settings cannot be used; the message is one line naming the problem and the fix."""


def read_key_file(path: str) -> bytes:
    """The SSE-C key in `path` (32 raw bytes or their base64); refused unless owner-only readable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise EncryptionError(f"sse_c_key_file {path}: cannot open it ({e.strerror}): give a readable file holding a 256-bit key") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise EncryptionError(f"sse_c_key_file {path} is not a regular file: give a file holding a 256-bit key")
        if st.st_uid != os.getuid():
            raise EncryptionError(f"sse_c_key_file {path} belongs to uid {st.st_uid}, not to the mounting user (uid {os.getuid()}): chown it")
        if st.st_mode & 0o077:
            raise EncryptionError(f"sse_c_key_file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    if len(data) == KEY_BYTES:
        return data
    try:
        key = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise EncryptionError(f"sse_c_key_file {path} does not hold a 256-bit key: write 32 random bytes or their base64 "
                              "(head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE)")
    return key


class Encryption:
    """The request parameters of one mount's encryption mode."""

    def __init__(self, sse: str = "", kms_key_id: str = "", key_file: str = "") -> None:
        if sse not in MODES:
            raise EncryptionError(f"sse = {sse!r}: use \"\" (none or the bucket's default), \"AES256\" (SSE-S3) or \"aws:kms\" (SSE-KMS)")
        if key_file and sse:
            raise EncryptionError(f"sse = {sse!r} and sse_c_key_file are both set: choose one (SSE-C uses only sse_c_key_file)")
        if kms_key_id and sse != SSE_KMS:
            raise EncryptionError("sse_kms_key_id is set but sse is not \"aws:kms\": set sse = \"aws:kms\" or drop the key id")
        self.sse, self.kms_key_id, self.key_file = sse, kms_key_id, key_file
        self.__key = read_key_file(key_file) if key_file else b""

    @classmethod
    def from_config(cls, cfg: Any) -> "Encryption":
        return cls(cfg.sse, cfg.sse_kms_key_id, cfg.sse_c_key_file)

    @property
    def mode(self) -> str:
        if self.key_file:
            return "SSE-C"
        return {SSE_S3: "SSE-S3", SSE_KMS: "SSE-KMS"}.get(self.sse, "none")

    def describe(self) -> dict[str, str]:
        """What `status` shows: the mode and where the key comes from, never the key."""
        out = {"mode": self.mode}
        if self.kms_key_id:
            out["kms_key_id"] = self.kms_key_id  # an id or ARN, not key material
        if self.key_file:
            out["key_file"] = self.key_file
        return out

    def __repr__(self) -> str:
        return f"Encryption({self.mode})"

    # -------------------------------------------------- request parameters
    def create(self) -> dict[str, Any]:
        """For requests that create an object: PutObject, CreateMultipartUpload, CopyObject's target."""
        if self.sse == SSE_S3:
            return {"ServerSideEncryption": SSE_S3}
        if self.sse == SSE_KMS:
            kw: dict[str, Any] = {"ServerSideEncryption": SSE_KMS}
            if self.kms_key_id:
                kw["SSEKMSKeyId"] = self.kms_key_id
            return kw
        return self.customer()

    def create_headers(self) -> dict[str, str]:
        """`create()` as HTTP headers, for a PutObject signed and sent without the client (store.SignedPut):
        what botocore's serializer and its SSE-C handler would put on the wire."""
        h = {_HEADERS[k]: v for k, v in self.create().items() if k != "SSECustomerKey"}
        if self.__key:
            h["x-amz-server-side-encryption-customer-key"] = base64.b64encode(self.__key).decode()
            h["x-amz-server-side-encryption-customer-key-MD5"] = base64.b64encode(hashlib.md5(self.__key).digest()).decode()
        return h

    def customer(self) -> dict[str, Any]:
        """For requests on an existing object's bytes: GET, HEAD, UploadPart, CompleteMultipartUpload (SSE-C only)."""
        if not self.__key:
            return {}
        return {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": self.__key}

    def copy_source(self) -> dict[str, Any]:
        """For the source of CopyObject and UploadPartCopy (SSE-C only)."""
        if not self.__key:
            return {}
        return {"CopySourceSSECustomerAlgorithm": "AES256", "CopySourceSSECustomerKey": self.__key}
