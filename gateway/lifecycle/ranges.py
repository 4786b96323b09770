"""Reading an object back in parallel ranges, in order: what verify, drills and the cold tier's codec do.

At most `concurrency` ranges of `range_size` are in flight (`read_concurrency` and `read_range_size`
for verify and drills; so memory is bounded),
each pinned to the object's ETag; the caller's `consume` sees them in order, so a hash can
follow. Ranges fail together (the object changed or vanished): the first StoreError is raised
alone, for the caller to classify.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, TypeVar

import trio

from ..objects import CHANGED, NO_OBJECT, StoreError
from ..storeapi import LifecycleStore
from .manifest import first_store_error

T = TypeVar("T")


async def in_order(io: Callable[..., Awaitable[Any]], store: LifecycleStore, key: str, etag: str, size: int,
                   fetch: Callable[[int, int], Awaitable[T]], consume: Callable[[int, int, T], Awaitable[None]],
                   range_size: int, concurrency: int) -> None:
    """fetch(start, length) every range of the object, consume(start, length, result) them in order."""
    if size == 0:
        await io(store.get_range, key, etag, 0, 0)  # the object is still there, with that ETag
        return
    rs = range_size
    n = -(-size // rs)
    slots = trio.Semaphore(concurrency)
    results: dict[int, T] = {}
    events = [trio.Event() for _ in range(n)]

    async def one(i: int) -> None:
        results[i] = await fetch(i * rs, min(rs, size - i * rs))
        events[i].set()

    try:
        async with trio.open_nursery() as nursery:

            async def producer() -> None:
                for i in range(n):
                    await slots.acquire()
                    nursery.start_soon(one, i)

            nursery.start_soon(producer)
            for i in range(n):
                await events[i].wait()
                await consume(i * rs, min(rs, size - i * rs), results.pop(i))
                slots.release()
    except BaseExceptionGroup as group:
        err = first_store_error(group)
        if err is None:
            raise
        raise err from None


def sort_read_error(e: StoreError, path: str, missing: list[str], changed: list[str]) -> None:
    """A file that could not be read back is missing or changed (what verify and drills report); anything else goes on."""
    if e.kind == NO_OBJECT:
        missing.append(path)
    elif e.kind == CHANGED:
        changed.append(path)
    else:
        raise e
