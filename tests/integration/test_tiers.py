"""Storage tiers on a real SeaweedFS: ckptfs's tags on checkpoint objects, `ckptfs lifecycle plan|apply`
(keeping rules ckptfs did not write; the 501 for transitions as one line), storage classes in `ckptfs checkpoints`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckptfs.storageclass import fmt_money

# Storage tiers: store-side logic behind the control socket: the FUSE transport changes nothing here, so these tests run under the default one only
pytestmark = pytest.mark.one_transport

MANIFEST = ".ckptfs-manifest.json"
FOREIGN = {"ID": "someone-elses", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 30}}


def tags(m: Any, rel: str) -> dict[str, str]:
    r = m.s3.client().get_object_tagging(Bucket=m.bucket, Key=m.key(rel))
    return {t["Key"]: t["Value"] for t in r["TagSet"]}


def ok(proc: Any) -> str:
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def test_checkpoint_objects_are_tagged_on_commit_protect_unprotect(make_mount: Any) -> None:
    m = make_mount(checkpoint_quiet_seconds=3600)
    step = m.path / "run" / "step_200"
    step.mkdir(parents=True)
    (step / "model.bin").write_bytes(b"m" * 4096)
    (step / "optim.bin").write_bytes(b"o" * 4096)
    m.flush()
    # a tag the user set before the commit stays
    m.s3.client().put_object_tagging(Bucket=m.bucket, Key=m.key("run/step_200/model.bin"),
                                     Tagging={"TagSet": [{"Key": "team", "Value": "llm"}]})
    ok(m.cli("checkpoint", "commit", str(step)))
    want = {"ckptfs-state": "committed", "ckptfs-protected": "false", "ckptfs-step": "200"}
    for rel in ("run/step_200/model.bin", "run/step_200/optim.bin", f"run/step_200/{MANIFEST}"):
        assert {k: v for k, v in tags(m, rel).items() if k.startswith("ckptfs-")} == want, rel
    assert tags(m, "run/step_200/model.bin")["team"] == "llm"
    ok(m.cli("protect", str(step), "--reason", "golden"))
    assert tags(m, "run/step_200/optim.bin") == {"ckptfs-state": "protected", "ckptfs-protected": "true", "ckptfs-step": "200"}
    entries = json.loads(ok(m.cli("checkpoints", str(m.path), "--json")))
    assert [(e["path"], e["storage_class"]) for e in entries] == [("run/step_200", "STANDARD")]
    assert entries[0]["storage_classes"]["STANDARD"] >= 8192
    ok(m.cli("unprotect", str(step), "--reason", "done"))
    assert tags(m, f"run/step_200/{MANIFEST}")["ckptfs-state"] == "committed"
    assert tags(m, "run/step_200/model.bin")["ckptfs-protected"] == "false"


def test_lifecycle_plan_and_apply_keep_foreign_rules(make_mount: Any) -> None:
    client = None
    m = make_mount(tier_expiring_delete_days=3)
    client = m.s3.client()
    client.put_bucket_lifecycle_configuration(Bucket=m.bucket, LifecycleConfiguration={"Rules": [FOREIGN]})
    plan = json.loads(ok(m.cli("lifecycle", "plan", str(m.path), "--json")))
    assert plan["add"] == ["ckptfs:ckpt:expiring"] and plan["keep"] == ["someone-elses"] and plan["changes"]
    rule = next(r for r in plan["rules"] if r["ID"] == "ckptfs:ckpt:expiring")
    assert rule["Filter"] == {"And": {"Prefix": "ckpt/", "Tags": [{"Key": "ckptfs-state", "Value": "expiring"}]}}
    assert rule["Expiration"] == {"Days": 3}
    text = ok(m.cli("lifecycle", "plan", str(m.path)))
    assert "+ ckptfs:ckpt:expiring" in text and "someone-elses (not ckptfs's: kept)" in text
    ok(m.cli("lifecycle", "apply", str(m.path)))
    ids = sorted(r["ID"] for r in client.get_bucket_lifecycle_configuration(Bucket=m.bucket)["Rules"])
    assert ids == ["ckptfs:ckpt:expiring", "someone-elses"]
    again = json.loads(ok(m.cli("lifecycle", "plan", str(m.path), "--json")))
    assert not again["changes"] and again["unchanged"] == ["ckptfs:ckpt:expiring"]
    m.stop()

    # transitions: SeaweedFS answers 501; one line naming what is unsupported, and nothing changed
    t = make_mount("t", tier_transitions="30:STANDARD_IA,90:GLACIER_IR", tier_expiring_delete_days=3)
    plan = json.loads(ok(t.cli("lifecycle", "plan", str(t.path), "--json")))
    tiers = next(r for r in plan["rules"] if r["ID"] == "ckptfs:ckpt:tiers")
    assert tiers["Transitions"] == [{"Days": 30, "StorageClass": "STANDARD_IA"}, {"Days": 90, "StorageClass": "GLACIER_IR"}]
    assert tiers["Filter"]["And"]["Tags"] == [{"Key": "ckptfs-state", "Value": "committed"}, {"Key": "ckptfs-protected", "Value": "false"}]
    proc = t.cli("lifecycle", "apply", str(t.path))
    assert proc.returncode == 1
    err = proc.stderr.strip()
    assert "\n" not in err and "does not support lifecycle" in err and "transitions" in err and "501" in err, err
    ids = sorted(r["ID"] for r in client.get_bucket_lifecycle_configuration(Bucket=m.bucket)["Rules"])
    assert ids == ["ckptfs:ckpt:expiring", "someone-elses"]


def test_restore_of_objects_in_no_archive_class_says_so(make_mount: Any) -> None:
    m = make_mount()
    (m.path / "step_1").mkdir()
    (m.path / "step_1" / "a.bin").write_bytes(b"a" * 100)
    m.flush()
    out = ok(m.cli("restore", str(m.path / "step_1")))
    assert "step_1: its file is not in an archive class: nothing to restore" in out  # the file, not its objects
    assert json.loads(ok(m.cli("restore", str(m.path / "step_1" / "a.bin"), "--json")))["archived"] == 0
    proc = m.cli("restore", str(m.path / "nope"))
    assert proc.returncode != 0 and "no such file" in proc.stderr


def test_usage_and_storage_metrics(make_mount: Any) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from tests.support.seaweed import free_port

    m = make_mount(start=False, checkpoint_quiet_seconds=3600, storage_prices="STANDARD:2.0")
    m.metrics_port = free_port()
    m.start()
    for step, size in ((100, 300_000), (200, 500_000)):
        d = m.path / "run1" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "model.bin").write_bytes(b"x" * size)
    (m.path / "run1" / "notes.txt").write_bytes(b"n" * 1000)
    m.flush()
    ok(m.cli("checkpoint", "commit", str(m.path / "run1" / "step_100")))
    u = json.loads(ok(m.cli("usage", str(m.path), "--json")))
    manifest = m.head("run1/step_100/" + MANIFEST)["ContentLength"]
    assert u["objects"] == 4 and u["bytes"] == 801_000 + manifest
    assert u["by_state"]["committed"] == {"bytes": 300_000 + manifest, "objects": 2}
    assert u["by_state"]["writing"] == {"bytes": 500_000, "objects": 1}
    assert u["by_state"]["none"] == {"bytes": 1000, "objects": 1}
    assert list(u["by_class"]) == ["STANDARD"] and u["by_class"]["STANDARD"]["objects"] == 4
    assert abs(u["monthly_cost_estimate"] - u["bytes"] / (1 << 30) * 2.0) < 1e-3
    assert u["by_run"]["run1"]["checkpoints"] == 2 and u["by_run"]["run1"]["bytes"] == 800_000 + manifest
    assert [(c["path"], c["state"], c["storage_class"]) for c in u["by_checkpoint"]] == [
        ("run1/step_100", "committed", "STANDARD"), ("run1/step_200", "writing", "STANDARD")]
    sub = json.loads(ok(m.cli("usage", str(m.path / "run1" / "step_200"), "--json")))
    assert sub["bytes"] == 500_000 and sub["objects"] == 1
    human = ok(m.cli("usage", str(m.path)))
    assert "per month" in human and "by storage class" in human
    assert f"about {fmt_money(u['monthly_cost_estimate'])} per month" in human  # the page's way: with the currency
    # the scrape shows the catalogue walk `usage` of the whole mount just made
    text = urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=30).read().decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert got[("ckptfs_storage_bytes", (("state", "committed"), ("storage_class", "STANDARD")))] == 300_000 + manifest
    assert got[("ckptfs_storage_bytes", (("state", "writing"), ("storage_class", "STANDARD")))] == 500_000
    assert abs(got[("ckptfs_storage_monthly_cost_estimate", (("storage_class", "STANDARD"),))] - 800_000 * 2.0 / (1 << 30) - manifest * 2.0 / (1 << 30)) < 1e-6
    assert got[("ckptfs_checkpoint_tag_errors_total", ())] == 0


def test_versioned_bucket_noncurrent_versions_counted_warned_and_expired(make_mount: Any) -> None:
    m = make_mount(checkpoint_quiet_seconds=3600, storage_prices="STANDARD:2.0")
    client = m.s3.client()
    client.put_bucket_versioning(Bucket=m.bucket, VersioningConfiguration={"Status": "Enabled"})
    d = m.path / "run" / "step_1"
    d.mkdir(parents=True)
    (d / "model.bin").write_bytes(b"1" * 100_000)
    (d / "gone.bin").write_bytes(b"2" * 30_000)
    m.flush()
    (d / "model.bin").write_bytes(b"3" * 50_000)  # overwrite: the 100 kB version becomes noncurrent
    (d / "gone.bin").unlink()  # delete: a delete marker, the 30 kB version noncurrent
    m.flush()
    u = json.loads(ok(m.cli("usage", str(m.path), "--json")))
    assert u["bytes"] == 50_000 and u["objects"] == 1
    assert u["versioning"] == "Enabled"
    assert u["noncurrent"]["bytes"] == 130_000 and u["noncurrent"]["objects"] == 2 and u["noncurrent"]["delete_markers"] >= 1
    assert abs(u["monthly_cost_estimate"] - 180_000 / (1 << 30) * 2.0) < 1e-3
    assert "in 2 noncurrent versions" in " ".join(ok(m.cli("usage", str(m.path))).split())
    # the plan warns (one line on stderr), and changes nothing: no rule is configured
    proc = m.cli("lifecycle", "plan", str(m.path))
    assert proc.returncode == 0
    warning = [line for line in proc.stderr.splitlines() if "noncurrent" in line]
    assert len(warning) == 1 and "tier_noncurrent_delete_days" in warning[0], proc.stderr
    m.stop()

    t = make_mount("t", tier_noncurrent_delete_days=3)
    plan = json.loads(ok(t.cli("lifecycle", "plan", str(t.path), "--json")))
    assert plan["versioning"] == "Enabled" and not any("noncurrent" in w for w in plan["warnings"])
    assert plan["add"] == ["ckptfs:ckpt:noncurrent"]
    ok(t.cli("lifecycle", "apply", str(t.path)))
    rules = {r["ID"]: r for r in client.get_bucket_lifecycle_configuration(Bucket=t.bucket)["Rules"]}
    assert rules["ckptfs:ckpt:noncurrent"]["NoncurrentVersionExpiration"]["NoncurrentDays"] == 3
    assert rules["ckptfs:ckpt:noncurrent"]["Expiration"] == {"ExpiredObjectDeleteMarker": True}
    assert not json.loads(ok(t.cli("lifecycle", "plan", str(t.path), "--json")))["changes"]
