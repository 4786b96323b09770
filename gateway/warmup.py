"""`ckptfs warmup`: stage files (or whole trees) from the bucket into the cache before they are read.

Beside the filesystem, over the listings (`remote`) and the fetcher, which do not know each other: it
resolves the paths, lists trees whole, and fetches at most two files at a time, reporting progress by
bytes so the command can show one bar.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import trio

from .fetch import Fetcher
from .journal import Journal
from .remote import Remote


async def warm_up(journal: Journal, remote: Remote, fetcher: Fetcher, paths: list[str],
                  progress: Callable[[dict[str, Any]], Awaitable[None]]) -> list[tuple[str, str]]:
    """Read files (or whole trees) from the bucket into the cache; returns (path, error) of those that failed."""
    files: dict[int, tuple[str, int]] = {}
    failed: list[tuple[str, str]] = []
    for path in paths:
        ino = await remote.resolve(path)
        row = journal.get(ino) if ino is not None else None
        if row is None:
            failed.append((path or "/", "no such file or directory in the mount"))
            continue
        if row.is_dir:
            await remote.refresh_tree(ino)  # type: ignore[arg-type]
            for r in journal.descendants(row.ino):
                if r.kind == "file":
                    files[r.ino] = (journal.path_of(r.ino) or "?", r.size)
        else:
            files[row.ino] = (path, row.size)
    total = sum(size for _, size in files.values())
    done = 0

    async def one(ino: int, path: str, size: int) -> None:
        nonlocal done
        try:
            await fetcher.ensure_local(ino)
        except OSError as e:
            failed.append((path, e.strerror or str(e)))
        done += size

    limit = trio.CapacityLimiter(2)

    async def limited(ino: int, path: str, size: int) -> None:
        async with limit:
            await one(ino, path, size)

    async with trio.open_nursery() as nursery:
        for ino, (path, size) in files.items():
            nursery.start_soon(limited, ino, path, size)
        while True:
            in_flight = sum(dl.bytes_done() for dl in fetcher.downloads.values() if dl.ino in files)
            await progress({"files": len(files), "bytes": total, "done_bytes": min(total, done + in_flight)})
            if not nursery.child_tasks:
                break
            with trio.move_on_after(0.2):
                await trio.sleep_forever()
    return failed
