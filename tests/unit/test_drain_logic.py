from __future__ import annotations

import os
import zlib
import base64
from pathlib import Path

import xxhash

from ckptfs.config import MiB
from ckptfs.drain import Backoff, part_size_for
from ckptfs.upload import file_digests


def test_part_size_grows_past_ten_thousand_parts() -> None:
    assert part_size_for(100 * MiB, 16 * MiB) == 16 * MiB
    big = 10_000 * 16 * MiB + 1
    ps = part_size_for(big, 16 * MiB)
    assert ps > 16 * MiB and ps % MiB == 0 and -(-big // ps) <= 10_000


def test_file_digests_match_whole_and_parts(tmp_path: Path) -> None:
    data = os.urandom(11 * MiB + 3)
    f = tmp_path / "f"
    f.write_bytes(data)
    fd = os.open(f, os.O_RDONLY)
    try:
        whole, crcs = file_digests(fd, len(data), 5 * MiB, chunk=MiB)
    finally:
        os.close(fd)
    assert whole == xxhash.xxh3_128_hexdigest(data)
    parts = [data[i:i + 5 * MiB] for i in range(0, len(data), 5 * MiB)]
    assert crcs == [base64.b64encode(zlib.crc32(p).to_bytes(4, "big")).decode() for p in parts]


def test_empty_file_digest(tmp_path: Path) -> None:
    f = tmp_path / "e"
    f.write_bytes(b"")
    fd = os.open(f, os.O_RDONLY)
    try:
        whole, crcs = file_digests(fd, 0, 5 * MiB)
    finally:
        os.close(fd)
    assert whole == xxhash.xxh3_128_hexdigest(b"") and len(crcs) == 1


def test_backoff_grows_and_is_capped() -> None:
    b = Backoff()
    delays = [b.fail(cap=8.0) for _ in range(12)]
    assert all(0 < d <= 8.0 for d in delays)
    assert max(delays[-3:]) > delays[0]
