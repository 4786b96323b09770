"""One checkpoint writer, run as its own process (`python -m bench.writer PATH SIZE CHUNK`).

Why a process per writer: a sharded checkpoint is written by one process per
rank, and separate processes keep the writers from sharing one GIL. The
writer prints `ready` once its buffer is allocated, waits for a line on stdin
(so all writers start together and interpreter start-up is not timed), then
writes, fsyncs and closes, and prints its CLOCK_MONOTONIC timestamps as JSON
(CLOCK_MONOTONIC is system-wide on Linux, so the parent can compare them).

The data is one random buffer reused for every write, with the offset
stamped into its first 8 bytes so no two chunks are alike.
"""

from __future__ import annotations

import json
import os
import sys
import time


def chunk_buffer(size: int, chunk: int) -> bytearray:
    return bytearray(os.urandom(min(chunk, max(size, 1))))


def write_stamped(fd: int, size: int, buf: bytearray) -> None:
    """`size` bytes of `buf` over and over, each chunk's offset stamped into its first 8 bytes."""
    view = memoryview(buf)
    offset = 0
    while offset < size:
        n = min(len(buf), size - offset)
        buf[:8] = offset.to_bytes(8, "little")
        done = 0
        while done < n:
            done += os.write(fd, view[done:n])
        offset += n


def write_file(path: str, size: int, chunk: int) -> dict[str, float]:
    buf = chunk_buffer(size, chunk)
    started = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_stamped(fd, size, buf)
        written = time.monotonic()
        os.fsync(fd)
        fsynced = time.monotonic()
    finally:
        os.close(fd)
    closed = time.monotonic()
    return {"started": started, "written": written, "fsynced": fsynced, "closed": closed}


def main(argv: list[str]) -> int:
    path, size, chunk = argv[0], int(argv[1]), int(argv[2])
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 1
    try:
        result: dict[str, object] = dict(write_file(path, size, chunk))
    except OSError as e:
        result = {"error": f"{path}: {e}"}
    print(json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
