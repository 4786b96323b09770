"""The object store: the only package that imports boto3 (signed.py: the small PutObjects it signs itself).

Every call is blocking and meant to run in a worker thread
(`trio.to_thread.run_sync`). Part bodies are streamed from the cache file
through `RangeReader` (bodies.py), so a part is never held whole in memory.
Every failure becomes a `StoreError` (objects.py) whose message is one line a
user can act on, and whose `kind` tells the caller whether retrying can help.

`Store` is built in three layers that share one client: `BucketConnection`
(the clients, the mount's check, and `_call`, where failures are classified),
`BucketGovernance` (object lock and legal holds, tags, the bucket's lifecycle
rules and versioning, restores: what lifecycle/ asks of the bucket besides
bytes) and `Store` itself (moving bytes: uploads, listings, reads, copies).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

import boto3
import botocore.exceptions as bexc
from botocore.awsrequest import AWSRequest
from botocore.config import Config as BotoConfig

from ..bodies import RangeReader, ViewReader
from ..config import Config
from ..encryption import Encryption, EncryptionError
# lifecycle/ and replication/ still import StoreError, its kinds and Listing from here
from ..objects import (
    ARCHIVED, AUTH, CHANGED, NETWORK, NO_BUCKET, NO_OBJECT, NO_UPLOAD, OTHER, PRECONDITION, SERVER,
    Listing, NoncurrentVersions, ObjectInfo, RemoteObject, RemotePart, StoreError, crc32_b64,
)
from ..sizes import small_objects_in_flight
from ..storageclass import ArchiveState, from_head
from . import keyprobe
from .errors import classify as _classify
from .signed import EndpointMoved, ListPage, SignedList, SignedPut

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20  # bytes moved from a GET response to the cache file per system call (256 KiB costs ~20% more CPU per GiB)
CHECK_ATTEMPTS = 3  # HeadBucket attempts of the mount's check, all within mount_check_timeout; between them
CHECK_PAUSE, CHECK_MIN_WAIT = 0.5, 0.1  # a pause of this times the attempt's number, if this much is left after it
# the requests that change objects: sent once by botocore when the node is fenced by a lease (durability = peer)
FENCED_WRITES = frozenset({"PutObject", "UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload", "CopyObject",
                           "UploadPartCopy", "DeleteObject", "DeleteObjects"})
PART_READ_CHUNK = 256 << 10  # a ranged GET into a part buffer is read this much at a time (the transient copy per read)


class BucketConnection:
    """One bucket through boto3: the clients, the mount's check, and `_call`, through which every request
    goes so that every failure becomes a StoreError (and no request's parameters reach the log)."""

    def __init__(self, cfg: Config) -> None:
        self.bucket = cfg.bucket
        try:
            self.enc = Encryption.from_config(cfg)  # SSE request parameters (docs/security.md); the key never leaves it
        except EncryptionError as e:
            raise StoreError(OTHER, str(e)) from None
        try:
            session = boto3.session.Session(profile_name=cfg.profile or None, region_name=cfg.region)
        except bexc.ProfileNotFound as e:
            raise StoreError(AUTH, f"AWS profile {e.kwargs.get('profile', cfg.profile)!r} is not in ~/.aws/credentials or ~/.aws/config "
                                   "(or the files AWS_SHARED_CREDENTIALS_FILE/AWS_CONFIG_FILE name): fix -o profile=NAME") from None
        except bexc.BotoCoreError as e:
            raise StoreError(AUTH, f"the AWS configuration cannot be used: {e}") from None
        def client(read_timeout: float, attempts: int, pool: int, connect_timeout: float = cfg.connect_timeout) -> Any:
            return session.client(
                "s3",
                endpoint_url=cfg.endpoint_url or None,
                verify=cfg.ca_bundle or None,  # None: the system's CAs or AWS_CA_BUNDLE; never unverified
                config=BotoConfig(
                    connect_timeout=connect_timeout,
                    read_timeout=read_timeout,
                    # total_max_attempts: botocore's `max_attempts` counts the retries, one more request than asked
                    retries={"mode": "standard", "total_max_attempts": attempts},
                    max_pool_connections=pool,
                    s3={**({"addressing_style": "path"} if cfg.endpoint_url else {}),
                        **({} if cfg.sign_payload_over_http else {"payload_signing_enabled": False})} or None,
                    # we send our own CRC32 per part; no second pass by botocore
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    # our own calls build the parameters; checking them against the model cost ~15% of the
                    # client's CPU per request (0.2-0.25 ms of ~1.5 ms per small PutObject, measured here)
                    parameter_validation=False,
                ),
            )

        pool = cfg.max_parts_in_flight + small_objects_in_flight(cfg.max_parts_in_flight) + 8
        self.client = client(cfg.read_timeout, 3, pool)
        # durability = peer: a write to the bucket is sent once per call, never again by botocore on its own; the
        # drain and the takeover retry it, each time behind the lease check (their gate), so a node that lost its
        # lease sends no retry after (issue 42, case 7: a retry landing after a taker's newer object)
        self._writes_once = client(cfg.read_timeout, 1, pool) if cfg.durability == "peer" else None
        self._session = session
        self._sign_over_http = cfg.sign_payload_over_http
        # the mount's check has its own bound, and a client per attempt whose timeouts fit in what is left of it
        self._check_client = lambda left: client(min(cfg.mount_check_timeout / CHECK_ATTEMPTS, left), 1, 1,
                                                 connect_timeout=min(cfg.connect_timeout, left))
        self._check_timeout = cfg.mount_check_timeout
        self._endpoint = cfg.endpoint_url or "AWS S3"
        # time.monotonic() of the last request answered with success (storeapi.ObjectStore.answered_at): a float
        # stored by worker threads, read by the trio thread
        self.answered_at = 0.0

    def _call(self, what: str, fn: Any, **kw: Any) -> Any:
        # the request's name and key only: its parameters may hold an SSE-C key
        log.debug("%s %s (encryption %s)", what, kw.get("Key") or kw.get("Prefix") or "", self.enc.mode)
        if self._writes_once is not None and what in FENCED_WRITES and getattr(fn, "__self__", None) is self.client:
            fn = getattr(self._writes_once, fn.__name__)
        try:
            result = fn(Bucket=self.bucket, **kw)
            self.answered_at = time.monotonic()
            return result
        except Exception as e:  # noqa: BLE001 - every failure becomes a StoreError
            err = _classify(e, self.bucket, what)
            if err.kind == AUTH and self.enc.mode == "SSE-C" and what in ("GetObject", "HeadObject", "CopyObject", "UploadPartCopy"):
                err = StoreError(AUTH, f"{err} - or the object was written with another SSE-C key than sse_c_key_file's", err.denied)
            raise err from None

    def check(self) -> None:
        """Mount-time check: endpoint reachable, credentials valid, bucket present and ours.

        One deadline, `mount_check_timeout`, holds the whole check: CHECK_ATTEMPTS HeadBucket attempts, each
        waiting at most a third of it, and the pauses between them. botocore's retries came on top of the bound
        (its `max_attempts` of 3 is 4 requests): 42 s for "did not answer within mount_check_timeout (30 s)".
        """
        deadline = time.monotonic() + self._check_timeout
        for attempt in range(1, CHECK_ATTEMPTS + 1):
            try:
                return self._call("HeadBucket", self._check_client(deadline - time.monotonic()).head_bucket)
            except StoreError as e:
                error = e  # _call's: it came from botocore's exception (its __context__)
            pause = min(CHECK_PAUSE * attempt, deadline - time.monotonic() - CHECK_MIN_WAIT)
            if error.kind not in (NETWORK, SERVER) or attempt == CHECK_ATTEMPTS or pause < 0:
                break
            log.info("checking the bucket: %s; trying again (attempt %d of %d)", error, attempt + 1, CHECK_ATTEMPTS)
            time.sleep(pause)
        if isinstance(error.__context__, bexc.ReadTimeoutError):  # connected, and no answer in time
            raise StoreError(NETWORK, f"the object store at {self._endpoint} accepted the connection but did not answer "
                                      f"within mount_check_timeout ({self._check_timeout:g} s): it is hung or overloaded; "
                                      "check the server, or wait longer with -o mount_check_timeout=SECONDS")
        if error.kind == AUTH:
            # HEAD answers carry no error code: ask again with a request whose answer says
            # whether the credentials are wrong or only the permission is missing
            self._call("ListObjectsV2", self.client.list_objects_v2, MaxKeys=1)
        raise error


class BucketGovernance(BucketConnection):
    """What lifecycle/ asks of the bucket besides bytes: object lock and legal holds, tags, the bucket's
    lifecycle rules and versioning, noncurrent versions, restores and archive state."""

    def object_lock_enabled(self) -> bool:
        """True if the bucket was created with S3 Object Lock (legal holds are enforced)."""
        try:
            r = self._call("GetObjectLockConfiguration", self.client.get_object_lock_configuration)
        except StoreError as e:
            if e.kind in (OTHER, NO_OBJECT) and ("ObjectLockConfigurationNotFound" in str(e) or e.kind == NO_OBJECT):
                return False
            raise
        return r.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled"

    def set_legal_hold(self, key: str, on: bool, version_id: str | None = None) -> None:
        kw: dict[str, Any] = {"Key": key, "LegalHold": {"Status": "ON" if on else "OFF"}}
        if version_id:
            kw["VersionId"] = version_id
        self._call("PutObjectLegalHold", self.client.put_object_legal_hold, **kw)

    def legal_hold(self, key: str, version_id: str | None = None) -> bool:
        """Whether the object (that version of it) is under a legal hold, as the store reports it."""
        kw: dict[str, Any] = {"Key": key}
        if version_id:
            kw["VersionId"] = version_id
        try:
            r = self._call("GetObjectLegalHold", self.client.get_object_legal_hold, **kw)
        except StoreError as e:
            if e.kind in (OTHER, NO_OBJECT):
                return False  # no hold was ever set (stores answer NoSuchObjectLockConfiguration)
            raise
        return r.get("LegalHold", {}).get("Status") == "ON"

    # ------------------------------------------------------ tiers (lifecycle/tiers.py)
    def get_tags(self, key: str) -> dict[str, str]:
        r = self._call("GetObjectTagging", self.client.get_object_tagging, Key=key)
        return {t["Key"]: t["Value"] for t in r.get("TagSet", [])}

    def put_tags(self, key: str, tags: dict[str, str]) -> None:
        self._call("PutObjectTagging", self.client.put_object_tagging, Key=key,
                   Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]})

    def lifecycle_rules(self) -> list[dict[str, Any]]:
        """The bucket's lifecycle rules; [] when it has none."""
        try:
            r = self._call("GetBucketLifecycleConfiguration", self.client.get_bucket_lifecycle_configuration)
        except StoreError as e:
            if "NoSuchLifecycleConfiguration" in str(e) or e.kind == NO_OBJECT:
                return []
            raise
        return list(r.get("Rules", []))

    def set_lifecycle_rules(self, rules: list[dict[str, Any]]) -> None:
        if rules:
            self._call("PutBucketLifecycleConfiguration", self.client.put_bucket_lifecycle_configuration,
                       LifecycleConfiguration={"Rules": rules})
        else:
            self._call("DeleteBucketLifecycle", self.client.delete_bucket_lifecycle)

    def versioning(self) -> str:
        """The bucket's versioning status: "Enabled", "Suspended", or "" (never enabled)."""
        return str(self._call("GetBucketVersioning", self.client.get_bucket_versioning).get("Status") or "")

    def noncurrent(self, prefix: str) -> NoncurrentVersions:
        """What a versioned bucket keeps under `prefix` besides the current objects: noncurrent versions
        (deleted or overwritten objects, still stored and billed) and delete markers."""
        out = NoncurrentVersions()
        kw: dict[str, Any] = {"Prefix": prefix}
        while True:
            r = self._call("ListObjectVersions", self.client.list_object_versions, **kw)
            for v in r.get("Versions", []):
                if not v.get("IsLatest"):
                    cls = v.get("StorageClass") or "STANDARD"
                    out.objects += 1
                    out.bytes += int(v.get("Size") or 0)
                    out.by_class[cls] = out.by_class.get(cls, 0) + int(v.get("Size") or 0)
            out.delete_markers += len(r.get("DeleteMarkers", []))
            if not r.get("IsTruncated"):
                return out
            kw["KeyMarker"] = r.get("NextKeyMarker")
            kw["VersionIdMarker"] = r.get("NextVersionIdMarker")

    def restore(self, key: str, days: int, tier: str) -> bool:
        """Ask for an archived object to be restored for `days`; False if a restore is already under way."""
        try:
            self._call("RestoreObject", self.client.restore_object, Key=key,
                       RestoreRequest={"Days": days, "GlacierJobParameters": {"Tier": tier}})
        except StoreError as e:
            if "RestoreAlreadyInProgress" in str(e):
                return False
            raise
        return True

    def storage_state(self, key: str) -> tuple[str, str]:
        """(storage class, restore state) of an object: restore state is "", "ongoing" or "restored"."""
        st = self.archive_state(key)
        return st.storage_class, st.restore

    def archive_state(self, key: str) -> ArchiveState:
        """Storage class, intelligent tiering's archive tier and restore state of an object (HeadObject; storageclass.py)."""
        return from_head(self._call("HeadObject", self.client.head_object, Key=key, **self.enc.customer()))


