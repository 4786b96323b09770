"""The peers campaign's checker (tests/support/peers_campaign.py) against bucket states made by hand: it must find
each kind of violation it claims to find, allow a loss only where the owner and its holder were lost together, and
find nothing in a bucket that holds exactly what was acknowledged. A checker that cannot fail proves nothing."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace
from typing import Any

from tests.support.peers_campaign import Bucket, Model, check_episode, classify


class HandBucket(Bucket):
    """The bucket as a dict key -> bytes, with the real Bucket's hashing and the listing's quoted ETags."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.cluster = SimpleNamespace(prefix="ckpt", bucket="b")  # type: ignore[assignment]
        self.objects = objects
        self._sha = {}

    def listing(self, prefix: str) -> dict[str, str]:
        return {k: '"' + hashlib.md5(v).hexdigest() + '"' for k, v in self.objects.items() if k.startswith(prefix)}

    def sha(self, key: str, etag: str) -> str | None:
        if key not in self.objects:
            return None
        self._sha[key, etag] = hashlib.sha256(self.objects[key]).hexdigest()
        return self._sha[key, etag]

    def json(self, key: str) -> dict[str, Any] | None:
        return dict(json.loads(self.objects[key])) if key in self.objects else None


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def model(*events: dict[str, Any]) -> Model:
    m = Model()
    for ev in events:
        m.apply(ev)
    return m


def op(i: int, kind: str, path: str | None = None) -> dict[str, Any]:
    return {"ev": "op", "i": i, "kind": kind, "path": path}


def ack(path: str, data: bytes, how: str = "fsync") -> dict[str, Any]:
    return {"ev": "ack", "path": path, "sha": sha(data), "size": len(data), "how": how}


def rename(src: str, dst: str, is_dir: bool = False) -> dict[str, Any]:
    return {"ev": "rename", "src": src, "dst": dst, "dir": is_dir}


V1, V2 = b"one" * 100, b"two" * 100
SAVED = model(op(0, "file"), ack("ep0/f.bin.tmp", V1), rename("ep0/f.bin.tmp", "ep0/f.bin"), {"ev": "op_done", "i": 0})


def whats(found: list[Any]) -> list[tuple[str, str, bool]]:
    return sorted((f.what, f.name, f.allowed) for f in found)


def test_exactly_what_was_acknowledged_is_no_finding() -> None:
    assert check_episode(HandBucket({"ckpt/ep0/f.bin": V1}), "ckpt/ep0/", SAVED, None, None, set()) == []


def test_a_lost_file_a_misnamed_one_and_a_temporary_name_left_are_found() -> None:
    assert whats(check_episode(HandBucket({}), "ckpt/ep0/", SAVED, None, None, set())) == [("lost", "ep0/f.bin", False)]
    found = check_episode(HandBucket({"ckpt/ep0/f.bin.tmp": V1}), "ckpt/ep0/", SAVED, None, None, set())
    assert whats(found) == [("left", "ep0/f.bin.tmp", False), ("misnamed", "ep0/f.bin", False)]
    assert {classify(f, "owner:kill", SAVED) for f in found} == {"4"}  # a file's rename that did not survive its node


def test_an_older_version_is_a_regression_and_a_deleted_name_must_be_gone() -> None:
    m = model(op(0, "file"), ack("ep0/f.bin", V1), op(1, "overwrite", "ep0/f.bin"), ack("ep0/f.bin", V2),
              op(2, "file"), ack("ep0/g.bin", V1), {"ev": "unlink", "path": "ep0/g.bin"})
    found = check_episode(HandBucket({"ckpt/ep0/f.bin": V1, "ckpt/ep0/g.bin": V1}), "ckpt/ep0/", m, None, None, set())
    assert whats(found) == [("left", "ep0/g.bin", False), ("regressed", "ep0/f.bin", False)]
    assert "deleted" in next(f.detail for f in found if f.what == "left")


def test_a_regression_between_two_looks_is_found_even_if_it_heals() -> None:
    m = model(op(0, "file"), ack("ep0/f.bin", V1), op(1, "overwrite", "ep0/f.bin"), ack("ep0/f.bin", V2))
    seen: dict[str, int] = {}
    assert check_episode(HandBucket({"ckpt/ep0/f.bin": V2}), "ckpt/ep0/", m, None, None, set(), seen) == []
    found = check_episode(HandBucket({"ckpt/ep0/f.bin": V1}), "ckpt/ep0/", m, None, None, set(), seen)
    assert [f.what for f in found] == ["regressed", "regressed"] and "went back" in found[0].detail


