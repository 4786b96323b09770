"""Checkpoint names and steps, manifest generations, and the conditional manifest write (docs/lifecycle.md)."""

from __future__ import annotations

import pytest

from ckptfs.cli.errors import CliError
from ckptfs.cli.lifecycle import parse_meta
from ckptfs.config import ConfigError, load_config
from ckptfs.lifecycle.manifest import FileEntry, Manifest, next_manifest, write_manifest
from ckptfs.objects import NO_OBJECT, PRECONDITION, StoreError, json_document
from ckptfs.patterns import Checkpoint, Patterns

DEFAULTS = ["step_{step}", "step-{step}", "checkpoint-{step}", "global_step{step}", "iter_{step}", "{step}"]


@pytest.mark.parametrize("path, expected", [
    ("step_100", Checkpoint("step_100", 100)),
    ("step-7/model.pt", Checkpoint("step-7", 7)),
    ("out/checkpoint-500/optimizer.pt", Checkpoint("out/checkpoint-500", 500)),
    ("global_step42/mp_rank_00_model_states.pt", Checkpoint("global_step42", 42)),
    ("run/iter_0000100/mp_rank_00/model_optim_rng.pt", Checkpoint("run/iter_0000100", 100)),  # Megatron
    ("orbax/1000/state/manifest.ocdbt", Checkpoint("orbax/1000", 1000)),  # Orbax: a bare number
    ("runs/llama/step_3/step_4/x", Checkpoint("runs/llama/step_3", 3)),  # the outermost match is the checkpoint
    ("orbax/1000.orbax-checkpoint-tmp-17/x", None),  # a tool's temporary directory is not one
    ("step_100.tmp/x", None),
    (".ckptfs/audit/2026", None),
    ("notes/readme", None),
])
def test_default_patterns(path: str, expected: Checkpoint | None) -> None:
    assert Patterns(DEFAULTS).checkpoint_of(path) == expected


def test_a_file_named_like_a_checkpoint_is_not_one() -> None:
    assert Patterns(DEFAULTS).checkpoint_of("logs/100", is_dir=False) is None
    assert Patterns(DEFAULTS).checkpoint_of("100/model.pt", is_dir=False) == Checkpoint("100", 100)


def test_custom_patterns_with_wildcards() -> None:
    p = Patterns(["ckpt_*_{step}", "epoch={step}"])
    assert p.step("ckpt_llama7b_120") == 120 and p.step("epoch=3") == 3
    assert p.step("step_5") is None and p.step("ckpt_x_12a") is None
    assert not Patterns([]).enabled and Patterns([]).checkpoint_of("step_1") is None


@pytest.mark.parametrize("patterns, message", [
    ('["step"]', "must contain {step} exactly once"),
    ('["{step}_{step}"]', "must contain {step} exactly once"),
    ('["run/step_{step}"]', "without '/'"),
    # file: patterns (a checkpoint saved as one file)
    ('["file:"]', "give a file name"),
    ('["file:{step}/model.pt"]', "belongs in the file's name"),
    ('["file:a//{step}.pt"]', "none empty"),
    ('["file:model.pt"]', "must contain {step} exactly once"),
])
def test_bad_patterns_are_one_line(tmp_path, patterns: str, message: str) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "c.toml"
    f.write_text(f"checkpoint_patterns = {patterns}\n")
    with pytest.raises(ConfigError, match="checkpoint_patterns") as e:
        load_config(str(f), environ={}, overrides=dict(bucket="ckpt", mountpoint="/m", cache_dir="/c"))
    assert message in str(e.value) and "\n" not in str(e.value)


def files(*specs: tuple[str, int, str]) -> list[FileEntry]:
    return [FileEntry(p, f"k/{p}", size, etag, "x" * 32, 10.0) for p, size, etag in specs]


def test_manifest_generations() -> None:
    first = next_manifest(None, "step_1", 1, files(("a", 1, "e1"), ("b", 2, "e2")), "quiet", None, now=100.0, node="node-1")
    assert first is not None and first.node == "node-1"  # the committing node as node_name names it, not the host
    assert first is not None and (first.generation, first.changed, first.bytes) == (1, False, 3)
    first.etag = "m1"
    # the same content again: nothing to write
    assert next_manifest(first, "step_1", 1, files(("b", 2, "e2"), ("a", 1, "e1")), "quiet", None, node="node-1") is None
    # metadata only: a new generation, not a change
    meta = next_manifest(first, "step_1", 1, files(("a", 1, "e1"), ("b", 2, "e2")), "command", {"loss": 1.5}, now=200.0, node="node-1")
    assert meta is not None and (meta.generation, meta.changed, meta.metadata) == (2, False, {"loss": 1.5})
    assert meta.first_committed_at == 100.0 and meta.committed_at == 200.0
    # another file's bytes: a change, and it stays marked
    changed = next_manifest(meta, "step_1", 1, files(("a", 1, "e9"), ("b", 2, "e2")), "quiet", None, node="node-1")
    assert changed is not None and (changed.generation, changed.changed, changed.metadata) == (3, True, {"loss": 1.5})
    later = next_manifest(changed, "step_1", 1, files(("a", 1, "e9"), ("b", 2, "e2")), "command", {"x": 1}, node="node-1")
    assert later is not None and later.changed
    assert Manifest.from_json(changed.to_json(), "m3").files == changed.files


