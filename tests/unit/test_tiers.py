"""Tiers: the settings, the bucket lifecycle plan and its difference from the bucket, and archived objects
(the error naming `ckptfs restore`, and the restore requests) with botocore's Stubber at the boto3 boundary:
SeaweedFS has no archive class."""

from __future__ import annotations

import datetime
import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from botocore.stub import Stubber

from ckptfs.config import ConfigError, load_config
from ckptfs.lifecycle.tiers import plan, restore
from ckptfs.storageclass import TierError, class_label, parse_prices, parse_transitions
from ckptfs.namespace.archive import Archive
from ckptfs.namespace.keys import Keys
from ckptfs.objects import ARCHIVED, StoreError
from ckptfs.store import Store

BASE = dict(bucket="ckpt", mountpoint="/mnt/ckpt", cache_dir="/var/cache/ckptfs", endpoint_url="http://127.0.0.1:1", prefix="runs")


def cfg(**opts: Any) -> Any:
    return load_config(environ={}, overrides={**BASE, **opts})


@pytest.mark.parametrize("entries, message", [
    (["7"], "is not DAYS:CLASS"),
    (["7:COLD"], "COLD is not a storage class"),
    (["7:STANDARD"], "not a storage class to move to"),
    (["90:GLACIER_IR", "30:STANDARD_IA"], "days must grow"),
])
def test_bad_transitions_are_one_line(entries: list[str], message: str) -> None:
    with pytest.raises(TierError, match=message):
        parse_transitions(entries)
    with pytest.raises(ConfigError, match=message):
        cfg(tier_transitions=",".join(entries))


def test_prices_parse_and_refuse_garbage() -> None:
    assert parse_prices(["STANDARD:0.023", " GLACIER_IR : 0.004"]) == {"STANDARD": 0.023, "GLACIER_IR": 0.004}
    with pytest.raises(ConfigError, match="is not CLASS:PRICE"):
        cfg(storage_prices="STANDARD:cheap")


def test_plan_adds_changes_removes_its_own_rules_and_keeps_the_rest() -> None:
    c = cfg(tier_transitions="7:STANDARD_IA,90:GLACIER_IR", tier_expiring_delete_days=2)
    foreign = {"ID": "logs", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 30}}
    other_mount = {"ID": "ckptfs:other:expiring", "Status": "Enabled", "Filter": {"Prefix": "other/"}, "Expiration": {"Days": 1}}
    stale = {"ID": "ckptfs:runs:old", "Status": "Enabled", "Filter": {"Prefix": "runs/"}, "Expiration": {"Days": 1}}
    p = plan(c, [foreign, other_mount, stale])
    assert p["add"] == ["ckptfs:runs:tiers", "ckptfs:runs:expiring"] and p["remove"] == ["ckptfs:runs:old"]
    assert p["keep"] == ["logs", "ckptfs:other:expiring"] and p["changes"]
    assert [r["ID"] for r in p["rules"]] == ["logs", "ckptfs:other:expiring", "ckptfs:runs:tiers", "ckptfs:runs:expiring"]
    tiers = p["rules"][2]
    assert tiers["Filter"]["And"]["Prefix"] == "runs/"
    assert tiers["Transitions"] == [{"Days": 7, "StorageClass": "STANDARD_IA"}, {"Days": 90, "StorageClass": "GLACIER_IR"}]
    assert any("before 30 days" in w for w in p["warnings"])  # AWS's minimum for STANDARD_IA
    # the store echoes the rules back with tags in another order: unchanged; a different age: changed
    echoed = [foreign, {**p["rules"][2], "Filter": {"And": {"Prefix": "runs/", "Tags": list(reversed(tiers["Filter"]["And"]["Tags"]))}}},
              {**p["rules"][3], "Expiration": {"Days": 5}}]
    q = plan(c, echoed)
    assert q["unchanged"] == ["ckptfs:runs:tiers"] and q["change"] == ["ckptfs:runs:expiring"] and q["add"] == []
    assert not plan(cfg(), [foreign])["changes"]  # nothing configured: nothing to set, the foreign rule untouched


def test_a_versioned_bucket_without_noncurrent_expiry_is_warned_about() -> None:
    def warned(p: dict[str, Any]) -> bool:
        return any("noncurrent versions" in w for w in p["warnings"])

    assert not warned(plan(cfg(), [], ""))
    p = plan(cfg(), [], "Enabled")
    assert warned(p) and p["versioning"] == "Enabled" and not p["changes"]
    assert warned(plan(cfg(), [], "Suspended"))  # versions written before suspension stay too
    # the option adds one prefix-scoped rule (S3 refuses ExpiredObjectDeleteMarker with tag filters) and the warning goes
    p = plan(cfg(tier_noncurrent_delete_days=3), [], "Enabled")
    assert not warned(p) and p["add"] == ["ckptfs:runs:noncurrent"]
    assert p["rules"][0] == {"ID": "ckptfs:runs:noncurrent", "Status": "Enabled", "Filter": {"Prefix": "runs/"},
                             "NoncurrentVersionExpiration": {"NoncurrentDays": 3}, "Expiration": {"ExpiredObjectDeleteMarker": True}}
    # someone else's rule already expiring noncurrent versions of the whole bucket counts; one on another prefix, a
    # disabled one or one filtered by tags (it misses untagged objects) does not
    whole = {"ID": "all", "Status": "Enabled", "Filter": {"Prefix": ""}, "NoncurrentVersionExpiration": {"NoncurrentDays": 30}}
    assert not warned(plan(cfg(), [whole], "Enabled"))
    for rule in ({**whole, "Filter": {"Prefix": "logs/"}}, {**whole, "Status": "Disabled"},
                 {**whole, "Filter": {"And": {"Prefix": "", "Tags": [{"Key": "k", "Value": "v"}]}}}):
        assert warned(plan(cfg(), [rule], "Enabled")), rule
    with pytest.raises(ConfigError, match="tier_noncurrent_delete_days must be >= 0"):
        cfg(tier_noncurrent_delete_days=-1)


