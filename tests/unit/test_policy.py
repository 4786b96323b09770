"""The access roles' policy documents, checked with a small evaluator of S3 policy semantics (explicit Deny wins)."""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest

from ckptfs.policy import document

B = "arn:aws:s3:::ckpt"


def allowed(doc: dict[str, Any], action: str, resource: str) -> bool:
    def matches(st: dict[str, Any]) -> bool:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        return action in actions and any(fnmatch.fnmatchcase(resource, r) for r in resources)

    hits = [st for st in doc["Statement"] if matches(st)]
    return any(st["Effect"] == "Allow" for st in hits) and not any(st["Effect"] == "Deny" for st in hits)


DATA = f"{B}/runs/step_100/model.safetensors"
MANIFEST = f"{B}/runs/step_100/.ckptfs-manifest.json"
PROTECTED = f"{B}/runs/step_100/.ckptfs-protected.json"
AUDIT = f"{B}/runs/.ckptfs/audit/2026/11/23/e.json"
OTHER = f"{B}/elsewhere/file"


@pytest.mark.parametrize("role, allow_delete, action, resource, expect", [
    ("reader", False, "s3:GetObject", DATA, True),
    ("reader", False, "s3:PutObject", DATA, False),
    ("reader", False, "s3:DeleteObject", DATA, False),
    ("reader", False, "s3:GetObject", OTHER, False),
    ("writer", False, "s3:PutObject", DATA, True),
    ("writer", False, "s3:GetObject", DATA, True),
    ("writer", False, "s3:PutObjectTagging", DATA, True),
    ("writer", False, "s3:DeleteObject", DATA, False),
    ("writer", False, "s3:DeleteObject", AUDIT, False),
    ("writer", False, "s3:PutObject", OTHER, False),
    ("writer", True, "s3:DeleteObject", DATA, True),
    ("writer", True, "s3:DeleteObject", MANIFEST, False),
    ("writer", True, "s3:DeleteObject", PROTECTED, False),
    ("writer", True, "s3:DeleteObject", AUDIT, False),
    ("writer", True, "s3:DeleteObjectVersion", DATA, False),
    ("retention", False, "s3:DeleteObject", DATA, True),
    ("retention", False, "s3:DeleteObject", PROTECTED, True),
    ("retention", False, "s3:DeleteObjectVersion", DATA, True),
    ("retention", False, "s3:DeleteObject", AUDIT, False),
    ("retention", False, "s3:PutLifecycleConfiguration", B, True),
    ("writer", False, "s3:PutLifecycleConfiguration", B, False),
])
def test_roles(role: str, allow_delete: bool, action: str, resource: str, expect: bool) -> None:
    assert allowed(document(role, "ckpt", "runs", allow_delete=allow_delete), action, resource) is expect


def test_listing_is_scoped_to_the_prefix_and_bucket_policy_names_the_principal() -> None:
    doc = document("reader", "ckpt", "/runs/", principal="arn:aws:iam::111122223333:role/trainer")
    listing = doc["Statement"][0]
    assert "s3:ListBucket" in listing["Action"] and listing["Resource"] == B
    assert listing["Condition"]["StringLike"]["s3:prefix"] == ["runs", "runs/*"]
    assert doc["Statement"][1]["Condition"] == {"Null": {"s3:prefix": "true"}}  # HeadBucket, the mount's check
    assert all(st["Principal"] == {"AWS": "arn:aws:iam::111122223333:role/trainer"} for st in doc["Statement"])
    assert all("Principal" not in st for st in document("reader", "ckpt", "runs")["Statement"])
    whole = document("writer", "ckpt", "")
    assert allowed(whole, "s3:PutObject", f"{B}/anything") and "Condition" not in whole["Statement"][0]
