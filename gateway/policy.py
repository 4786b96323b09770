"""Access roles as S3 policy documents for a mount's bucket and prefix (`ckptfs policy print`, docs/security.md).

* reader     lists and reads (objects, tags, legal holds, the bucket's lifecycle rules).
* writer     a training node: reader + writes (PutObject, multipart, tags, legal holds on protect, restores);
             no deletes at all, by an explicit Deny (so no other policy can grant them). With
             `allow_delete`, it may delete ordinary files (renames of uploaded files, trainers that
             rotate their own checkpoints) but never ckptfs's objects (manifests, protection markers:
             unprotect needs the retention role), never the audit log, never an object version.
* retention  the only role that deletes: reader + writes + DeleteObject / DeleteObjectVersion, and
             the bucket's lifecycle configuration (`ckptfs lifecycle apply`). The audit log stays
             append-only for every role (expire it with a lifecycle rule if it must go).

Without a principal the document is an IAM identity policy (attach it to the role or user);
with one it is a bucket policy whose statements name that principal.
"""

from __future__ import annotations

from typing import Any

ROLES = ("writer", "retention", "reader")
AUDIT = ".ckptfs/audit/"

READ_OBJECT = ["s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectTagging", "s3:GetObjectLegalHold", "s3:GetObjectRetention"]
READ_BUCKET = ["s3:ListBucket", "s3:ListBucketVersions", "s3:GetBucketLocation", "s3:GetBucketObjectLockConfiguration",
               "s3:GetLifecycleConfiguration", "s3:GetBucketVersioning", "s3:ListBucketMultipartUploads"]
WRITE_OBJECT = ["s3:PutObject", "s3:PutObjectTagging", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts",
                "s3:PutObjectLegalHold", "s3:RestoreObject"]
DELETE = ["s3:DeleteObject", "s3:DeleteObjectVersion"]


def document(role: str, bucket: str, prefix: str, principal: str = "", allow_delete: bool = False) -> dict[str, Any]:
    """The policy document for `role` on s3://bucket/prefix."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: use one of {', '.join(ROLES)}")
    p = prefix.strip("/")
    base = f"{p}/" if p else ""
    bucket_arn = f"arn:aws:s3:::{bucket}"
    objects = f"{bucket_arn}/{base}*"
    audit = f"{bucket_arn}/{base}{AUDIT}*"
    own = [f"{bucket_arn}/{base}*/.ckptfs-*", f"{bucket_arn}/{base}.ckptfs-*"]  # manifests, protection and verify objects
    tag = role.capitalize()
    listing: dict[str, Any] = {"Sid": f"Ckptfs{tag}Bucket", "Effect": "Allow", "Action": READ_BUCKET, "Resource": bucket_arn}
    if p:
        # listings under the prefix only, and requests without a prefix: HeadBucket (the mount's check) needs s3:ListBucket
        listing["Condition"] = {"StringLike": {"s3:prefix": [p, f"{base}*"]}}
        statements = [
            {**listing, "Action": ["s3:ListBucket", "s3:ListBucketVersions", "s3:ListBucketMultipartUploads"]},
            {"Sid": f"Ckptfs{tag}HeadBucket", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": bucket_arn,
             "Condition": {"Null": {"s3:prefix": "true"}}},
            {"Sid": f"Ckptfs{tag}BucketInfo", "Effect": "Allow", "Resource": bucket_arn,
             "Action": [a for a in READ_BUCKET if a not in ("s3:ListBucket", "s3:ListBucketVersions", "s3:ListBucketMultipartUploads")]},
        ]
    else:
        statements = [listing]
    statements.append({"Sid": f"Ckptfs{tag}Read", "Effect": "Allow", "Action": READ_OBJECT, "Resource": objects})
    if role in ("writer", "retention"):
        statements.append({"Sid": f"Ckptfs{tag}Write", "Effect": "Allow", "Action": WRITE_OBJECT, "Resource": objects})
    if role == "writer":
        if allow_delete:
            statements += [
                {"Sid": "CkptfsWriterDeleteFiles", "Effect": "Allow", "Action": ["s3:DeleteObject"], "Resource": objects},
                {"Sid": "CkptfsWriterNoDeleteOwnOrAudit", "Effect": "Deny", "Action": DELETE, "Resource": [*own, audit]},
                {"Sid": "CkptfsWriterNoDeleteVersions", "Effect": "Deny", "Action": ["s3:DeleteObjectVersion"], "Resource": objects},
            ]
        else:
            statements.append({"Sid": "CkptfsWriterNoDelete", "Effect": "Deny", "Action": DELETE, "Resource": objects})
        statements.append({"Sid": "CkptfsWriterNoBypass", "Effect": "Deny", "Action": ["s3:BypassGovernanceRetention"], "Resource": objects})
    if role == "retention":
        statements += [
            {"Sid": "CkptfsRetentionDelete", "Effect": "Allow", "Action": DELETE, "Resource": objects},
            {"Sid": "CkptfsRetentionLifecycle", "Effect": "Allow", "Action": ["s3:PutLifecycleConfiguration"], "Resource": bucket_arn},
            {"Sid": "CkptfsRetentionKeepAudit", "Effect": "Deny", "Action": DELETE, "Resource": audit},
        ]
    if principal:
        who: Any = "*" if principal == "*" else {"AWS": principal}
        statements = [{**s, "Principal": who} for s in statements]
    return {"Version": "2012-10-17", "Statement": statements}
