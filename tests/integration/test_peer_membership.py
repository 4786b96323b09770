"""Node records against a real S3 server (SeaweedFS): the conditional writes membership rests on.

Of many nodes claiming one dead node at the same instant exactly one wins, in every round; a node whose record
was claimed finds itself fenced at its next renewal; a record deleted by hand is written again. The clocks are
the test's (a node "dead" is one whose clock moved past the ttl), the store and its ETags are real.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import trio

from ckptfs.config import Config
from ckptfs.peers.membership import Membership
from ckptfs.peers.records import LIVE, TAKEN_OVER
from ckptfs.store import Store

BOUND = 120.0


@pytest.fixture
def store(s3, bucket, monkeypatch) -> Store:  # type: ignore[no-untyped-def]
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return Store(Config(bucket=bucket, endpoint_url=s3.endpoint_url))


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class Together:
    """The store, with the writes of one key held until every claimer has sent one: all of them read the record
    before any writes it, the race a takeover must survive."""

    def __init__(self, store: Store, key: str) -> None:
        self.store, self.key = store, key
        self.barrier: threading.Barrier | None = None

    def put_bytes(self, key: str, body: bytes, **kw: Any) -> str:
        if key == self.key and self.barrier is not None:
            self.barrier.wait()
        return self.store.put_bytes(key, body, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def member(store: Any, name: str, clock: Clock) -> Membership:
    return Membership(Config(bucket="unused"), store, lambda p: f"ckpt/{p}", name, f"{name}-1", "127.0.0.1:7470",
                      clock=clock, monotonic=clock)


def doc(store: Store, name: str) -> dict[str, Any]:
    body, _ = store.get_bytes(f"ckpt/.ckptfs/nodes/{name}.json")
    out: dict[str, Any] = json.loads(body)
    return out


def test_claimers_racing_for_a_dead_node_have_exactly_one_winner(store: Store) -> None:
    claimers = 6
    for round_ in range(3):
        clock = Clock()
        together = Together(store, f"ckpt/.ckptfs/nodes/dead-{round_}.json")
        dead = member(together, f"dead-{round_}", clock)
        others = [member(together, f"r{round_}-n{i}", clock) for i in range(claimers)]

        async def main() -> list[bool]:
            await dead.announce()
            for m in others:
                await m.announce()
            clock.now += dead.ttl + 1
            for m in others:
                await m.renew()
            together.barrier = threading.Barrier(claimers, timeout=BOUND)
            won = [False] * claimers

            async def claim(i: int) -> None:
                won[i] = await others[i].claim(dead.me)

            with trio.fail_after(BOUND):
                async with trio.open_nursery() as nursery:
                    for i in range(claimers):
                        nursery.start_soon(claim, i)
            together.barrier = None
            # the claimed node, back, finds itself fenced at its next renewal and writes nothing over the claim
            await dead.renew()
            assert dead.fenced and dead.must_reconcile
            return won

        won = trio.run(main)
        assert won.count(True) == 1, (round_, won)
        winner = others[won.index(True)]
        d = doc(store, dead.me)
        assert (d["state"], d["taken_over_by"], d["taken_over_by_incarnation"]) == (TAKEN_OVER, winner.me, winner.incarnation)


def test_a_record_deleted_by_hand_is_written_again_at_the_next_renewal(store: Store) -> None:
    clock = Clock()
    a = member(store, "a", clock)

    async def main() -> None:
        await a.announce()
        store.delete("ckpt/.ckptfs/nodes/a.json")
        clock.now += 10
        await a.renew()

    trio.run(main)
    d = doc(store, "a")
    assert (d["state"], d["incarnation"], d["expires_at"]) == (LIVE, "a-1", clock.now + a.ttl)
    assert a.lease_valid() and not a.fenced
