"""`ckptfs usage`'s sums: per checkpoint, run, state and storage class, and the cost estimate from the price table."""

from __future__ import annotations

from ckptfs.patterns import Patterns
from ckptfs.lifecycle.usage import summarize

GiB = 1 << 30
PRICES = {"STANDARD": 0.02, "GLACIER_IR": 0.004}


def test_sums_and_cost() -> None:
    pats = Patterns(["step_{step}"])
    checkpoints = [
        {"path": "run1/step_100", "step": 100, "state": "committed"},
        {"path": "run1/step_200", "step": 200, "state": "protected"},
        {"path": "run2/step_5", "step": 5, "state": "writing"},
    ]
    objects = [
        ("run1/step_100/a", 2 * GiB, "GLACIER_IR"),
        ("run1/step_100/.ckptfs-manifest.json", 1000, "STANDARD"),
        ("run1/step_200/a", GiB, "STANDARD"),
        ("run1/step_200/sub/b", GiB, "STANDARD"),
        ("run2/step_5/a", 10, "ONEZONE_IA"),  # not in the price table: priced as STANDARD
        ("run2/notes.txt", 5, "STANDARD"),
        (".ckptfs/audit/2026/e.json", 7, "STANDARD"),
    ]
    u = summarize("", objects, checkpoints, pats, PRICES)
    assert u["bytes"] == 4 * GiB + 1022 and u["objects"] == 7
    assert u["by_state"]["committed"] == {"bytes": 2 * GiB + 1000, "objects": 2}
    assert u["by_state"]["protected"] == {"bytes": 2 * GiB, "objects": 2}
    assert u["by_state"]["none"] == {"bytes": 12, "objects": 2}
    assert u["by_state"]["expiring"] == {"bytes": 0, "objects": 0}
    assert u["by_class"]["GLACIER_IR"]["monthly_cost"] == round(2 * 0.004, 4)
    assert u["by_class"]["ONEZONE_IA"]["price_per_gib_month"] == 0.02
    assert abs(u["monthly_cost_estimate"] - (2 * 0.004 + (2 * GiB + 1022) / GiB * 0.02)) < 1e-3
    assert u["by_run"]["run1"]["checkpoints"] == 2 and u["by_run"]["run1"]["bytes"] == 4 * GiB + 1000
    assert u["by_run"]["run2"] == {"bytes": 10, "objects": 1, "checkpoints": 1, "monthly_cost": 0.0}
    ck = {c["path"]: c for c in u["by_checkpoint"]}
    assert ck["run1/step_100"]["storage_class"] == "GLACIER_IR+STANDARD"
    assert ck["run1/step_200"]["monthly_cost"] == round(2 * 0.02, 4)
    assert [c["path"] for c in u["by_checkpoint"]] == ["run1/step_100", "run1/step_200", "run2/step_5"]


def test_noncurrent_versions_are_counted_and_priced() -> None:
    from ckptfs.lifecycle.usage import add_noncurrent
    from ckptfs.objects import NoncurrentVersions

    u = summarize("", [("run1/step_1/a", GiB, "STANDARD")], [], Patterns(["step_{step}"]), PRICES)
    nc = NoncurrentVersions(objects=3, bytes=3 * GiB, delete_markers=2, by_class={"STANDARD": GiB, "GLACIER_IR": 2 * GiB})
    u = add_noncurrent(u, "Enabled", nc, PRICES)
    assert u["bytes"] == GiB and u["objects"] == 1  # the current objects, as before
    assert u["noncurrent"] == {"objects": 3, "bytes": 3 * GiB, "delete_markers": 2, "monthly_cost": round(0.02 + 2 * 0.004, 4),
                               "by_class": {"GLACIER_IR": 2 * GiB, "STANDARD": GiB}}
    assert u["monthly_cost_estimate"] == round(0.02 + 0.02 + 2 * 0.004, 4)  # they are billed: in the estimate
