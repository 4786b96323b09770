"""Retention's plan (gateway/lifecycle/retention.py): the keep rules as a union, and the checkpoints never deleted."""

from __future__ import annotations

from typing import Any

import pytest

from ckptfs.config import Config, ConfigError, load_config
from ckptfs.lifecycle.retention import plan

NOW = 1_800_000_000.0
DAY = 86400.0


def cfg(**kw: Any) -> Config:
    return Config(**{"retention_min_age": 0.0, "retention_grace": DAY, **kw})


def entry(path: str, step: int, committed_at: float | None = None, state: str = "committed", verified: bool = True,
          **kw: Any) -> dict[str, Any]:
    committed = state != "writing" or kw.pop("committed", False)
    at = NOW - DAY + step if committed_at is None else committed_at
    e = {"path": path, "step": step, "state": state, "committed": committed, "committed_at": at if committed else None,
         "first_committed_at": at if committed else None, "generation": 1, "protected": state == "protected",
         "protection": {"reason": "golden"} if state == "protected" else None, "retention": None,
         "last_verify": {"outcome": "whole", "generation": 1} if verified else None}
    e.update(kw)
    return e


def actions(decisions: list[Any]) -> dict[str, str]:
    return {d.path: d.action for d in decisions}


def test_no_policy_keeps_everything() -> None:
    entries = [entry(f"step_{s}", s) for s in (1, 2, 3)]
    ds = plan(entries, cfg(), NOW)
    assert set(actions(ds).values()) == {"keep"}
    assert "no retention policy" in ds[0].reason


def test_rules_are_a_union_and_the_newest_is_always_kept() -> None:
    steps = [100, 200, 300, 400, 500, 600, 700]
    entries = [entry(f"run/step_{s}", s) for s in steps]
    ds = {d.path: d for d in plan(entries, cfg(retention_keep_last=2, retention_keep_every_steps=300), NOW)}
    assert {p: d.action for p, d in ds.items()} == {
        "run/step_100": "delete", "run/step_200": "delete", "run/step_300": "keep", "run/step_400": "delete",
        "run/step_500": "delete", "run/step_600": "keep", "run/step_700": "keep"}
    assert ds["run/step_300"].reason == "kept by every 300 steps"
    assert ds["run/step_600"].rules == ["last 2", "every 300 steps"]
    assert ds["run/step_700"].reason.startswith("newest committed checkpoint")
    d = ds["run/step_100"]
    assert d.phase == "expire" and d.delete_after == NOW + DAY and "becomes expiring" in d.reason
    # keep_last 0 with a milestone rule: the newest still stays
    ds = plan(entries, cfg(retention_keep_every_steps=1000), NOW)
    assert [d.path for d in ds if d.action == "keep"] == ["run/step_700"]


def test_one_per_period_by_first_commit_time() -> None:
    hour = 3600.0
    times = {1: 0.0, 2: 0.4 * hour, 3: 1.1 * hour, 4: 1.5 * hour, 5: 2.2 * hour, 6: 2.3 * hour}
    entries = [entry(f"step_{s}", s, committed_at=NOW - DAY + t) for s, t in times.items()]
    ds = plan(entries, cfg(retention_keep_every_seconds=hour), NOW)
    assert [d.step for d in ds if "one per 3600 s" in d.rules] == [1, 3, 5]
    assert actions(ds) == {"step_1": "keep", "step_2": "delete", "step_3": "keep", "step_4": "delete", "step_5": "keep",
                           "step_6": "keep"}


def test_series_are_separate_directories() -> None:
    entries = [entry("a/step_1", 1), entry("a/step_2", 2), entry("b/step_1", 1), entry("b/step_5", 5)]
    ds = plan(entries, cfg(retention_keep_last=1), NOW)
    assert actions(ds) == {"a/step_1": "delete", "a/step_2": "keep", "b/step_1": "delete", "b/step_5": "keep"}