class Store(BucketGovernance):
    """Moving bytes: uploads (single and multipart, streamed from the cache file), listings, ranged reads,
    server-side copies, small objects, and the streamed copies of replication."""

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self._signed: SignedPut | None = None
        self._signed_tried = False
        self._signed_probe = threading.Lock()  # one PutObject shows boto3's request; the others meanwhile go through boto3
        self._lister: SignedList | None = None  # likewise for the pages of listings
        self._lister_tried = False
        self._lister_probe = threading.Lock()

    def put_object(self, key: str, fd: int, size: int, crc32: str, metadata: dict[str, str], *, if_match: str | None = None,
                   if_none_match: bool = False) -> str:
        """PutObject streamed from the cache file; conditional with `if_match` (replace that ETag only) or
        `if_none_match` (create only): a condition not met raises StoreError(PRECONDITION), see `_conditional`."""
        r = self._conditional(
            "PutObject", self.client.put_object, key, if_match, if_none_match, Key=key, Body=RangeReader(fd, 0, size),
            ContentLength=size, ChecksumCRC32=crc32, Metadata=metadata, **self.enc.create(),
        )
        return r["ETag"].strip('"')

    def _conditional(self, what: str, fn: Any, key: str, if_match: str | None, if_none_match: bool, **kw: Any) -> Any:
        """A write that replaces only what it was judged against (publishing.py). 412 (or 409 ConditionalRequestConflict)
        is PRECONDITION: another writer got there first, the caller drops the write. If-Match on a missing key: NO_OBJECT."""
        if if_none_match:
            kw["IfNoneMatch"] = "*"
        if if_match is not None:
            kw["IfMatch"] = f'"{if_match}"'
        return self._judged(what, key, if_match is not None or if_none_match, lambda: self._call(what, fn, **kw))

    @staticmethod
    def _judged(what: str, key: str, conditional: bool, send: Callable[[], Any]) -> Any:
        try:
            return send()
        except StoreError as e:
            if conditional and (e.kind in (CHANGED, PRECONDITION) or "ConditionalRequestConflict" in str(e)):
                raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile ({what} refused: {e})") from None
            raise

    def put_object_body(self, key: str, body: bytes, crc32: str, metadata: dict[str, str], *, if_match: str | None = None,
                        if_none_match: bool = False) -> str:
        """PutObject of a small file read into memory: sent without `Expect: 100-continue` (botocore adds
        it to file-like bodies only), one round trip to the store instead of two. Conditional as `put_object`.

        The first goes through boto3, which shows where and how it signs; the rest through `SignedPut`, conditional
        ones too (under `durability = peer` every write of the drain is: drainfence.py)."""
        signed = self._signed
        if signed is not None:
            headers = {"x-amz-checksum-crc32": crc32, **{f"x-amz-meta-{k}": v for k, v in metadata.items()}, **self.enc.create_headers(),
                       **({"If-Match": f'"{if_match}"'} if if_match is not None else {}), **({"If-None-Match": "*"} if if_none_match else {})}
            try:
                return str(self._judged("PutObject", key, if_match is not None or if_none_match,
                                        lambda: self._call("PutObject", lambda Bucket, Key: signed.put(Key, body, headers), Key=key)))  # noqa: N803
            except EndpointMoved as e:
                log.info("the object store answered a PutObject with %s: learning its endpoint again through boto3", e)
                self._signed, self._signed_tried = None, False
        if self._signed_tried or not self._signed_probe.acquire(blocking=False):
            return self._put_body_boto3(key, body, crc32, metadata, if_match, if_none_match)
        try:
            return self._put_body_learning(key, body, crc32, metadata, if_match, if_none_match)
        finally:
            self._signed_probe.release()

    def _put_body_learning(self, key: str, body: bytes, crc32: str, metadata: dict[str, str], if_match: str | None,
                           if_none_match: bool) -> str:
        """A PutObject through boto3 that sets up `SignedPut` from where and how boto3 signed it (a refused one too)."""
        etag, seen = self._learning("PutObject", lambda: self._put_body_boto3(key, body, crc32, metadata, if_match, if_none_match))
        self._signed = SignedPut.from_request(self.client, self._session.get_credentials(), key, sign_over_http=self._sign_over_http,
                                              attempts=1 if self._writes_once is not None else 3, **seen) if seen else None
        self._signed_tried = True
        if self._signed is None:
            log.info("small PutObjects go through boto3: its request (%s) is not one SignedPut reproduces", seen.get("signature_version"))
        return etag

    def _learning(self, operation: str, send: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
        """`send()`'s result, and where and how boto3 signed its `operation` request (this thread's only: other
        threads' requests fire the same event meanwhile)."""
        seen: dict[str, Any] = {}
        me = threading.get_ident()

        def capture(request: AWSRequest, signing_name: str, region_name: str, signature_version: str, **_: Any) -> None:
            if threading.get_ident() == me:
                seen.update(url=request.url, signing_name=signing_name, region=region_name, signature_version=signature_version)

        event, handler = f"before-sign.s3.{operation}", f"ckptfs-signed-{operation}-{id(self)}"
        clients = [c for c in (self.client, self._writes_once) if c is not None]  # a fenced write goes by the second
        for c in clients:
            c.meta.events.register(event, capture, unique_id=handler)
        try:
            return send(), seen
        finally:
            for c in clients:
                c.meta.events.unregister(event, unique_id=handler)

    def _put_body_boto3(self, key: str, body: bytes, crc32: str, metadata: dict[str, str], if_match: str | None = None,
                        if_none_match: bool = False) -> str:
        r = self._conditional(
            "PutObject", self.client.put_object, key, if_match, if_none_match, Key=key, Body=body,
            ContentLength=len(body), ChecksumCRC32=crc32, Metadata=metadata, **self.enc.create(),
        )
        return r["ETag"].strip('"')

    def create_multipart(self, key: str, metadata: dict[str, str]) -> str:
        r = self._call("CreateMultipartUpload", self.client.create_multipart_upload, Key=key, Metadata=metadata, ChecksumAlgorithm="CRC32",
                       **self.enc.create())
        return r["UploadId"]

    def upload_part(self, key: str, upload_id: str, number: int, fd: int, offset: int, length: int, crc32: str) -> str:
        r = self._call(
            "UploadPart", self.client.upload_part, Key=key, UploadId=upload_id, PartNumber=number,
            Body=RangeReader(fd, offset, length), ContentLength=length, ChecksumCRC32=crc32, **self.enc.customer(),
        )
        return r["ETag"].strip('"')

    def complete(self, key: str, upload_id: str, parts: list[tuple[int, str, str]], *, if_match: str | None = None,
                 if_none_match: bool = False) -> str:
        """CompleteMultipartUpload; conditional as `put_object` (the object appears, or replaces, only then)."""
        r = self._conditional(
            "CompleteMultipartUpload", self.client.complete_multipart_upload, key, if_match, if_none_match, Key=key, UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": f'"{e}"', "ChecksumCRC32": c} for n, e, c in parts]},
            **self.enc.customer(),
        )
        return r["ETag"].strip('"')

    def abort(self, key: str, upload_id: str) -> None:
        try:
            self._call("AbortMultipartUpload", self.client.abort_multipart_upload, Key=key, UploadId=upload_id)
        except StoreError as e:
            if e.kind != NO_UPLOAD:
                raise

    def list_parts(self, key: str, upload_id: str) -> dict[int, RemotePart]:
        out: dict[int, RemotePart] = {}
        marker = 0
        while True:
            r = self._call("ListParts", self.client.list_parts, Key=key, UploadId=upload_id, PartNumberMarker=marker)
            for p in r.get("Parts", []):
                out[p["PartNumber"]] = RemotePart(p["ETag"].strip('"'), p["Size"])
            if not r.get("IsTruncated"):
                return out
            marker = r["NextPartNumberMarker"]

    def download(self, key: str, path: str) -> tuple[str, int, str]:
        """Stream an object into `path`; return (xxh3-128 of the bytes received, size, etag)."""
        r = self._call("GetObject", self.client.get_object, Key=key, **self.enc.customer())
        try:
            digest, size = _download_into(r["Body"], path)
        except Exception as e:  # noqa: BLE001
            raise _classify(e, self.bucket, "GetObject") from None
        return digest, size, r["ETag"].strip('"')

    def list(self, prefix: str, recursive: bool = False, on_page: Callable[[], None] | None = None) -> Listing:
        """Objects under `prefix` (which ends in '/' or is empty); one level unless `recursive`.

        `on_page()` is called after each page (1000 keys): a listing that keeps answering is not hung.
        """
        dirs: list[str] = []
        objects: list[RemoteObject] = []
        marker = False
        token: str | None = None
        while True:
            page = self._list_page(prefix, None if recursive else "/", token)
            if on_page is not None:
                on_page()
            dirs += [p[len(prefix):].rstrip("/") for p in page.prefixes]
            for key, size, etag, mtime, storage_class in page.objects:
                name = key[len(prefix):]
                if not name:
                    marker = True
                    continue
                objects.append(RemoteObject(name, size, etag, mtime, storage_class))
            if page.next_token is None:
                return Listing(dirs, objects, marker)
            token = page.next_token

    def _list_page(self, prefix: str, delimiter: str | None, token: str | None) -> ListPage:
        """One ListObjectsV2 page: the first through boto3, which shows where and how it signs; the rest `SignedList`."""
        lister = self._lister
        if lister is not None:
            try:
                return self._call("ListObjectsV2", lambda Bucket: lister.page(prefix, delimiter, token))  # noqa: N803 - _call's keyword
            except EndpointMoved as e:
                log.info("the object store answered a ListObjectsV2 with %s: learning its endpoint again through boto3", e)
                self._lister, self._lister_tried = None, False
        kw: dict[str, Any] = {"Prefix": prefix, **({"Delimiter": delimiter} if delimiter else {}),
                              **({"ContinuationToken": token} if token else {})}
        if self._lister_tried or not self._lister_probe.acquire(blocking=False):
            return _boto3_page(self._call("ListObjectsV2", self.client.list_objects_v2, **kw))
        try:
            r, seen = self._learning("ListObjectsV2", lambda: self._call("ListObjectsV2", self.client.list_objects_v2, **kw))
            self._lister = SignedList.from_request(self.client, self._session.get_credentials(), **seen) if seen else None
            self._lister_tried = True
            if self._lister is None:
                log.info("listings go through boto3: its request (%s) is not one SignedList reproduces", seen.get("signature_version"))
            return _boto3_page(r)
        finally:
            self._lister_probe.release()

    def read_range(self, key: str, etag: str, start: int, length: int, fd: int) -> dict[str, str]:
        """Write bytes [start, start+length) of the object into `fd` at `start`; returns the object's metadata.

        `IfMatch` makes a read of an object replaced meanwhile fail (CHANGED) instead of mixing two versions.
        """
        kw: dict[str, Any] = {"Key": key, "Range": f"bytes={start}-{start + length - 1}", **self.enc.customer()}
        if etag:
            kw["IfMatch"] = f'"{etag}"'
        r = self._call("GetObject", self.client.get_object, **kw)
        try:
            body = r["Body"]
            offset = start
            # one buffer per range, filled in place: a fresh 1 MiB object per chunk costs an mmap and
            # an munmap, and each munmap stops every other thread of the daemon (TLB shootdown)
            view = memoryview(bytearray(READ_CHUNK))
            while n := body.readinto(view):
                os.pwrite(fd, view[:n], offset)
                offset += n
        except Exception as e:  # noqa: BLE001
            raise _classify(e, self.bucket, "GetObject") from None
        if offset != start + length:
            raise StoreError(NETWORK, f"short read of {key}: {offset - start} of {length} bytes")
        return {k.lower(): v for k, v in r.get("Metadata", {}).items()}

    def head(self, key: str) -> tuple[int, str, dict[str, str]]:
        """(size, etag, metadata) of an object."""
        r = self._call("HeadObject", self.client.head_object, Key=key, **self.enc.customer())
        return r["ContentLength"], r["ETag"].strip('"'), {k.lower(): v for k, v in r.get("Metadata", {}).items()}

    def copy(self, src: str, dst: str, size: int, part_size: int, multipart_threshold: int, *, if_match: str | None = None,
             if_none_match: bool = False) -> str:
        """Server-side copy (no bytes through this node); UploadPartCopy in parts for large objects.

        A condition on the destination (`if_match` its ETag, `if_none_match`: it holds nothing; a takeover's copy of a
        renamed file, judged by the object there) goes through the parts path at any size: CopyObject takes no
        condition on its destination, CompleteMultipartUpload does. An empty source is written as an empty object
        with its metadata, under the same condition."""
        conditional = if_match is not None or if_none_match
        if size < multipart_threshold and not conditional:
            r = self._call("CopyObject", self.client.copy_object, Key=dst, CopySource={"Bucket": self.bucket, "Key": src},
                           MetadataDirective="COPY", **self.enc.create(), **self.enc.copy_source())
            return r["CopyObjectResult"]["ETag"].strip('"')
        _, _, metadata = self.head(src)
        if size == 0:
            return self.put_object_body(dst, b"", crc32_b64(0), metadata, if_match=if_match, if_none_match=if_none_match)
        upload_id = self._call("CreateMultipartUpload", self.client.create_multipart_upload, Key=dst, Metadata=metadata,
                               **self.enc.create())["UploadId"]
        try:
            parts = []
            for n, offset in enumerate(range(0, size, part_size), start=1):
                end = min(size, offset + part_size) - 1
                r = self._call("UploadPartCopy", self.client.upload_part_copy, Key=dst, UploadId=upload_id, PartNumber=n,
                               CopySource={"Bucket": self.bucket, "Key": src}, CopySourceRange=f"bytes={offset}-{end}",
                               **self.enc.customer(), **self.enc.copy_source())
                parts.append({"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]})
            r = self._conditional("CompleteMultipartUpload", self.client.complete_multipart_upload, dst, if_match, if_none_match,
                                  Key=dst, UploadId=upload_id, MultipartUpload={"Parts": parts}, **self.enc.customer())
            return r["ETag"].strip('"')
        except BaseException:
            try:
                self.abort(dst, upload_id)
            except StoreError:
                pass  # aborted as leaked by the next mount
            raise

    def probe_key_chars(self, prefix: str, probe_dir: str) -> dict[str, str]:
        """Which characters this store does not keep in keys as written: {char: what it stored instead} (keyprobe.py)."""
        return keyprobe.probe_key_chars(prefix + probe_dir, self.put_marker,
                                        lambda base: [o.name for o in self.list(base, recursive=True).objects], self.delete)

    def put_marker(self, key: str) -> None:
        self._call("PutObject", self.client.put_object, Key=key, Body=b"", ContentLength=0, **self.enc.create())

    def list_uploads(self, prefix: str) -> list[tuple[str, str, float]]:
        """Multipart uploads in progress under `prefix`: (key, upload id, start time as epoch seconds)."""
        out: list[tuple[str, str, float]] = []
        kw: dict[str, Any] = {"Prefix": prefix}
        while True:
            r = self._call("ListMultipartUploads", self.client.list_multipart_uploads, **kw)
            out += [(u["Key"], u["UploadId"], u["Initiated"].timestamp()) for u in r.get("Uploads", [])]
            if not r.get("IsTruncated"):
                return out
            kw.update(KeyMarker=r.get("NextKeyMarker", ""), UploadIdMarker=r.get("NextUploadIdMarker", ""))

    def delete(self, key: str) -> None:
        self._call("DeleteObject", self.client.delete_object, Key=key)

    def delete_if_match(self, key: str, etag: str) -> None:
        """DeleteObject only while the object's ETag is `etag`: PRECONDITION if it was written since, NO_OBJECT if it
        is gone (a node record pruned only if nobody renewed it meanwhile)."""
        try:
            self._call("DeleteObject", self.client.delete_object, Key=key, IfMatch=f'"{etag}"')
        except StoreError as e:
            if e.kind == CHANGED or "ConditionalRequestConflict" in str(e):
                raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile") from None
            raise

    # ------------------------------------------------ small objects (lifecycle)
    def put_bytes(self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None,
                  content_type: str = "application/json") -> str:
        """PutObject of a small body; conditional with `if_none_match` (create only) or `if_match` (replace that ETag).

        A condition not met raises StoreError(PRECONDITION): another writer got there first.
        """
        kw: dict[str, Any] = {"Key": key, "Body": body, "ContentLength": len(body), "ContentType": content_type, **self.enc.create()}
        if if_none_match:
            kw["IfNoneMatch"] = "*"
        if if_match is not None:
            kw["IfMatch"] = f'"{if_match}"'
        try:
            r = self._call("PutObject", self.client.put_object, **kw)
        except StoreError as e:
            if e.kind == CHANGED or "ConditionalRequestConflict" in str(e):
                raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile") from None
            raise
        return r["ETag"].strip('"')

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        """(body, etag) of a small object."""
        r = self._call("GetObject", self.client.get_object, Key=key, **self.enc.customer())
        try:
            body = r["Body"].read()
        except Exception as e:  # noqa: BLE001
            raise _classify(e, self.bucket, "GetObject") from None
        return body, r["ETag"].strip('"')

    def get_range(self, key: str, etag: str, start: int, length: int) -> bytes:
        """Bytes [start, start+length) of the object whose ETag is `etag` (CHANGED if it is not)."""
        if length <= 0:
            return b""
        r = self._call("GetObject", self.client.get_object, Key=key, Range=f"bytes={start}-{start + length - 1}",
                       IfMatch=f'"{etag}"', **self.enc.customer())
        try:
            data = r["Body"].read()
        except Exception as e:  # noqa: BLE001
            raise _classify(e, self.bucket, "GetObject") from None
        if len(data) != length:
            raise StoreError(NETWORK, f"short read of {key}: {len(data)} of {length} bytes")
        return data

    def head_object(self, key: str) -> ObjectInfo:
        r = self._call("HeadObject", self.client.head_object, Key=key, **self.enc.customer())
        modified = r.get("LastModified")
        return ObjectInfo(r["ContentLength"], r["ETag"].strip('"'), r.get("VersionId"),
                          {k.lower(): v for k, v in r.get("Metadata", {}).items()},
                          modified.timestamp() if modified is not None else 0.0)

    # ----------------------------------------------- replication (copies to a second store)
    def put_object_bytes(self, key: str, body: bytes, crc32: str, metadata: dict[str, str]) -> str:
        """PutObject of bytes held in memory (a streamed copy's small object), with user metadata."""
        r = self._call("PutObject", self.client.put_object, Key=key, Body=body, ContentLength=len(body),
                       ChecksumCRC32=crc32, Metadata=metadata)
        return r["ETag"].strip('"')

    def upload_part_bytes(self, key: str, upload_id: str, number: int, body: bytes, crc32: str) -> str:
        r = self._call("UploadPart", self.client.upload_part, Key=key, UploadId=upload_id, PartNumber=number,
                       Body=body, ContentLength=len(body), ChecksumCRC32=crc32)
        return r["ETag"].strip('"')

    def get_range_into(self, key: str, etag: str, start: int, view: memoryview) -> None:
        """Bytes [start, start+len(view)) of the object whose ETag is `etag` (CHANGED if it is not), read into `view`
        a PART_READ_CHUNK at a time: no allocation of the whole range."""
        length = len(view)
        if length <= 0:
            return
        r = self._call("GetObject", self.client.get_object, Key=key, Range=f"bytes={start}-{start + length - 1}",
                       IfMatch=f'"{etag}"', **self.enc.customer())
        body = r["Body"]
        got = 0
        try:
            while got < length:
                n = body.readinto(view[got:min(length, got + PART_READ_CHUNK)])
                if not n:
                    break
                got += n
        except Exception as e:  # noqa: BLE001
            raise _classify(e, self.bucket, "GetObject") from None
        finally:
            body.close()
        if got != length:
            raise StoreError(NETWORK, f"short read of {key}: {got} of {length} bytes")

    def put_object_from(self, key: str, view: memoryview, crc32: str, metadata: dict[str, str]) -> str:
        """PutObject of a part buffer (a streamed copy's small object), with user metadata."""
        r = self._call("PutObject", self.client.put_object, Key=key, Body=ViewReader(view), ContentLength=len(view),
                       ChecksumCRC32=crc32, Metadata=metadata)
        return r["ETag"].strip('"')

    def upload_part_from(self, key: str, upload_id: str, number: int, view: memoryview, crc32: str) -> str:
        """UploadPart of a part buffer (a streamed copy's part)."""
        r = self._call("UploadPart", self.client.upload_part, Key=key, UploadId=upload_id, PartNumber=number,
                       Body=ViewReader(view), ContentLength=len(view), ChecksumCRC32=crc32)
        return r["ETag"].strip('"')

    def copy_from(self, src_bucket: str, src_key: str, src_etag: str, dst: str, size: int, metadata: dict[str, str],
                  part_size: int, multipart_threshold: int) -> str:
        """Server-side copy from another bucket of the same store, with new user metadata; ETag of the copy.

        `src_etag` pins the source (CopySourceIfMatch): a source replaced meanwhile fails with CHANGED.
        Above `multipart_threshold` (S3 allows CopyObject up to 5 GiB) in parts with UploadPartCopy.
        """
        source = {"Bucket": src_bucket, "Key": src_key}
        if size < multipart_threshold:
            r = self._call("CopyObject", self.client.copy_object, Key=dst, CopySource=source, CopySourceIfMatch=f'"{src_etag}"',
                           MetadataDirective="REPLACE", Metadata=metadata)
            return r["CopyObjectResult"]["ETag"].strip('"')
        upload_id = self._call("CreateMultipartUpload", self.client.create_multipart_upload, Key=dst, Metadata=metadata)["UploadId"]
        try:
            parts = []
            for n, offset in enumerate(range(0, size, part_size), start=1):
                end = min(size, offset + part_size) - 1
                r = self._call("UploadPartCopy", self.client.upload_part_copy, Key=dst, UploadId=upload_id, PartNumber=n,
                               CopySource=source, CopySourceRange=f"bytes={offset}-{end}", CopySourceIfMatch=f'"{src_etag}"')
                parts.append({"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]})
            r = self._call("CompleteMultipartUpload", self.client.complete_multipart_upload, Key=dst, UploadId=upload_id,
                           MultipartUpload={"Parts": parts})
            return r["ETag"].strip('"')
        except BaseException:
            try:
                self.abort(dst, upload_id)
            except StoreError:
                pass  # aborted when the next copy of this checkpoint starts
            raise


def _download_into(body: Any, path: str) -> tuple[str, int]:
    import xxhash

    h = xxhash.xxh3_128()
    size = 0
    with open(path, "wb") as f:
        for chunk in iter(lambda: body.read(8 << 20), b""):
            h.update(chunk)
            f.write(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _boto3_page(r: dict[str, Any]) -> ListPage:
    """boto3's parsed ListObjectsV2 answer as the page `SignedList` makes."""
    return ListPage([p["Prefix"] for p in r.get("CommonPrefixes", [])],
                    [(o["Key"], o["Size"], o["ETag"].strip('"'), o["LastModified"].timestamp(), o.get("StorageClass") or "STANDARD")
                     for o in r.get("Contents", [])],
                    r.get("NextContinuationToken") if r.get("IsTruncated") else None)
