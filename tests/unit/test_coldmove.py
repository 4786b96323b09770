"""Moving checkpoints to a cold target (lifecycle/coldmove.py): which are moved, resumed, finished or kept,
the settings, the storage-class label and what `ckptfs usage` counts for a moved checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckptfs.config import ConfigError, load_config
from ckptfs.lifecycle.coldmove import plan
from ckptfs.lifecycle.manifest import label, moved_away
from ckptfs.patterns import Patterns
from ckptfs.storageclass import parse_prices
from ckptfs.lifecycle.usage import summarize

BASE = dict(bucket="ckpt", mountpoint="/mnt/ckpt", cache_dir="/var/cache/ckptfs", endpoint_url="http://127.0.0.1:1", prefix="runs")
DAY = 86400.0
NOW = 1_800_000_000.0


def cfg(tmp_path: Path, **opts: Any) -> Any:
    conf = tmp_path / "c.toml"
    conf.write_text('[replica.cold]\nsource = "s3://cold-bucket/runs"\n')
    return load_config(str(conf), environ={}, overrides={**BASE, "tier_move_target": "cold", **opts})


def entry(path: str, age_days: float, state: str = "committed", **extra: Any) -> dict[str, Any]:
    return {"path": path, "step": int(path.rsplit("_", 1)[1]), "state": state, "committed": state != "writing",
            "protected": state == "protected", "committed_at": NOW - age_days * DAY, "hot_files": 3, **extra}


def decide(tmp_path: Path, entries: list[dict[str, Any]], busy: dict[str, str] | None = None, **opts: Any) -> dict[str, tuple[str, str]]:
    return {p: (a, r) for p, a, r in plan(entries, cfg(tmp_path, **opts), NOW, busy or {})}


def test_old_committed_checkpoints_move_and_the_others_stay(tmp_path: Path) -> None:
    out = decide(tmp_path, [
        entry("run/step_100", 100),
        entry("run/step_200", 100, "protected"),  # golden: never moved
        entry("run/step_300", 100, "expiring"),  # retention deletes it: not worth moving
        entry("run/step_400", 89),  # younger than the age
        entry("run/step_500", 100, "writing"),  # not committed
        entry("run/step_600", 100, "draining"),  # local work on this node
        entry("run/step_700", 100),  # a file of it is open here
    ], busy={"run/step_700": "a file of it is open"}, tier_move_after=90 * DAY)
    assert out["run/step_100"][0] == "move"
    assert out["run/step_200"] == ("keep", "protected")
    assert out["run/step_300"][0] == "keep" and "expiring" in out["run/step_300"][1]
    assert out["run/step_400"] == ("keep", f"committed less than tier_move_after ({90 * DAY:g} s) ago")
    assert out["run/step_500"] == ("keep", "not committed")
    assert out["run/step_600"] == ("keep", "in use on this node (draining)")
    assert out["run/step_700"] == ("keep", "in use on this node (a file of it is open)")


def test_interrupted_moves_are_resumed_or_finished(tmp_path: Path) -> None:
    moving = {"state": "moving", "target": "cold"}
    moved = {"state": "moved", "target": "cold"}
    out = decide(tmp_path, [
        entry("run/step_1", 100, moved=moving),
        entry("run/step_2", 100, "expiring", moved=moving),  # expiring meanwhile: the move is still finished
        entry("run/step_3", 100, moved=moved),  # hot files left by a move killed while deleting them
        entry("run/step_4", 100, moved=moved, hot_files=0),  # done
        entry("run/step_5", 100, "protected", moved=moving),  # protected mid-move: given up, the hot copy is whole
        entry("run/step_6", 100, moved={"state": "restoring", "target": "cold"}),
        entry("run/step_7", 1, moved=moving),  # a young one being moved (the age was lowered since): still resumed
    ], tier_move_after=90 * DAY)
    assert out["run/step_1"][0] == "resume"
    assert out["run/step_2"][0] == "resume"
    assert out["run/step_3"][0] == "finish"
    assert out["run/step_4"] == ("keep", "moved to cold")
    assert out["run/step_5"] == ("cancel", "protected")
    assert out["run/step_6"][0] == "keep" and "restor" in out["run/step_6"][1]
    assert out["run/step_7"][0] == "resume"


def test_a_restored_checkpoint_waits_the_age_again_from_its_restore(tmp_path: Path) -> None:
    out = decide(tmp_path, [
        entry("run/step_1", 100, moved={"state": "restored", "target": "cold", "at": NOW - 10 * DAY}),
        entry("run/step_2", 100, moved={"state": "restored", "target": "cold", "at": NOW - 91 * DAY}),
    ], tier_move_after=90 * DAY)
    assert out["run/step_1"] == ("keep", f"restored less than tier_move_after ({90 * DAY:g} s) ago")
    assert out["run/step_2"][0] == "move"


def test_labels_and_records() -> None:
    assert label(None) is None and label({"state": "restored", "target": "cold"}) is None
    assert label({"state": "moved", "target": "cold"}) == "moved:cold"
    assert label({"state": "moving", "target": "cold"}) == "moving:cold"
    assert moved_away(json.dumps({"state": "moved"}).encode()) and moved_away(b'{"state": "restoring"}')
    assert not moved_away(b'{"state": "restored"}') and not moved_away(b"not json")


def test_settings(tmp_path: Path) -> None:
    c = cfg(tmp_path, tier_move_after=60)
    assert c.tier_move_target == "cold" and c.tier_move_after == 60
    with pytest.raises(ConfigError, match=r"tier_move_target = 'glacier' names no \[replica.glacier\] table \(tables: cold\)"):
        cfg(tmp_path, tier_move_target="glacier")
    with pytest.raises(ConfigError, match="tier_move_after = 0.0: give a number of seconds > 0"):
        cfg(tmp_path, tier_move_after=0)
    assert parse_prices(["moved:cold:0.004", "STANDARD:0.02"]) == {"moved:cold": 0.004, "STANDARD": 0.02}


def test_usage_counts_a_moved_checkpoint_under_its_target() -> None:
    pats = Patterns(["step_{step}"])
    checkpoints = [
        {"path": "run/step_1", "step": 1, "state": "committed", "moved": {"state": "moved", "target": "cold", "bytes": 3 << 30, "files": 4}},
        {"path": "run/step_2", "step": 2, "state": "committed", "moved": {"state": "moving", "target": "cold", "bytes": 5, "files": 1}},
    ]
    objects = [("run/step_1/.ckptfs-manifest.json", 100, "STANDARD"), ("run/step_2/a", 5, "STANDARD")]
    u = summarize("", objects, checkpoints, pats, {"STANDARD": 0.02, "moved:cold": 0.004})
    assert u["by_class"]["moved:cold"]["bytes"] == 3 << 30 and u["by_class"]["moved:cold"]["objects"] == 4
    assert u["by_class"]["moved:cold"]["monthly_cost"] == round(3 * 0.004, 4)
    assert u["by_class"]["STANDARD"]["bytes"] == 105  # a move still running counts where its bytes are
    assert u["bytes"] == (3 << 30) + 105 and u["objects"] == 6
    ck = {c["path"]: c for c in u["by_checkpoint"]}
    assert ck["run/step_1"]["storage_class"] == "moved:cold+STANDARD" and ck["run/step_1"]["objects"] == 5
