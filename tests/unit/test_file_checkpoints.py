"""Checkpoints saved as one file: `file:` patterns and where their own objects are (docs/lifecycle.md)."""

from __future__ import annotations

import dataclasses

import pytest

from ckptfs.config import Config
from ckptfs.lifecycle.place import file_owner, files_base, own_key, own_name, pick
from ckptfs.objects import Listing, RemoteObject
from ckptfs.patterns import Checkpoint, Patterns

DEFAULTS: list[str] = next(f.default_factory() for f in dataclasses.fields(Config) if f.name == "checkpoint_patterns")  # type: ignore[misc]
LIGHTNING = "lightning_logs/version_0/checkpoints"


@pytest.mark.parametrize("path, expected", [
    (f"{LIGHTNING}/epoch=0-step=100.ckpt", Checkpoint(f"{LIGHTNING}/epoch=0-step=100.ckpt", 100, file=True)),
    ("epoch=12-step=34567.ckpt", Checkpoint("epoch=12-step=34567.ckpt", 34567, file=True)),  # at the root, any directory
    ("run/checkpoints/model_1200.pt", Checkpoint("run/checkpoints/model_1200.pt", 1200, file=True)),  # every digit
    ("run/checkpoints/step-5.ckpt", Checkpoint("run/checkpoints/step-5.ckpt", 5, file=True)),
    ("run/model_1200.pt", None),  # *.pt counts under a checkpoints/ directory only
    (f"{LIGHTNING}/last.ckpt", None),  # no step in the name
    (f"{LIGHTNING}/.epoch=0-step=100.ckpt", None),  # hidden: a tool's temporary name
    ("run/checkpoints/model_1200.pt.tmp", None),
    ("run/step_100/checkpoints/model_5.pt", Checkpoint("run/step_100", 100)),  # inside a directory checkpoint: part of it
])
def test_default_file_patterns(path: str, expected: Checkpoint | None) -> None:
    assert Patterns(DEFAULTS).checkpoint_of(path, is_dir=False) == expected
    assert Patterns(DEFAULTS).checkpoint_of(path) == expected  # a path named on the command line: either kind


def test_directory_patterns_never_match_files_nor_file_patterns_directories() -> None:
    p = Patterns(DEFAULTS)
    assert p.checkpoint_of("logs/100", is_dir=False) is None
    assert p.checkpoint_of(f"{LIGHTNING}/epoch=0-step=100.ckpt", is_dir=True) is None
    assert p.checkpoint_of(f"{LIGHTNING}/epoch=0-step=100.ckpt/x", is_dir=False) is None


def test_file_patterns_alone_and_with_directories_above() -> None:
    p = Patterns(["file:ckpts/run_*/*{step}.safetensors"])
    assert p.enabled and p.step("step_1") is None
    assert p.checkpoint_of("a/ckpts/run_7/model-300.safetensors", is_dir=False) == Checkpoint("a/ckpts/run_7/model-300.safetensors", 300, True)
    assert p.checkpoint_of("a/ckpts/model-300.safetensors", is_dir=False) is None
    assert p.checkpoint_of("model-300.safetensors", is_dir=False) is None


def test_own_objects_of_a_file_checkpoint_are_siblings_named_after_it() -> None:
    ck = Checkpoint(f"{LIGHTNING}/epoch=0-step=100.ckpt", 100, file=True)
    assert files_base("p/", ck) == f"p/{LIGHTNING}/"
    assert own_key("p/", ck, ".ckptfs-manifest.json") == f"p/{LIGHTNING}/.ckptfs-manifest.epoch=0-step=100.ckpt.json"
    assert own_name(Checkpoint("epoch=0-step=1.ckpt", 1, True), ".ckptfs-protected.json") == ".ckptfs-protected.epoch=0-step=1.ckpt.json"
    assert file_owner(".ckptfs-protected.epoch=0-step=1.ckpt.json") == (".ckptfs-protected.json", "epoch=0-step=1.ckpt")
    assert file_owner(".ckptfs-manifest.json") is None  # a directory checkpoint's own
    d = Checkpoint("run/step_5", 5)
    assert own_key("p/", d, ".ckptfs-manifest.json") == "p/run/step_5/.ckptfs-manifest.json" and files_base("p/", d) == "p/run/step_5/"


def test_a_file_checkpoint_is_picked_out_of_its_directory_listing() -> None:
    ck = Checkpoint("c/epoch=0-step=1.ckpt", 1, file=True)
    names = ["epoch=0-step=1.ckpt", "epoch=0-step=10.ckpt", ".ckptfs-manifest.epoch=0-step=1.ckpt.json",
             ".ckptfs-manifest.epoch=0-step=10.ckpt.json", ".ckptfs-verify.epoch=0-step=1.ckpt.json", "last.ckpt"]
    listing = Listing([], [RemoteObject(n, 1, "e", 0.0) for n in names], False)
    assert sorted(o.name for o in pick(listing, ck).objects) == [".ckptfs-manifest.json", ".ckptfs-verify.json", "epoch=0-step=1.ckpt"]