def test_never_deleted_protected_uncommitted_changing_young_restored() -> None:
    entries = [
        entry("step_1", 1, state="protected"),
        entry("step_2", 2, state="writing"),  # no manifest
        entry("step_3", 3, state="draining", committed=True),  # committed, being changed on this node
        entry("step_4", 4, retention={"state": "restored", "who": {"user": "ann"}, "at_iso": "x"}),
        entry("step_5", 5, committed_at=NOW - 60),  # younger than retention_min_age
        entry("step_6", 6),
        entry("step_7", 7, committed_at=NOW - 30),
    ]
    ds = {d.path: d for d in plan(entries, cfg(retention_keep_last=1, retention_min_age=3600.0), NOW)}
    assert {p: d.action for p, d in ds.items()} == {
        "step_1": "keep", "step_2": "keep", "step_3": "keep", "step_4": "keep", "step_5": "keep", "step_6": "delete",
        "step_7": "keep"}
    assert ds["step_1"].reason == "protected: golden" and ds["step_1"].rules == ["protected"]
    assert ds["step_2"].reason.startswith("not committed")
    assert ds["step_3"].reason == "being changed on this node (draining)"
    assert ds["step_4"].reason.startswith("restored by ann")
    assert "retention_min_age" in ds["step_5"].reason


def test_delete_waits_for_a_newer_verified_checkpoint() -> None:
    entries = [entry("step_1", 1, verified=False), entry("step_2", 2, verified=False), entry("step_3", 3, verified=False)]
    ds = {d.path: d for d in plan(entries, cfg(retention_keep_last=1), NOW)}
    assert ds["step_1"].action == "delete" and ds["step_1"].needs_verify == "step_3"
    assert "once step_3 passes a shallow verify" in ds["step_1"].reason
    # a verify of an earlier manifest generation does not count
    entries[2]["last_verify"] = {"outcome": "whole", "generation": 1, "stale": True}
    assert plan(entries, cfg(retention_keep_last=1), NOW)[0].needs_verify == "step_3"
    entries[1]["last_verify"] = {"outcome": "whole", "generation": 1}  # step_2 is newer than step_1 and verified
    ds = {d.path: d for d in plan(entries, cfg(retention_keep_last=1), NOW)}
    assert ds["step_1"].needs_verify is None and ds["step_2"].needs_verify == "step_3"


def test_expiring_checkpoints_wait_out_the_grace_period_or_come_back() -> None:
    mark = {"state": "expiring", "since": NOW - 100, "delete_after": NOW + 50}
    entries = [entry("step_1", 1, state="expiring", retention=dict(mark)), entry("step_2", 2),
               entry("step_3", 3, state="expiring", retention={**mark, "delete_after": NOW - 1}), entry("step_4", 4)]
    ds = {d.path: d for d in plan(entries, cfg(retention_keep_last=1), NOW)}
    assert (ds["step_1"].action, ds["step_1"].phase, ds["step_1"].delete_after) == ("delete", "wait", NOW + 50)
    assert (ds["step_3"].action, ds["step_3"].phase) == ("delete", "remove")
    assert ds["step_2"].phase == "expire"
    # a looser policy keeps them again (apply then lifts the mark)
    ds = {d.path: d for d in plan(entries, cfg(retention_keep_last=4), NOW)}
    assert {d.action for d in ds.values()} == {"keep"}


def test_plan_json_has_the_names_scripts_rely_on() -> None:
    ds = plan([entry("step_1", 1), entry("step_2", 2)], cfg(retention_keep_last=1), NOW)
    doc = [d.to_json() for d in ds]
    assert [(d["path"], d["action"]) for d in doc] == [("step_1", "delete"), ("step_2", "keep")]
    assert all(isinstance(d["reason"], str) and d["reason"] for d in doc)


@pytest.mark.parametrize("option, value, message", [
    ("retention_keep_last", "-1", "retention_keep_last = -1 is negative"),
    ("retention_grace", "-5", "retention_grace = -5.0 is negative"),
    ("retention_interval", "soon", "not a valid float"),
])
def test_retention_options_are_validated(option: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides={"bucket": "bkt", "mountpoint": "/m", "cache_dir": "/c", option: value})
