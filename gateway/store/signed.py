"""PutObject of a small body, and ListObjectsV2 pages, signed here and sent on the boto3 client's own HTTP session
(`SignedPut`, `SignedList`).

Why: for a 64 KiB body boto3 spent ~1.5 ms of client CPU per request (event hooks, endpoint rules,
serialising, parsing), all of it holding the GIL the FUSE loop needs, and over plain http it hashes the
body for the signature, which the store then hashes again; this path costs about half, and over TLS no
hash at all (docs/benchmarks.md). It reproduces a request boto3 has just sent (`Store.put_object_body`
learns the URL, signing region and name from the first PutObject), so where a bucket is served stays
boto3's decision; its failures are raised as botocore's, so `store.errors.classify` reads them alike.

A listing likewise: botocore parses each object of a ListObjectsV2 page through its model, dateutil included,
~62 us of CPU an object; ElementTree and `datetime.fromisoformat` take ~7 (a directory of 5,000 files: 0.31 s
against 0.036 s, every `metadata_ttl`, on the GIL the FUSE loop needs: docs/benchmarks.md).
"""

from __future__ import annotations

import datetime
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import unquote_plus

import botocore
import botocore.exceptions as bexc
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.utils import parse_timestamp, percent_encode

from ..version import VERSION

# what the store's access log shows for these requests (boto3's say Boto3/...)
USER_AGENT = f"ckptfs/{VERSION} botocore/{botocore.__version__} (signed PutObject)"
LIST_USER_AGENT = f"ckptfs/{VERSION} botocore/{botocore.__version__} (signed ListObjectsV2)"


class _TLSChecksumSigner(S3SigV4Auth):
    """SigV4 for a PutObject whose body travels with a signed `x-amz-checksum-crc32`: over TLS the body is not
    hashed into the signature (what botocore does for streamed bodies: TLS and a checksum are enough, and the
    store is spared a SHA-256 of every body); over plain http it is, unless `sign_payload_over_http = false`."""

    def __init__(self, credentials: Any, service_name: str, region_name: str, sign_over_http: bool) -> None:
        super().__init__(credentials, service_name, region_name)
        self._sign_over_http = sign_over_http

    def _should_sha256_sign_payload(self, request: AWSRequest) -> bool:
        return self._sign_over_http and not request.url.startswith("https:")


class SignedPut:
    """PutObjects to the endpoint of one PutObject boto3 sent: virtual-hosted buckets, FIPS or dual-stack
    endpoints and a custom `endpoint_url` come out as boto3's endpoint rules made them."""

    def __init__(self, client: Any, credentials: Any, base_url: str, region: str, signing_name: str, sign_over_http: bool = True,
                 attempts: int = 3) -> None:
        self._http = client._endpoint.http_session  # the client's pool, TLS verification, proxies and timeouts
        self._credentials = credentials
        self.base_url, self.region, self.signing_name = base_url, region, signing_name
        self.sign_over_http = sign_over_http
        # 1 under durability = peer: a write is sent once per call, the drain retries it behind its lease check
        self.attempts = attempts

    @classmethod
    def from_request(cls, client: Any, credentials: Any, key: str, url: str, region: str, signing_name: str,
                     signature_version: str, sign_over_http: bool = True, attempts: int = 3) -> SignedPut | None:
        """The signer for the endpoint a PutObject of `key` was sent to, or None if this path cannot reproduce it."""
        tail = "/" + percent_encode(key, safe="/~")
        if signature_version not in ("s3v4", "v4") or "?" in url or not url.endswith(tail) or not region or credentials is None \
                or not hasattr(getattr(client, "_endpoint", None), "http_session"):
            return None
        return cls(client, credentials, url[: -len(tail)], region, signing_name, sign_over_http, attempts)

    def put(self, key: str, body: bytes, headers: dict[str, str]) -> str:
        """PUT `body` at `key`; the ETag. A connection the server closed while idle in the pool is retried (`attempts`)."""
        url = f"{self.base_url}/{percent_encode(key, safe='/~')}"
        signer = _TLSChecksumSigner(self._credentials.get_frozen_credentials(), self.signing_name, self.region, self.sign_over_http)
        response = _send(self._http, lambda: AWSRequest("PUT", url, data=body, headers={
            **headers, "Content-Length": str(len(body)), "User-Agent": USER_AGENT}), signer, self.attempts, "PutObject")
        return str(response.headers.get("ETag", "")).strip('"')


