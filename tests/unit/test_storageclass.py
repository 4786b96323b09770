"""Storage classes that need a restore, the Restore header, and what the namespace keeps of them (storageclass.py, namespace/archive.py)."""

from __future__ import annotations

import pytest
from botocore.stub import Stubber

from ckptfs.config import load_config
from ckptfs.namespace.archive import Archive
from ckptfs.storageclass import ONGOING, RESTORED, ArchiveState, from_head, may_need_restore, parse_restore
from ckptfs.store import Store


@pytest.mark.parametrize("cls, maybe", [
    ("GLACIER", True), ("DEEP_ARCHIVE", True), ("INTELLIGENT_TIERING", True),  # the last only in its archive tiers
    ("GLACIER_IR", False), ("STANDARD", False), ("STANDARD_IA", False), ("ONEZONE_IA", False), ("", False), (None, False),
])
def test_which_listed_classes_may_need_a_restore(cls: str | None, maybe: bool) -> None:
    assert may_need_restore(cls) is maybe


@pytest.mark.parametrize("header, want", [
    (None, ("", "")),
    ("", ("", "")),
    ('ongoing-request="true"', (ONGOING, "")),
    ('ongoing-request="false", expiry-date="Fri, 21 Dec 2012 00:00:00 GMT"', (RESTORED, "Fri, 21 Dec 2012 00:00:00 GMT")),
    ('ongoing-request="false"', (RESTORED, "")),  # intelligent tiering restored to its frequent tier: no expiry
    ('ongoing-request = "TRUE"', (ONGOING, "")),
    ("garbage", ("", "")),
])
def test_restore_header(header: str | None, want: tuple[str, str]) -> None:
    assert parse_restore(header) == want


@pytest.mark.parametrize("head, label, needs, where", [
    ({"StorageClass": "GLACIER"}, "archived", True, "GLACIER"),
    ({"StorageClass": "DEEP_ARCHIVE", "Restore": 'ongoing-request="true"'}, "restoring", True, "DEEP_ARCHIVE"),
    ({"StorageClass": "GLACIER", "Restore": 'ongoing-request="false", expiry-date="Fri, 23 Dec 2026 00:00:00 GMT"'}, "", False, "GLACIER"),
    ({"StorageClass": "GLACIER_IR"}, "", False, "GLACIER_IR"),
    ({}, "", False, "STANDARD"),  # S3 leaves the header out for STANDARD
    ({"StorageClass": "INTELLIGENT_TIERING"}, "", False, "INTELLIGENT_TIERING"),
    ({"StorageClass": "INTELLIGENT_TIERING", "ArchiveStatus": "DEEP_ARCHIVE_ACCESS"}, "archived", True,
     "INTELLIGENT_TIERING DEEP_ARCHIVE_ACCESS"),
    ({"StorageClass": "INTELLIGENT_TIERING", "ArchiveStatus": "ARCHIVE_ACCESS", "Restore": 'ongoing-request="false"'}, "", False,
     "INTELLIGENT_TIERING ARCHIVE_ACCESS"),
])
def test_state_from_head(head: dict[str, str], label: str, needs: bool, where: str) -> None:
    st = from_head(head)
    assert (st.label, st.needs_restore, st.where) == (label, needs, where)


def test_a_refused_read_counts_as_archived_whatever_the_class_said() -> None:
    st = ArchiveState("STANDARD", refused=True)
    assert st.needs_restore and st.label == "archived" and "InvalidObjectState" in st.where


def test_store_reads_class_tier_and_restore_from_head_object() -> None:
    s = Store(load_config(environ={}, overrides=dict(bucket="ckpt", mountpoint="/mnt/ckpt", cache_dir="/var/cache/ckptfs",
                                                     endpoint_url="http://127.0.0.1:1", prefix="runs")))
    stub = Stubber(s.client)
    stub.activate()
    stub.add_response("head_object", {"StorageClass": "INTELLIGENT_TIERING", "ArchiveStatus": "ARCHIVE_ACCESS",
                                      "Restore": 'ongoing-request="true"'}, {"Bucket": "ckpt", "Key": "runs/a"})
    assert s.archive_state("runs/a") == ArchiveState("INTELLIGENT_TIERING", "ARCHIVE_ACCESS", ONGOING, "")
    stub.assert_no_pending_responses()


def test_archive_registry_keeps_only_classes_that_may_need_a_restore() -> None:
    a = Archive()
    a.listed("k/std", "STANDARD")
    a.listed("k/ir", "GLACIER_IR")
    a.listed("k/gl", "GLACIER")
    a.listed("k/it", "INTELLIGENT_TIERING")
    assert a.classes == {"k/gl": "GLACIER", "k/it": "INTELLIGENT_TIERING"}
    assert [a.may_need_restore(k) for k in ("k/std", "k/ir", "k/gl", "k/it", None)] == [False, False, True, True, False]
    a.observed("k/gl", ArchiveState("GLACIER", restore=ONGOING))
    assert a.known("k/gl", 60.0) == ArchiveState("GLACIER", restore=ONGOING)
    assert a.known("k/gl", 0.0) is None  # older than the bound: ask the store again
    # a GET refused for an object listed STANDARD (its class changed after the listing): checked from now on
    a.observed("k/std", ArchiveState("STANDARD", refused=True))
    assert a.may_need_restore("k/std")
    # listed again in a class read at once (moved back, or replaced): forgotten
    a.listed("k/gl", "STANDARD")
    a.listed("k/std", "STANDARD")
    assert not a.may_need_restore("k/gl") and not a.may_need_restore("k/std") and a.states == {}
