"""Part size and parts in flight of a replica copy for files past S3's 10,000 parts (lifecycle/copier.py):
the part grows as the drain's does, a larger part holds more of the target's slots (fewer in flight, same
memory bound), and the part buffers follow the sizes without passing the bound."""

from __future__ import annotations

import pytest
import trio

from ckptfs import sizes
from ckptfs.sizes import GiB, MiB, TiB, part_size_for
from ckptfs.lifecycle.copier import PartBuffers, Slots, part_slots

UNIT, SLOTS = 16 * MiB, 8  # the defaults: replication_part_size, replication_parts_in_flight: 128 MiB of buffers


@pytest.mark.parametrize(("size", "part", "slots", "in_flight"), [
    (100 * GiB, 16 * MiB, 1, 8),        # within 10,000 parts: as configured
    (200 * GiB, 21 * MiB, 2, 4),        # 20.48 MiB needed, whole MiB: 4 x 21 MiB in flight = 84 MiB
    (1 * TiB, 105 * MiB, 7, 1),         # one part of 105 MiB at a time
    (5 * TiB, 525 * MiB, 8, 1),         # S3's largest object: one part alone is above 128 MiB, copied alone
])
def test_a_larger_part_holds_more_slots_so_fewer_are_in_flight_within_the_bound(size: int, part: int, slots: int, in_flight: int) -> None:
    assert part_size_for(size, UNIT) == part and -(-size // part) <= 10_000
    assert part_slots(part, UNIT, SLOTS) == slots
    assert SLOTS // part_slots(part, UNIT, SLOTS) == in_flight >= 1  # parts of one file in flight at once
    assert in_flight * part <= UNIT * SLOTS or in_flight == 1


def test_the_part_limit_is_read_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    assert part_size_for(16 * MiB + 5, 5 * MiB) == 5 * MiB
    monkeypatch.setattr(sizes, "S3_MAX_PARTS", 3)
    assert part_size_for(16 * MiB + 5, 5 * MiB) == 6 * MiB


def test_part_buffers_are_reused_by_size_and_make_room_within_the_bound() -> None:
    bufs = PartBuffers(16 * MiB, 8)  # 128 MiB
    small = [bufs.take() for _ in range(8)]
    with pytest.raises(RuntimeError, match="without its slots"):
        bufs.take()  # a ninth part: it did not hold a slot
    for b in small:
        bufs.give(b)
    assert (bufs.held, bufs.held_bytes, bufs.peak_bytes) == (8, 128 * MiB, 128 * MiB)
    # a file of 21 MiB parts (2 slots each, 4 in flight): free 16 MiB buffers are dropped to make room, never more than 128 MiB
    big = [bufs.take(21 * MiB) for _ in range(4)]
    assert all(len(b) == 21 * MiB for b in big) and bufs.held_bytes <= 128 * MiB and bufs.peak_bytes == 128 * MiB
    assert len(bufs.free) == 2 and all(len(b) == 16 * MiB for b in bufs.free)
    again = bufs.free[-1]
    assert bufs.take() is again  # a free buffer of the size wanted is reused, not mapped anew
    bufs.give(again)
    for b in big:
        bufs.give(b)
    assert bufs.take(21 * MiB) is big[-1]
    bufs.give(big[-1])
    bufs.release()
    assert (bufs.held, bufs.held_bytes, bufs.in_use) == (0, 0, 0)


def test_one_part_above_the_whole_bound_is_allowed_alone_and_a_lost_buffer_is_never_reused() -> None:
    bufs = PartBuffers(16 * MiB, 8)
    huge = bufs.take(525 * MiB)  # all slots held: the only part in flight
    assert len(huge) == 525 * MiB and bufs.peak_bytes == 525 * MiB
    bufs.lose(huge)  # its request was cancelled while its thread still ran
    assert (bufs.in_use, bufs.in_use_bytes, bufs.free) == (0, 0, [])
    other = bufs.take(525 * MiB)
    assert other is not huge
    with pytest.raises(RuntimeError):
        bufs.take()  # nothing else while it is in use


def test_slots_taken_together_never_deadlock_and_never_pass_the_total() -> None:
    slots = Slots(3)
    held = {"now": 0, "most": 0, "done": 0}

    async def part(weight: int) -> None:
        await slots.acquire(weight)
        try:
            held["now"] += weight
            held["most"] = max(held["most"], held["now"])
            await trio.sleep(0.001)
            held["now"] -= weight
        finally:
            slots.release(weight)
        held["done"] += 1

    async def main() -> None:
        with trio.fail_after(30):  # two 2-slot parts each holding one of 3 slots would hang: this fails instead
            async with trio.open_nursery() as nursery:
                for i in range(60):
                    nursery.start_soon(part, (2, 1, 3)[i % 3])
        # a wait for slots that is cancelled gives back the ones it had
        await slots.acquire(2)
        with trio.move_on_after(0.05):
            await slots.acquire(3)
        slots.release(2)
        assert slots.free == 3

    trio.run(main)
    assert held["done"] == 60 and held["most"] <= 3