def test_a_rewrite_that_never_returned_leaves_the_version_before_or_nothing() -> None:
    m = model(op(0, "file"), ack("ep0/f.bin", V1), op(1, "overwrite", "ep0/f.bin"))
    for bucket in ({"ckpt/ep0/f.bin": V1}, {}):
        assert check_episode(HandBucket(bucket), "ckpt/ep0/", m, None, None, set()) == []


def test_an_unlink_that_never_returned_leaves_the_file_or_nothing_and_a_returned_one_nothing() -> None:
    """Campaign seed 307462893 episode 18: the writer lost mid-unlink; the file gone from the bucket was found lost."""
    m = model(op(0, "file"), ack("ep0/f.bin", V1), {"ev": "op_done", "i": 0}, op(1, "delete", "ep0/f.bin"))
    for bucket in ({"ckpt/ep0/f.bin": V1}, {}):
        assert check_episode(HandBucket(bucket), "ckpt/ep0/", m, None, None, set()) == []
    assert whats(check_episode(HandBucket({"ckpt/ep0/f.bin": V2}), "ckpt/ep0/", m, None, None, set()))  # other bytes: found
    m.apply({"ev": "unlink", "path": "ep0/f.bin"})
    assert [f.what for f in check_episode(HandBucket({"ckpt/ep0/f.bin": V1}), "ckpt/ep0/", m, None, None, set())] != []
    # only the operation in flight when the writer stopped: one that began later cannot leave the delete unsettled
    m2 = model(op(0, "file"), ack("ep0/f.bin", V1), op(1, "delete", "ep0/f.bin"), op(2, "file"))
    assert whats(check_episode(HandBucket({}), "ckpt/ep0/", m2, None, None, set())) == [("lost", "ep0/f.bin", False)]


def test_a_loss_is_allowed_only_for_what_the_bucket_lacked_when_owner_and_holder_were_lost_together() -> None:
    m = model(op(0, "file"), ack("ep0/a.bin", V1), op(1, "file"), ack("ep0/b.bin", V2))
    bucket = HandBucket({"ckpt/ep0/a.bin": V1})
    at_loss = bucket.listing("ckpt/ep0/")
    for k, e in at_loss.items():
        bucket.sha(k, e)
    bucket.objects.clear()  # a.bin was durable at the double loss and is gone since: not allowed; b.bin never was
    found = check_episode(bucket, "ckpt/ep0/", m, at_loss, None, set())
    assert whats(found) == [("lost", "ep0/a.bin", False), ("lost", "ep0/b.bin", True)]
    assert [f.allowed for f in check_episode(bucket, "ckpt/ep0/", m, None, None, set())] == [False, False]


def dcp(step: str, shards: list[bytes]) -> list[dict[str, Any]]:
    evs: list[dict[str, Any]] = [op(0, "dcp")]
    for j, data in enumerate(shards):
        name = f"{step}/__{j}_0.distcp" if j < len(shards) - 1 else f"{step}/.metadata"
        evs += [ack(name + ".tmp", data), rename(name + ".tmp", name)]
    return evs + [{"ev": "checkpoint", "dir": step}]


def manifest(step: str, files: dict[str, bytes]) -> bytes:
    return json.dumps({"generation": 1, "files": [{"path": p, "etag": hashlib.md5(b).hexdigest()} for p, b in files.items()]}).encode()


def test_markers_and_manifests_over_missing_or_stale_files_and_a_checkpoint_never_committed() -> None:
    m = model(*dcp("ep0/step_1", [V1, b"meta"]))
    good = {"ckpt/ep0/step_1/__0_0.distcp": V1, "ckpt/ep0/step_1/.metadata": b"meta",
            "ckpt/ep0/step_1/.ckptfs-manifest.json": manifest("ep0/step_1", {"__0_0.distcp": V1, ".metadata": b"meta"})}
    assert check_episode(HandBucket(good), "ckpt/ep0/", m, None, None, set()) == []
    # committed over a missing shard: the marker and the manifest both stand over it
    missing = {k: v for k, v in good.items() if not k.endswith(".distcp")}
    assert whats(check_episode(HandBucket(missing), "ckpt/ep0/", m, None, None, set())) == [
        ("lost", "ep0/step_1/__0_0.distcp", False), ("manifest_stale", "ep0/step_1/__0_0.distcp", False),
        ("marker_over_missing", "ep0/step_1/__0_0.distcp", False)]
    # the manifest of other bytes than the bucket's
    stale = {**good, "ckpt/ep0/step_1/.ckptfs-manifest.json": manifest("ep0/step_1", {"__0_0.distcp": V2, ".metadata": b"meta"})}
    assert whats(check_episode(HandBucket(stale), "ckpt/ep0/", m, None, None, set())) == [("manifest_stale", "ep0/step_1/__0_0.distcp", False)]
    # every file in, no manifest: never committed (case 5), unless that check is switched off
    bare = {k: v for k, v in good.items() if ".ckptfs" not in k}
    found = check_episode(HandBucket(bare), "ckpt/ep0/", m, None, None, set())
    assert whats(found) == [("not_committed", "ep0/step_1", False)] and classify(found[0], "owner:kill", m) == "5"
    assert check_episode(HandBucket(bare), "ckpt/ep0/", m, None, None, {"check:committed"}) == []
    # DCP's .metadata under its temporary name: left, misnamed (case 4)
    tmp = {"ckpt/ep0/step_1/__0_0.distcp": V1, "ckpt/ep0/step_1/.metadata.tmp": b"meta"}
    found = check_episode(HandBucket(tmp), "ckpt/ep0/", m, None, None, {"check:committed"})
    assert whats(found) == [("left", "ep0/step_1/.metadata.tmp", False), ("misnamed", "ep0/step_1/.metadata", False)]
    assert {classify(f, "owner:kill", m) for f in found} == {"4"}


