"""The trainers teams use, through a real mount (issue 24): Orbax's CheckpointManager (max_to_keep), the
Hugging Face Trainer (save_total_limit), Lightning's ModelCheckpoint and torch DCP with two ranks, each
saving three times on the CPU (tests/support/trainers.py).

For each: a reader polling the bucket during the saves never sees a temporary name; the bytes
uploaded (`ckptfs_uploaded_bytes_total`) are the bytes the trainer wrote; the checkpoints the
trainer kept are committed with their steps; and the newest reads back bit-identical through a
second, fresh mount.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, Mount, wait_for
from tests.integration.test_lifecycle import catalogue
from tests.support.seaweed import free_port
from tests.support.watch import BucketWatcher
from tests.support.extras import need

# store-side behaviour and real trainers: the FUSE transport changes nothing here
pytestmark = pytest.mark.one_transport

TEMPORARY = ("*.orbax-checkpoint-tmp*", "*.tmp", "tmp-*", ".tmp*")  # temporary_dir_patterns' defaults (issue 24)


def temporary(keys: set[str]) -> list[str]:
    """The keys with a temporary directory name anywhere in them."""
    return sorted(k for k in keys if any(fnmatch.fnmatchcase(part, pat) for part in k.split("/") for pat in TEMPORARY))


def uploaded_bytes(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == "ckptfs_uploaded_bytes_total")


def saves_three_times(make_mount: Any, tmp_path: Path, kind: str, run: str, committed: dict[str, int]) -> None:
    """Run trainer `kind` into `run` on a fresh mount and check what issue 24 asks of every trainer: `committed`
    are the checkpoints the trainer kept (path under `run` -> step)."""
    m: Mount = make_mount(start=False, checkpoint_quiet_seconds=1)
    m.metrics_port = free_port()
    m.start()
    out = tmp_path / f"{kind}.json"
    env = {**m.env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore", "JAX_PLATFORMS": "cpu"}
    with BucketWatcher(m.s3.client(), m.bucket, m.key(run)) as watch:
        proc = subprocess.run([sys.executable, "-m", "tests.support.trainers", kind, str(m.path / run), str(out)],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert watch.seen, "the reader saw no object at all"
    assert not temporary(watch.seen), f"temporary keys reached the bucket: {temporary(watch.seen)[:5]}"
    assert uploaded_bytes(m.metrics_port) == result["written"]  # every byte once: none twice, none lost
    wait_for(f"{sorted(committed)} committed", lambda: {p: e["state"] for p, e in catalogue(m, run).items()} == {
        f"{run}/{c}": "committed" for c in committed}, timeout=120)
    assert {p: e["step"] for p, e in catalogue(m, run).items()} == {f"{run}/{c}": step for c, step in committed.items()}
    other: Mount = make_mount("other", metadata_ttl=0)  # a fresh mount: every byte from the bucket
    newest = other.path / run / Path(result["newest"]).parent
    got = {rel: hashlib.sha256((newest / rel).read_bytes()).hexdigest() for rel in result["digests"]}
    assert got == result["digests"] and len(got) >= 1


# Orbax writes into `N.orbax-checkpoint-tmp/` (files there rewritten and removed before its rename): held back
# (temporary_dir_patterns), no key of it reaches the bucket and no byte travels twice
def test_orbax_checkpoint_manager_with_max_to_keep(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    need("orbax.checkpoint", "test")
    saves_three_times(make_mount, tmp_path, "orbax", "orbax-run", {"jax/2": 2, "jax/3": 3})


def test_transformers_trainer_with_save_total_limit(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    need("transformers", "test")
    saves_three_times(make_mount, tmp_path, "transformers", "hf-run", {"hf/checkpoint-4": 4, "hf/checkpoint-6": 6})


def test_lightning_model_checkpoint(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    need("lightning", "test")
    saves_three_times(make_mount, tmp_path, "lightning", "pl-run",
                      {f"lightning_logs/version_0/checkpoints/epoch=0-step={s}.ckpt": s for s in (1, 2, 3)})


def test_dcp_two_ranks(make_mount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    saves_three_times(make_mount, tmp_path, "dcp", "dcp-run", {"step_1": 1, "step_2": 2, "step_3": 3})
