"""The lease in the bucket (gateway/lifecycle/lease.py) against a real S3 server: conditional writes
make two holders impossible, even when many contenders race for a free or an expired lease."""

from __future__ import annotations

import json
import threading
import time

import pytest

from ckptfs.config import Config
from ckptfs.lifecycle.lease import Lease
from ckptfs.store import Store


@pytest.fixture
def store(s3, bucket, monkeypatch) -> Store:  # type: ignore[no-untyped-def]
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return Store(Config(bucket=bucket, endpoint_url=s3.endpoint_url))


class Clock:
    """A wall clock the test moves forward (expiry is judged on it); the monotonic clock moves with it."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def lease(store: Store, pid: int, clock: Clock, ttl: float = 30.0) -> Lease:
    return Lease(store, "ckpt/.ckptfs/leases/retention.json", "retention", ttl, node="node", pid=pid, clock=clock, monotonic=clock)


def test_one_holder_renewal_release_and_takeover_after_expiry(store: Store) -> None:
    clock = Clock()
    a, b = lease(store, 1, clock), lease(store, 2, clock)
    assert a.acquire() and a.valid()
    assert not b.acquire() and not b.valid()
    doc = json.loads(store.get_bytes(a.key)[0])
    assert (doc["name"], doc["holder"]["pid"], doc["expires_at"] - doc["renewed_at"]) == ("retention", 1, 30.0)
    assert b.holder() is not None and b.holder().pid == 1  # type: ignore[union-attr]

    clock.now += 20  # renewal pushes the expiry on
    assert a.acquire()
    clock.now += 20
    assert not b.acquire() and a.valid()
    # the holder stops renewing (a crashed node): after the ttl another node takes it over
    clock.now += 31
    assert not a.valid()  # the old holder knows by its own clock before anyone can take it
    assert b.acquire() and b.takes_total == 1
    assert not a.acquire(), "its renewal must fail: its ETag is no longer the object's"
    assert not a.valid()
    # release: free for the next at once
    b.release()
    assert b.holder() is None and not b.valid()
    assert a.acquire() and a.holder().pid == 1  # type: ignore[union-attr]


def test_racing_contenders_never_both_hold_it(store: Store) -> None:
    """Eight contenders race for a free lease, then for the expired one: each round exactly one wins."""
    clock = Clock()
    contenders = [lease(store, pid, clock) for pid in range(8)]
    for round_ in range(3):
        start = threading.Barrier(len(contenders))
        won: list[int] = []

        def run(c: Lease) -> None:
            start.wait()
            if c.acquire():
                won.append(c.pid)

        threads = [threading.Thread(target=run, args=(c,)) for c in contenders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, f"round {round_}: {won} all think they hold the lease"
        holder = contenders[0].holder()
        assert holder is not None and holder.pid == won[0]
        clock.now += 31  # the winner never renews: expired for the next round
