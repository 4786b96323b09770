from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs.config import ConfigError, MiB, GiB, load_config, markdown_reference, parse_size, parse_source

BASE = dict(bucket="ckpt", mountpoint="/mnt/ckpt", cache_dir="/var/cache/ckptfs")


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('source = "s3://filebucket/runs/a"\npart_size = "32MiB"\nmax_file_size = "100GiB"\nupload_delay = 2\nmax_parts_in_flight = 3\n')
    cfg = load_config(str(f), environ={"CKPTFS_UPLOAD_DELAY": "1.5", "CKPTFS_MAX_PARTS_IN_FLIGHT": "5"},
                      overrides=dict(mountpoint="/m", cache_dir="/c", max_parts_in_flight=7))
    assert (cfg.bucket, cfg.prefix) == ("filebucket", "runs/a")
    assert cfg.part_size == 32 * MiB  # file
    assert cfg.upload_delay == 1.5  # env beats file
    assert cfg.max_parts_in_flight == 7  # flag beats env
    assert cfg.key_prefix == "runs/a/"


@pytest.mark.parametrize(
    "content, message",
    [
        ("part_size = [", "is not valid TOML"),
        ("bogus = 1", "unknown option 'bogus'"),
        ('part_size = "4MiB"', "below the S3 minimum of 5 MiB"),
        ("cache_capacity = -5", "is negative"),
        ("upload_delay = -1", "is negative"),
        ('part_size = "5MiB"\nmax_file_size = "1TiB"', "more than 10,000 parts"),
        ('max_parts_in_flight = "many"', "is not a valid int"),
        ('metrics_addr = "nohost"', "is not HOST:PORT"),
        ('log_level = "loud"', "log_level"),
    ],
)
def test_bad_values_are_one_clear_line(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(content + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(f), environ={}, overrides=BASE)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/ckptfs.toml", environ={}, overrides=BASE)


def test_sizes_and_sources() -> None:
    assert parse_size("64MiB") == 64 * MiB
    assert parse_size("1G") == GiB
    assert parse_size(4096) == 4096
    with pytest.raises(ConfigError):
        parse_size("lots")
    assert parse_source("s3://b/x/y/") == ("b", "x/y")
    assert parse_source("s3://b") == ("b", "")
    with pytest.raises(ConfigError):
        parse_source("http://b/x")


def test_docs_are_generated_from_the_config() -> None:
    ref = markdown_reference()
    for name in ("part_size", "upload_delay", "commit_markers", "shutdown_timeout"):
        assert f"`{name}`" in ref
    doc = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    assert doc.read_text() == ref, "docs/configuration.md is stale: run make docs"
