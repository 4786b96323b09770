"""Sizes and the limits S3 puts on them: what the config, the drain, the copier, the namespace and the CLI all use.

A leaf module (it imports nothing of ckptfs), so that a layer needing a size or a limit does not
import the whole configuration for it.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

S3_MIN_PART_SIZE = 5 * MiB
S3_MAX_PART_SIZE = 5 * GiB
S3_MAX_PARTS = 10_000
S3_MAX_KEY_BYTES = 1024


def part_size_for(size: int, configured: int) -> int:
    """The configured part size, raised (in whole MiB) if a file of `size` bytes would need more than S3_MAX_PARTS parts.

    Used by every multipart upload and copy (drain, replication, cold-tier moves). S3_MAX_PARTS is read when called,
    so a test can lower it to drive a file past the limit without writing 10,000 parts' worth of bytes."""
    need = -(-size // S3_MAX_PARTS)
    if need <= configured:
        return configured
    return -(-need // MiB) * MiB


SMALL_OBJECTS_PER_PART = 4  # files below multipart_threshold (one PutObject each) in flight per part slot


def small_objects_in_flight(max_parts_in_flight: int) -> int:
    """PutObjects of whole small files at once: a small request waits on the store's latency, not on the bandwidth,
    so it takes more of them than parts to keep the store busy (the drain's limit, and the store's connection pool)."""
    return SMALL_OBJECTS_PER_PART * max_parts_in_flight


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover
