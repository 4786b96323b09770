"""What a failed request means: botocore's exceptions (and SignedPut's, raised as botocore's) as one StoreError whose
message a user can act on and whose `kind` says whether retrying can help."""

from __future__ import annotations

import botocore.exceptions as bexc

from ..objects import ARCHIVED, AUTH, CHANGED, NETWORK, NO_BUCKET, NO_OBJECT, NO_UPLOAD, OTHER, SERVER, StoreError


def classify(e: Exception, bucket: str, what: str) -> StoreError:
    if isinstance(e, StoreError):
        return e
    if isinstance(e, bexc.NoCredentialsError):
        return StoreError(AUTH, NO_CREDENTIALS)
    if isinstance(e, bexc.SSLError):
        return StoreError(NETWORK, f"TLS with the object store failed ({e}): {_tls_hint(str(e))}")
    if isinstance(e, (bexc.EndpointConnectionError, bexc.ConnectTimeoutError)):
        return StoreError(NETWORK, f"cannot reach the object store ({e}): check endpoint_url and that the server is up")
    if isinstance(e, (bexc.ReadTimeoutError, bexc.ConnectionClosedError, bexc.HTTPClientError)):
        return StoreError(NETWORK, f"object store did not answer {what} in time ({type(e).__name__})")
    if isinstance(e, bexc.ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("NoSuchBucket",) or (what == "HeadBucket" and status == 404):
            return StoreError(NO_BUCKET, f"bucket {bucket!r} does not exist: create it or fix the source s3://BUCKET")
        if code in ("NoSuchKey", "404") and what != "HeadBucket":
            return StoreError(NO_OBJECT, f"object not found ({what})")
        if code in ("PreconditionFailed", "412") or status == 412:
            return StoreError(CHANGED, f"object changed while it was being read ({what})")
        if code == "InvalidObjectState":
            return StoreError(ARCHIVED, f"{what}: the object is in an archive storage class and must be restored before it can be read: "
                                        "run `ckptfs restore PATH` (the file or its checkpoint) and read it once restored")
        if code == "NotImplemented" or status == 501:
            return StoreError(OTHER, f"the object store does not implement {what} as asked (501 NotImplemented): see docs/security.md and docs/lifecycle.md for what it supports")
        if what in ("GetObject", "HeadObject") and status == 400 and (
                "customer" in str(err.get("Message", "")).lower() or what == "HeadObject"):
            return StoreError(OTHER, f"the store refused {what} (400 {code}): the object is encrypted with SSE-C and needs its key: "
                                     "mount with the sse_c_key_file it was written with")
        if code == "NoSuchUpload":
            return StoreError(NO_UPLOAD, f"multipart upload no longer exists ({what})")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
            return StoreError(AUTH, f"the object store rejected the credentials ({code}): check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the profile")
        if code in ("AccessDenied", "403", "Forbidden") or status == 403:
            return StoreError(AUTH, f"access denied to bucket {bucket!r} ({what}): check the credentials and the bucket policy",
                              denied=code in ("AccessDenied", "403", "Forbidden"))
        if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"):
            return StoreError(SERVER, f"object store error {code or status} on {what}: will retry")
        return StoreError(OTHER, f"object store refused {what}: {code} {err.get('Message', '')}".strip())
    if isinstance(e, bexc.BotoCoreError):
        return StoreError(NETWORK, f"object store request {what} failed: {e}")
    if isinstance(e, OSError):
        return StoreError(OTHER, f"{what}: {e}")
    raise e


# what OpenSSL says when the server answered a TLS hello in plain HTTP
PLAIN_HTTP_SIGNS = ("wrong_version_number", "wrong version number", "record layer failure", "http request")


def _tls_hint(error: str) -> str:
    """What to do about a failed TLS handshake: an https:// endpoint that speaks plain http is the common case."""
    if any(sign in error.lower() for sign in PLAIN_HTTP_SIGNS):
        return "the endpoint speaks plain http, not https: use http:// in endpoint_url, or check the port"
    return "check endpoint_url and the server's certificate (AWS_CA_BUNDLE names a private CA)"


NO_CREDENTIALS = (
    "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the daemon's environment, "
    "name a profile of ~/.aws/credentials with -o profile=NAME (profile = \"NAME\" in the config file, or AWS_PROFILE), "
    "or run where an instance role provides them"
)