def test_a_renamed_directory_moves_its_files_and_leaves_its_old_names_to_be_gone() -> None:
    m = model(op(0, "dir"), ack("ep0/checkpoint-1.partial/shard_0.bin", V1),
              {"ev": "durable", "path": "ep0/checkpoint-1.partial"},
              rename("ep0/checkpoint-1.partial", "ep0/checkpoint-1", is_dir=True))
    assert set(m.files) == {"ep0/checkpoint-1/shard_0.bin"}
    assert m.gone == {"ep0/checkpoint-1.partial/shard_0.bin": "renamed away"}
    found = check_episode(HandBucket({"ckpt/ep0/checkpoint-1.partial/shard_0.bin": V1}), "ckpt/ep0/", m, None, None,
                          {"check:committed"})
    assert whats(found) == [("left", "ep0/checkpoint-1.partial/shard_0.bin", False), ("misnamed", "ep0/checkpoint-1/shard_0.bin", False)]
    assert classify(found[1], "owner:kill", m) == "1"


def test_a_rename_that_never_returned_leaves_the_file_under_one_of_its_two_names_never_both_nor_neither() -> None:
    """The node lost under a rename: it happened or it did not (seed 10:2 in CI: the bucket had `f5.bin` for the
    acknowledged `f5.bin.tmp` whose rename failed with ECONNABORTED)."""
    m = model(op(0, "close_only"), ack("ep0/f.bin.tmp", V1, how="close"),
              {"ev": "renaming", "src": "ep0/f.bin.tmp", "dst": "ep0/f.bin"},
              {"ev": "error", "error": "op 0 close_only: ConnectionAbortedError"})
    assert check_episode(HandBucket({"ckpt/ep0/f.bin.tmp": V1}), "ckpt/ep0/", m, None, None, set()) == []
    assert check_episode(HandBucket({"ckpt/ep0/f.bin": V1}), "ckpt/ep0/", m, None, None, set()) == []
    both = check_episode(HandBucket({"ckpt/ep0/f.bin.tmp": V1, "ckpt/ep0/f.bin": V1}), "ckpt/ep0/", m, None, None, set())
    assert whats(both) == [("left", "ep0/f.bin", False)]
    assert whats(check_episode(HandBucket({}), "ckpt/ep0/", m, None, None, set())) == [("lost", "ep0/f.bin.tmp", False)]
    assert whats(check_episode(HandBucket({"ckpt/ep0/f.bin": V2}), "ckpt/ep0/", m, None, None, set())) == [
        ("corrupt", "ep0/f.bin", False)]
    # a directory's rename in doubt moves every file under it; a rename that returned is no longer in doubt
    d = model(op(0, "dir"), ack("ep0/c.tmp/s0.bin", V1), ack("ep0/c.tmp/s1.bin", V2),
              {"ev": "renaming", "src": "ep0/c.tmp", "dst": "ep0/c"})
    assert check_episode(HandBucket({"ckpt/ep0/c/s0.bin": V1, "ckpt/ep0/c/s1.bin": V2}), "ckpt/ep0/", d, None, None, set()) == []
    d.apply(rename("ep0/c.tmp", "ep0/c", is_dir=True))
    assert whats(check_episode(HandBucket({"ckpt/ep0/c.tmp/s0.bin": V1, "ckpt/ep0/c/s1.bin": V2}), "ckpt/ep0/", d, None,
                               None, set())) == [("left", "ep0/c.tmp/s0.bin", False), ("misnamed", "ep0/c/s0.bin", False)]
