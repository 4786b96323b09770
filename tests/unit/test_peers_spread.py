"""The load bound (gateway/peers/spread.py) as the listener applies it, and what it does to the spread of replicas
over unequal failure domains (bench/peers_spread.py: every owner goes down its own rendezvous order, each holder
answering by `spread.redirect`): the issue's target, the most any node holds <= 2 x the mean, where the domains can
hold it; and where they cannot (one small rack facing a large one), no owner is left without a holder."""

from __future__ import annotations

import pytest

from bench.peers_spread import assign, spread
from ckptfs.peers.spread import owner_cap, redirect


def test_a_node_takes_its_share_of_owners_then_sends_new_ones_on() -> None:
    assert owner_cap(1) == 2 and owner_cap(2) == 4
    assert redirect("c", ["a"], [], 1, insist=False, understood=True) is None
    why = redirect("c", ["a", "b"], [], 1, insist=False, understood=True)
    assert why is not None and "next candidate" in why and "at most 2" in why
    assert redirect("c", ["a", "b", "c"], [], 1, insist=False, understood=True) is not None  # itself not counted
    assert redirect("a", ["a", "b"], [], 1, insist=False, understood=True) is None
    assert redirect("c", ["a", "b"], [], 1, insist=True, understood=True) is None  # nobody else would take it
    assert redirect("c", ["a", "b"], ["c"], 1, insist=False, understood=True) is None  # its replicas are here
    assert redirect("c", ["a", "b"], [], 1, insist=False, understood=False) is None  # an earlier release's owner


@pytest.mark.parametrize("racks,replicas", [([10, 10, 2], 1), ([10, 10, 2], 2), ([10, 10, 10], 1), ([100, 100, 20], 1)])
def test_bounded_the_most_any_node_holds_is_at_most_twice_the_mean(racks: list[int], replicas: int) -> None:
    alone = spread(racks, replicas, seeds=5, bounded=False)
    bounded = spread(racks, replicas, seeds=5, bounded=True)
    assert bounded["max_over_mean_worst"] <= 2.0
    if racks != [10, 10, 2] or replicas == 1:
        assert alone["max_over_mean_worst"] > 2.0  # what rendezvous alone gives: the bound is what makes it hold


def test_where_the_domains_cannot_hold_the_share_every_owner_still_has_its_holders() -> None:
    taken = assign([20, 2], 1, seed=0, bounded=True)
    owners = [o for holders in taken.values() for o in holders]
    assert len(owners) == 22 and len(set(owners)) == 22  # each owner once: insisting, never without a copy