class RacingStore:
    """A bucket in memory whose first conditional write loses to another node's (as S3 answers 412)."""

    def __init__(self, other: Manifest) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.other = other
        self.puts: list[dict[str, object]] = []

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        if key not in self.objects:
            raise StoreError(NO_OBJECT, "no")
        return self.objects[key]

    def put_bytes(self, key: str, body: bytes, if_none_match: bool = False, if_match: str | None = None) -> str:
        self.puts.append({"if_none_match": if_none_match, "if_match": if_match})
        if len(self.puts) == 1:
            self.objects[key] = (self.other.to_json(), "theirs")  # the other node got there first
        current = self.objects.get(key)
        if (if_none_match and current is not None) or (if_match is not None and (current is None or current[1] != if_match)):
            raise StoreError(PRECONDITION, "lost")
        etag = f"e{len(self.puts)}"
        self.objects[key] = (body, etag)
        return etag


def test_conditional_write_that_loses_reads_the_winner() -> None:
    mine = files(("a", 1, "e1"))
    theirs = next_manifest(None, "step_1", 1, mine, "quiet", None, node="node-1")
    assert theirs is not None
    store = RacingStore(theirs)
    manifest, wrote = write_manifest(store, "k/.ckptfs-manifest.json",  # type: ignore[arg-type]
                                     lambda existing: next_manifest(existing, "step_1", 1, mine, "quiet", None, node="node-1"))
    assert not wrote and manifest.etag == "theirs" and store.puts == [{"if_none_match": True, "if_match": None}]
    # the winner described other content: ours replaces it with If-Match on its ETag, as a change
    other = next_manifest(None, "step_1", 1, files(("a", 1, "old")), "quiet", None, node="node-1")
    assert other is not None
    store = RacingStore(other)
    manifest, wrote = write_manifest(store, "k/.ckptfs-manifest.json",  # type: ignore[arg-type]
                                     lambda existing: next_manifest(existing, "step_1", 1, mine, "quiet", None, node="node-1"))
    assert wrote and (manifest.generation, manifest.changed) == (2, True)
    assert store.puts[-1] == {"if_none_match": False, "if_match": "theirs"}


def test_meta_options(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "m.json"
    f.write_text('{"eval": {"acc": 0.71}}')
    assert parse_meta(["lr=3e-4", "name=run 7", str(f)]) == {"lr": 3e-4, "name": "run 7", "eval": {"acc": 0.71}}
    for bad in ("novalue", "=x"):
        with pytest.raises(CliError, match="neither KEY=VALUE"):
            parse_meta([bad])
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(CliError, match="must hold an object"):
        parse_meta([str(tmp_path / "list.json")])


def test_json_written_into_the_bucket_is_strict_json_with_nan_as_null() -> None:
    """Issue 35: JSON has no NaN; a strict parser (other tools reading manifests) rejects Python's `NaN` token."""
    import json
    import math

    def strict(body: bytes) -> object:
        return json.loads(body, parse_constant=lambda token: pytest.fail(f"{token} in a stored JSON document"))

    assert strict(json_document({"loss": math.nan, "curve": [1.0, math.inf, (-math.inf, 2)], "n": 3})) == \
        {"loss": None, "curve": [1.0, None, [None, 2]], "n": 3}
    files = [FileEntry("model.bin", "ckpt/step_1/model.bin", 10, "e1", "x1", 5.0)]
    m = next_manifest(None, "step_1", 1, files, "command", {"loss": math.nan}, now=10.0, node="node-1")
    assert m is not None
    doc = strict(m.to_json())
    assert doc["metadata"] == {"loss": None} and doc["format"] == "ckptfs-manifest/1"  # type: ignore[index]
    assert Manifest.from_json(m.to_json()).metadata == {"loss": None}
    with pytest.raises(TypeError):
        json_document({"model": object()})  # not JSON at all: loud, not written
