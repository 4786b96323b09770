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
        ("chache_capacity = 1", "c.toml (did you mean cache_capacity?)"),
        ('part_size = "4MiB"', "below the S3 minimum of 5 MiB"),
        ("cache_capacity = -5", "is negative"),
        ("upload_delay = -1", "is negative"),
        ('part_size = "5MiB"\nmax_file_size = "1TiB"', "more than 10,000 parts"),
        ('max_parts_in_flight = "many"', "is not a valid int"),
        ('metrics_addr = "nohost"', "is not HOST:PORT"),
        ('log_level = "loud"', "log_level"),
        ('cold_compression = "lz4"', "give auto, zstd or none"),
        ("cold_compression_threshold = 1.5", "give a fraction from 0 to below 1"),
        ('temporary_dir_patterns = ["ok.tmp", "a/b.tmp"]', "'a/b.tmp' is not a directory name pattern"),
        ("temporary_hold_seconds = -1", "temporary_hold_seconds = -1.0 is negative"),
        ("fuse_workers = 0", "fuse_workers = '0': give auto or a number from 1 to 64"),
        ('fuse_workers = "many"', "give auto or a number from 1 to 64"),
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


@pytest.mark.parametrize("value, expected", [
    ("1.5GiB", 3 * GiB // 2), ("800M", 800 * MiB), ("64MiB", 64 * MiB), ("4096", 4096), (4096, 4096),
    (4096.0, 4096), ("2 g", 2 * GiB), ("10B", 10),
])
def test_sizes_with_units(value: object, expected: int) -> None:
    assert parse_size(value, "cache_capacity") == expected


@pytest.mark.parametrize("value", [1.5, "1.5", "1.5B", "lots", "1e9", "", True, "5 parsecs", "GiB"])
def test_what_is_not_a_size_is_refused(value: object) -> None:
    with pytest.raises(ConfigError) as e:
        parse_size(value, "cache_capacity")
    assert "cache_capacity" in str(e.value) and "'1.5GiB'" in str(e.value)


@pytest.mark.parametrize("content, message", [
    ("cache_capacity = 1.5", "cache_capacity = 1.5 is not a whole number of bytes"),
    ('cache_capacity = "1.5"', "not a whole number of bytes"),
    ("max_parts_in_flight = 1.5", "max_parts_in_flight = 1.5 in"),
    ("read_timeout = 0", "read_timeout = 0.0: give a number of seconds greater than 0"),
    ("connect_timeout = -1", "connect_timeout"),
    ('prefix = "a//b"', "empty component"),
    ('source = "s3://b/runs/../x"', "a '..' component"),
    ('source = "s3://b/./x"', "a '.' component"),
])
def test_sizes_counts_timeouts_and_prefixes_from_the_file(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(content + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(f), environ={}, overrides=BASE)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_sizes_from_environment_and_flags() -> None:
    cfg = load_config(None, environ={"CKPTFS_CACHE_CAPACITY": "1.5GiB"}, overrides={**BASE, "part_size": "800M"})
    assert cfg.cache_capacity == 3 * GiB // 2 and cfg.part_size == 800 * MiB
    with pytest.raises(ConfigError, match="CKPTFS_|cache_capacity"):
        load_config(None, environ={"CKPTFS_CACHE_CAPACITY": "1.5"}, overrides=BASE)


def test_cache_min_free_scales_with_a_small_disk() -> None:
    from ckptfs.config import auto_min_free

    cfg = load_config(None, environ={}, overrides=BASE)
    assert cfg.cache_min_free is None  # auto
    assert auto_min_free(GiB) == GiB // 20  # 5% of a 1 GiB disk, not all of it
    assert auto_min_free(10_000 * GiB) == GiB
    assert load_config(None, environ={}, overrides={**BASE, "cache_min_free": "0"}).cache_min_free == 0
    assert load_config(None, environ={"CKPTFS_CACHE_MIN_FREE": "auto"}, overrides=BASE).cache_min_free is None


def test_source_prefix_components() -> None:
    assert parse_source("s3://b/runs/llama/") == ("b", "runs/llama")
    for bad in ("s3://b/a//b", "s3://b/..", "s3://b/x/./y"):
        with pytest.raises(ConfigError, match="component"):
            parse_source(bad)


def test_a_cache_dir_too_long_for_the_control_socket_is_one_clear_line(tmp_path: Path) -> None:
    """Found by the bench smoke test: a daemon whose control socket path did not fit a Unix socket died at start-up
    with a traceback (OSError: AF_UNIX path too long) in its log."""
    f = tmp_path / "c.toml"
    f.write_text('source = "s3://bucket"\n')
    ok = "/" + "c" * (107 - len("/control.sock") - 1)
    assert load_config(str(f), environ={}, overrides=dict(mountpoint="/m", cache_dir=ok)).cache_dir == ok
    with pytest.raises(ConfigError) as e:
        load_config(str(f), environ={}, overrides=dict(mountpoint="/m", cache_dir=ok + "c"))
    assert "is too long: the control socket in it would be a path of 108 bytes, and a Unix socket's is at most 107" in str(e.value)
    assert "\n" not in str(e.value)


def test_cold_compression_is_auto_by_default() -> None:
    cfg = load_config(None, environ={}, overrides=BASE)
    assert (cfg.cold_compression, cfg.cold_compression_threshold) == ("auto", 0.03)


def test_fuse_workers_auto_or_a_count(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("fuse_workers = 4\n")
    assert load_config(str(f), environ={}, overrides=BASE).fuse_workers == "4"
    assert load_config(None, environ={}, overrides=BASE).fuse_workers == "auto"
