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


def test_a_compressed_cold_copy_counts_what_it_stores_and_what_it_saved() -> None:
    from ckptfs.lifecycle.usage import UsageCollector

    pats = Patterns(["step_{step}"])
    moved = {"state": "moved", "target": "cold", "files": 3, "bytes": 10 * GiB, "stored_bytes": 7 * GiB}
    older = {"state": "moved", "target": "cold", "files": 1, "bytes": GiB}  # a record from before compression: as it is
    checkpoints = [{"path": "r/step_1", "step": 1, "state": "committed", "moved": moved},
                   {"path": "r/step_2", "step": 2, "state": "committed", "moved": older},
                   {"path": "r/step_3", "step": 3, "state": "committed"}]
    objects = [("r/step_1/.ckptfs-manifest.json", 100, "STANDARD"), ("r/step_3/a", GiB, "STANDARD")]
    u = summarize("", objects, checkpoints, pats, {"STANDARD": 0.02, "moved:cold": 0.004})
    ck = {c["path"]: c for c in u["by_checkpoint"]}
    assert (ck["r/step_1"]["stored_bytes"], ck["r/step_1"]["original_bytes"]) == (7 * GiB + 100, 10 * GiB + 100)
    assert ck["r/step_1"]["bytes"] == 7 * GiB + 100 and ck["r/step_1"]["saved_bytes"] == 3 * GiB
    assert (ck["r/step_2"]["stored_bytes"], ck["r/step_2"]["saved_bytes"]) == (GiB, 0)
    assert (ck["r/step_3"]["stored_bytes"], ck["r/step_3"]["original_bytes"]) == (GiB, GiB)
    cold = u["by_class"]["moved:cold"]
    assert (cold["bytes"], cold["stored_bytes"], cold["original_bytes"], cold["saved_bytes"]) == (8 * GiB, 8 * GiB, 11 * GiB, 3 * GiB)
    assert cold["monthly_cost"] == round(8 * 0.004, 4)  # billed: what the cold target stores
    assert u["saved_bytes"] == 3 * GiB and u["by_class"]["STANDARD"]["saved_bytes"] == 0

    class Lc:  # what the collector reads: the last catalogue walk (catalogue.describe's entries)
        tag_errors_total = 0
        cfg = type("Cfg", (), {"storage_prices": []})()
        entries = [{"state": "committed", "storage_class": "moved:cold", "storage_classes": {"moved:cold": 7 * GiB}, "moved": moved,
                    "original_bytes": 10 * GiB, "stored_bytes": 7 * GiB}]

    samples = {(m.name, tuple(sorted(s.labels.items()))): s.value for m in UsageCollector(Lc()).collect() for s in m.samples}  # type: ignore[arg-type]
    labels = (("state", "committed"), ("storage_class", "moved:cold"))
    assert samples[("ckptfs_storage_saved_bytes", labels)] == 3 * GiB
    assert samples[("ckptfs_storage_bytes", labels)] == 7 * GiB


def test_money_is_shown_one_way_with_its_currency() -> None:
    """Issue 35: `usage` printed "about 0.01 per month" where the page showed `$0.0081`; one formatter for both."""
    from ckptfs.storageclass import fmt_money
    from ckptfs.ui.view import FILTERS

    assert [fmt_money(x) for x in (0.0, None, 0.0081, 0.0123, 1234.5)] == ["$0", "$0", "$0.0081", "$0.01", "$1,234.50"]
    assert FILTERS["money"] is fmt_money
