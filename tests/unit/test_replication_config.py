"""[replica.NAME] tables: parsed into targets, every mistake one ConfigError line naming the fix; `select`."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs.config import ConfigError, load_config

BASE = 'source = "s3://primary/runs"\nmountpoint = "/mnt/x"\ncache_dir = "/tmp"\nendpoint_url = "http://127.0.0.1:8333"\n'


def load(tmp_path: Path, text: str, **kw):  # type: ignore[no-untyped-def]
    f = tmp_path / "c.toml"
    f.write_text(BASE + text)
    return load_config(str(f), environ=kw.pop("environ", {}), **kw)


def test_targets_parsed_with_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path, '[replica.dr]\nsource = "s3://dr/runs/"\nendpoint_url = "http://10.0.0.2:9000"\nprofile = "dr"\n'
                         '[replica.vault]\nsource = "s3://vault"\nselect = "protected"\n')
    dr, vault = cfg.replica["dr"], cfg.replica["vault"]
    assert (dr.bucket, dr.key_prefix, dr.endpoint_url, dr.profile, dr.region, dr.select) == ("dr", "runs/", "http://10.0.0.2:9000", "dr", "us-east-1", "all")
    assert (vault.bucket, vault.key_prefix, vault.endpoint_url, vault.select) == ("vault", "", "http://127.0.0.1:8333", "protected")  # the mount's endpoint
    assert load(tmp_path, "").replica == {}


@pytest.mark.parametrize("select, step, protected, wanted", [
    ("all", 7, False, True), ("protected", 7, False, False), ("protected", 7, True, True),
    ("every:100", 300, False, True), ("every:100", 350, False, False), ("every:100", 350, True, True),
])
def test_select(tmp_path: Path, select: str, step: int, protected: bool, wanted: bool) -> None:
    cfg = load(tmp_path, f'[replica.r]\nsource = "s3://dr"\nselect = "{select}"\n')
    assert cfg.replica["r"].wants(step, protected) is wanted


@pytest.mark.parametrize("table, message", [
    ('[replica.dr]\nendpoint_url = "http://x:1"\n', "has no source"),
    ('[replica.dr]\nsource = "dr"\n', "is not of the form s3://BUCKET"),
    ('[replica.dr]\nsource = "s3://dr"\nselect = "every:0"\n', "use all, protected or every:K"),
    ('[replica.dr]\nsource = "s3://dr"\nselect = "newest"\n', "use all, protected or every:K"),
    ('[replica.dr]\nsource = "s3://dr"\nbucket = "x"\n', "unknown key 'bucket'"),
    ('[replica.dr]\nsource = "s3://dr"\nendpoint_url = "dr.example"\n', "is not an http:// or https:// URL"),
    ('[replica.dr]\nsource = "s3://dr"\nregion = 5\n', "give a string"),
    ('[replica.dr]\nsource = "s3://primary/runs/sub"\nendpoint_url = "http://127.0.0.1:8333"\n', "overlaps the mount's own"),
    ('replica = "s3://dr"\n', "must be tables [replica.NAME]"),
    ('[replica.dr]\nsource = "s3://dr/a//b"\n', "[replica.dr] source 's3://dr/a//b' has an empty component"),
])
def test_mistakes_are_one_line(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, table)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_same_bucket_other_endpoint_or_prefix_is_fine(tmp_path: Path) -> None:
    cfg = load(tmp_path, '[replica.a]\nsource = "s3://primary/runs"\nendpoint_url = "http://other:8333"\n'
                         '[replica.b]\nsource = "s3://primary/copies"\nendpoint_url = "http://127.0.0.1:8333"\n')
    assert sorted(cfg.replica) == ["a", "b"]


def test_only_in_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"only as \[replica.NAME\] tables"):
        load(tmp_path, "", overrides={"replica": "s3://dr"})
    with pytest.raises(ConfigError, match=r"environment variable CKPTFS_REPLICA: replica targets are given only as"):
        load(tmp_path, "", environ={"CKPTFS_REPLICA": "s3://dr"})


def test_replication_options_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="replication_part_size"):
        load(tmp_path, 'replication_part_size = "1MiB"\n')
    with pytest.raises(ConfigError, match="replication_interval"):
        load(tmp_path, "replication_interval = 0\n")
    with pytest.raises(ConfigError, match="replication_read_timeout"):
        load(tmp_path, "replication_read_timeout = nan\n")
    with pytest.raises(ConfigError, match="replication_parts_in_flight"):
        load(tmp_path, "replication_parts_in_flight = 0\n")
    assert load(tmp_path, "read_only = true\n").read_only is True


def test_own_retention_parsed_and_only_ever_longer_than_the_primary(tmp_path: Path) -> None:
    primary = "retention_keep_last = 5\nretention_keep_every_steps = 1000\nretention_keep_every_seconds = 3600\n"
    cfg = load(tmp_path, primary + '[replica.dr]\nsource = "s3://dr"\nkeep_last = 20\nkeep_every_steps = 500\nkeep_every_seconds = 600\n'
                                   '[replica.plain]\nsource = "s3://plain"\n')
    dr = cfg.replica["dr"]
    assert (dr.keep_last, dr.keep_every_steps, dr.keep_every_seconds) == (20, 500, 600.0)
    assert dr.own_policy == "keep_last = 20, keep_every_steps = 500, keep_every_seconds = 600"
    assert cfg.replica["plain"].own_policy is None
    # equal to the primary's is keeping as much: fine
    assert load(tmp_path, primary + '[replica.dr]\nsource = "s3://dr"\nkeep_last = 5\nkeep_every_steps = 1000\n').replica["dr"].keep_last == 5


@pytest.mark.parametrize("primary, keys, message", [
    ("retention_keep_last = 5\n", "keep_last = 2\n",
     "[replica.dr] keep_last = 2 keeps fewer than the primary's retention_keep_last = 5: a replica keeps at least what the primary keeps: "
     "give keep_last >= 5, or leave it out"),
    ("retention_keep_every_steps = 1000\n", "keep_every_steps = 300\n",
     "keep_every_steps = 300 would not keep every checkpoint the primary's retention_keep_every_steps = 1000 keeps: give a divisor of 1000"),
    ("retention_keep_every_seconds = 3600\n", "keep_every_seconds = 7200\n",
     "keep_every_seconds = 7200 keeps fewer than the primary's retention_keep_every_seconds = 3600: give at most 3600"),
    ("", "keep_last = 10\n", "the primary's retention keeps every checkpoint (no retention_keep_* rule), and so does the replica"),
    ("retention_keep_last = 5\n", "keep_last = -1\n", "[replica.dr] keep_last = -1 in"),
    ("retention_keep_last = 5\n", 'keep_last = "10"\n', "give a whole number >= 0"),
    ("retention_keep_last = 5\n", "keep_last = 7.5\n", "give a whole number >= 0"),
    ("retention_keep_every_seconds = 60\n", 'keep_every_seconds = "1h"\n', "give a number of seconds >= 0"),
])
def test_own_retention_that_would_delete_what_the_primary_keeps_is_refused(tmp_path: Path, primary: str, keys: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, primary + '[replica.dr]\nsource = "s3://dr"\n' + keys)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_target_without_endpoint_inherits_the_mounts_however_given(tmp_path: Path) -> None:
    """An endpoint from --endpoint-url (an override), not the file: a target left without one must not go to AWS."""
    path = tmp_path / "c.toml"
    path.write_text('source = "s3://primary/runs"\nmountpoint = "/mnt/x"\ncache_dir = "/tmp"\nregion = "eu-west-1"\n'
                    '[replica.cold]\nsource = "s3://cold/runs"\n')
    cfg = load_config(str(path), {}, {"endpoint_url": "http://127.0.0.1:8333"})
    cold = cfg.replica["cold"]
    assert (cold.endpoint_url, cold.region) == ("http://127.0.0.1:8333", "eu-west-1")