def test_class_label() -> None:
    assert class_label({}) == "-"
    assert class_label({"STANDARD": 5}) == "STANDARD"
    assert class_label({"STANDARD": 5, "GLACIER": 50}) == "GLACIER+STANDARD"


# ---------------------------------------------------------------- archived objects (stubbed S3)
def stubbed(**opts: Any) -> tuple[Store, Stubber]:
    s = Store(cfg(**opts))
    stub = Stubber(s.client)
    stub.activate()
    return s, stub


def test_reading_an_archived_object_names_ckptfs_restore(tmp_path: Path) -> None:
    s, stub = stubbed()
    stub.add_client_error("get_object", "InvalidObjectState", "The operation is not valid for the object's storage class",
                          http_status_code=403)
    fd = (tmp_path / "f").open("wb")
    with pytest.raises(StoreError) as e:
        s.read_range("runs/step_1/a.bin", "e", 0, 10, fd.fileno())
    assert e.value.kind == ARCHIVED and "`ckptfs restore PATH`" in str(e.value) and "\n" not in str(e.value)


def test_restore_requests_archived_objects_and_reports_progress() -> None:
    s, stub = stubbed(restore_days=3, restore_tier="Bulk")
    when = datetime.datetime(2026, 1, 1)
    stub.add_client_error("head_object", "404", "Not Found", http_status_code=404)  # step_1 is a directory, not an object
    stub.add_response("list_objects_v2", {"Contents": [
        {"Key": "runs/step_1/a.bin", "Size": 10, "ETag": '"a"', "LastModified": when, "StorageClass": "GLACIER"},
        {"Key": "runs/step_1/b.bin", "Size": 10, "ETag": '"b"', "LastModified": when, "StorageClass": "DEEP_ARCHIVE"},
        {"Key": "runs/step_1/c.bin", "Size": 10, "ETag": '"c"', "LastModified": when, "StorageClass": "STANDARD"},
        {"Key": "runs/step_1/d.bin", "Size": 10, "ETag": '"d"', "LastModified": when, "StorageClass": "GLACIER"},
    ], "IsTruncated": False}, {"Bucket": "ckpt", "Prefix": "runs/step_1/"})
    # a: not restored yet -> RestoreObject; b: already restoring -> RestoreAlreadyInProgress; d: restored already
    stub.add_response("head_object", {"StorageClass": "GLACIER"}, {"Bucket": "ckpt", "Key": "runs/step_1/a.bin"})
    stub.add_response("restore_object", {}, {"Bucket": "ckpt", "Key": "runs/step_1/a.bin",
                                             "RestoreRequest": {"Days": 3, "GlacierJobParameters": {"Tier": "Bulk"}}})
    stub.add_response("head_object", {"StorageClass": "DEEP_ARCHIVE"}, {"Bucket": "ckpt", "Key": "runs/step_1/b.bin"})
    stub.add_client_error("restore_object", "RestoreAlreadyInProgress", "Object restore is already in progress", http_status_code=409)
    stub.add_response("head_object", {"StorageClass": "GLACIER", "Restore": 'ongoing-request="false", expiry-date="Fri, 23 Dec 2026 00:00:00 GMT"'},
                      {"Bucket": "ckpt", "Key": "runs/step_1/d.bin"})
    archive = Archive()
    lc = SimpleNamespace(store=s, cfg=cfg(restore_days=3, restore_tier="Bulk"), keys=Keys("runs/"), ns=SimpleNamespace(archive=archive))

    async def io(fn: Any, *args: Any) -> Any:
        return functools.partial(fn, *args)()

    lc.io = io

    async def send(msg: Any) -> None:
        raise AssertionError("no progress lines without --wait")

    result = trio.run(restore, lc, "step_1", False, send)
    assert result == {"objects": 4, "files": 4, "archived": 3, "requested": 1, "restored": 1, "ongoing": 2}
    # what opens and user.ckptfs.state of those files say from now on
    assert {k: (st.label or "readable") for k, (st, _) in archive.states.items()} == {
        "runs/step_1/a.bin": "restoring", "runs/step_1/b.bin": "restoring", "runs/step_1/d.bin": "readable"}
    stub.assert_no_pending_responses()

