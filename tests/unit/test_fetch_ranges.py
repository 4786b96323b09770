"""Where a download's ranges fall, and which ranges a read waits for."""

from __future__ import annotations

import trio

from ckptfs.fetch import Download

MiB = 1 << 20


def test_ranges_double_up_to_the_largest_and_cover_the_file_once() -> None:
    dl = Download(1, "k", "e", 200 * MiB + 5, 8 * MiB, 64 * MiB)
    lengths = [dl.span(i)[1] for i in range(dl.count)]
    assert lengths == [8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB, 64 * MiB, 16 * MiB + 5]
    assert [dl.span(i)[0] for i in range(dl.count)] == dl.starts
    assert sum(lengths) == dl.size


def test_small_and_empty_files() -> None:
    assert Download(1, "k", "e", 0, 8 * MiB, 64 * MiB).count == 0
    small = Download(1, "k", "e", 100, 8 * MiB, 64 * MiB)
    assert small.count == 1 and small.span(0) == (0, 100)
    fixed = Download(1, "k", "e", 3 * MiB, MiB, MiB)
    assert [fixed.span(i) for i in range(fixed.count)] == [(0, MiB), (MiB, MiB), (2 * MiB, MiB)]


def test_a_read_waits_only_for_the_ranges_it_covers() -> None:
    dl = Download(1, "k", "e", 100 * MiB, 8 * MiB, 64 * MiB)  # ranges: [0,8) [8,24) [24,56) [56,100)

    async def main() -> None:
        # bytes 7 MiB .. 9 MiB straddle the first two ranges: the read asks for both, first
        with trio.move_on_after(0) as scope:
            await dl.wait(7 * MiB, 2 * MiB)
        assert scope.cancelled_caught
        assert sorted(dl.wanted) == [0] and set(dl.waiters) == {0}
        dl.started[0] = True
        dl._range_done(0)
        with trio.move_on_after(0):
            await dl.wait(7 * MiB, 2 * MiB)
        assert 1 in dl.wanted and 1 in dl.waiters and 2 not in dl.waiters
        dl.started[1] = True
        dl._range_done(1)
        await dl.wait(7 * MiB, 2 * MiB)  # both ranges done: returns at once
        assert dl._take() == 2  # the read-ahead goes on in order

    trio.run(main)
