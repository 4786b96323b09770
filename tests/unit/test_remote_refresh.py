"""A lookup that finds its directory's listing deadline already past is answered, never an internal error (EIO)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from ckptfs import remote
from ckptfs.journal import ROOT_INODE
from ckptfs.remote import Remote, _Job

from tests.unit.test_journal import make_ns


def test_a_deadline_already_past_marks_the_directory_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = make_ns(tmp_path)
    d = ns.tree.mkdir(ROOT_INODE, "d", 0o755, 0, 0)
    r = Remote(ns, SimpleNamespace(), ns.cfg)  # type: ignore[arg-type]
    r.bound = 1.0
    r._jobs[d.ino] = _Job(progress_at=100.0)  # a listing under way, silent since t=100
    calls = []

    def clock() -> float:  # the request arrives at t=100; the loop gets back to it at t=110
        calls.append(1)
        return 100.0 if len(calls) == 1 else 110.0

    monkeypatch.setattr(remote.time, "monotonic", clock)
    trio.run(r.refresh, d.ino)
    assert d.ino in r.stale and r.listing_timeouts_total == 1