def _send(http: Any, make: Callable[[], AWSRequest], signer: S3SigV4Auth, attempts: int, operation: str) -> Any:
    """A request `make()` builds, signed and sent on the client's session; a connection the server closed while idle in
    the pool is tried again, up to `attempts` in all. The answer if 200; otherwise raised as botocore's error, or as
    EndpointMoved where the bucket is served elsewhere."""
    for attempt in range(attempts):
        request = make()
        signer.add_auth(request)
        try:
            response = http.send(request.prepare())
            break
        except bexc.ConnectionClosedError:
            if attempt == attempts - 1:
                raise
    if response.status_code == 200:
        return response
    error = _error_response(response.status_code, response.content)
    if response.status_code in (301, 307) or error["Error"]["Code"] in MOVED_CODES:
        raise EndpointMoved(error["Error"]["Code"])
    raise bexc.ClientError(error, operation)


@dataclass
class ListPage:
    """One page of a ListObjectsV2: keys whole (not relative to the prefix), as S3 sent them."""

    prefixes: list[str] = field(default_factory=list)  # CommonPrefixes, each ending in the delimiter
    objects: list[tuple[str, int, str, float, str]] = field(default_factory=list)  # key, size, etag, mtime, storage class
    next_token: str | None = None  # the ContinuationToken of the next page; None on the last


class SignedList:
    """ListObjectsV2 pages sent to the URL of one boto3 sent (so the endpoint, the addressing style and the signing
    region stay boto3's), with `encoding-type=url` as boto3 asks, so that any key comes back intact."""

    def __init__(self, client: Any, credentials: Any, url: str, region: str, signing_name: str) -> None:
        self._http = client._endpoint.http_session
        self._credentials = credentials
        self.url, self.region, self.signing_name = url, region, signing_name

    @classmethod
    def from_request(cls, client: Any, credentials: Any, url: str, region: str, signing_name: str,
                     signature_version: str) -> SignedList | None:
        """The lister for the endpoint a ListObjectsV2 was sent to, or None if this path cannot reproduce it."""
        base, _, query = url.partition("?")
        if signature_version not in ("s3v4", "v4") or "list-type=2" not in query.split("&") or not region \
                or credentials is None or not hasattr(getattr(client, "_endpoint", None), "http_session"):
            return None
        return cls(client, credentials, base, region, signing_name)

    def page(self, prefix: str, delimiter: str | None, token: str | None) -> ListPage:
        query = {"list-type": "2", "encoding-type": "url", "prefix": prefix}
        if delimiter:
            query["delimiter"] = delimiter
        if token:
            query["continuation-token"] = token
        url = self.url + "?" + "&".join(f"{k}={percent_encode(v)}" for k, v in sorted(query.items()))
        signer = S3SigV4Auth(self._credentials.get_frozen_credentials(), self.signing_name, self.region)
        response = _send(self._http, lambda: AWSRequest("GET", url, headers={"User-Agent": LIST_USER_AGENT}), signer, 3, "ListObjectsV2")
        return parse_page(response.content)


def parse_page(content: bytes) -> ListPage:
    """A ListObjectsV2 answer (S3's namespace or none, keys url-encoded or not) as a `ListPage`."""
    root = ET.fromstring(content)
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    decode = unquote_plus if root.findtext(f"{ns}EncodingType") == "url" else str
    out = ListPage()
    for p in root.iterfind(f"{ns}CommonPrefixes/{ns}Prefix"):
        out.prefixes.append(decode(p.text or ""))
    for o in root.iterfind(f"{ns}Contents"):
        out.objects.append((decode(o.findtext(f"{ns}Key") or ""), int(o.findtext(f"{ns}Size") or 0),
                            (o.findtext(f"{ns}ETag") or "").strip('"'), _epoch(o.findtext(f"{ns}LastModified") or ""),
                            o.findtext(f"{ns}StorageClass") or "STANDARD"))
    if root.findtext(f"{ns}IsTruncated") == "true":
        out.next_token = root.findtext(f"{ns}NextContinuationToken") or None
        if out.next_token is None:
            raise ValueError("a truncated ListObjectsV2 page without a NextContinuationToken")
    return out


def _epoch(text: str) -> float:
    """An ISO 8601 LastModified as epoch seconds: `fromisoformat` for S3's own form, botocore's parser for the rest."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        when = parse_timestamp(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


# what S3 answers a request sent to the wrong region or endpoint (boto3 follows them; SignedPut learns again)
MOVED_CODES = ("PermanentRedirect", "TemporaryRedirect", "AuthorizationHeaderMalformed")


class EndpointMoved(Exception):
    """The store says the bucket is answered elsewhere now: the PutObject is sent again through boto3, which follows
    it, and the signed path is learnt again from that request."""


def _error_response(status: int, content: bytes) -> dict[str, Any]:
    """An S3 error body (`<Error><Code>..</Code><Message>..</Message></Error>`) as botocore's parsed response."""
    code = message = ""
    try:
        root = ET.fromstring(content) if content else None
    except ET.ParseError:
        root = None
    if root is not None:
        code, message = root.findtext("Code") or "", root.findtext("Message") or ""
    return {"Error": {"Code": code or str(status), "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
