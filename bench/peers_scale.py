"""Membership at the size of the jobs that need it (issue 44): the real node-record code for N virtual nodes in one
process, on a model of S3 with its limits, on a simulated clock.

    python -m bench.peers_scale --nodes 1000 --minutes 10 [--ttl 30] [--membership bucket|etcd] [--json out.json]

Why a simulator: what grows with the cluster is requests to the bucket, and a thousand daemons do not fit on one
machine. Each virtual node runs gateway/peers/membership.py's own `Membership` (announce, renew, read the others,
list its holders, claim the dead): only the store under it and the clock are models.

* The store: the node records in a dict, S3's answers to conditional writes (412 on a stale If-Match, 404 on a
  missing key), LIST in pages of 1,000, latency drawn per request (20-60 ms), S3's request limits per prefix (3,500
  PUT/DELETE and 5,500 GET/HEAD/LIST per second: 503 SlowDown above them), and 1% of requests failing at random.
* `--membership etcd`: the same code on a model of etcd as store/etcd.py uses it (transactions for the
  conditional writes, the LIST answered from the watched copy without a request, 1-5 ms a request).
* The clock: trio's MockClock jumping whenever every task waits, so an hour runs in minutes. The store's calls,
  which the daemon makes in worker threads, run inline after their latency (`threads.call` replaced).
* Faults: after a warm-up, 1% of the nodes die (their loops stop, their records stay) and 10% are paused for
  2 x ttl (their loops stop, then start again from where they were: a GC pause, a frozen VM).
* Who claims whom: each node holds the replicas of the owners whose first rendezvous choice it is (records.py;
  among 64 candidates, to keep the set-up linear), and its takeover loop claims a dead owner it holds every ttl/3,
  as the daemon's does.

It reports requests per second by kind and per node per ttl/3, the monthly bill at S3's list prices, throttled and
failed requests, and for the dead and the paused: how long after the death the claim came, and false takeovers
(a node claimed while its daemon ran and renewed: must be 0).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import trio
import trio.testing

from ckptfs import threads
from ckptfs.config import load_config
from ckptfs.objects import NO_OBJECT, PRECONDITION, SERVER, Listing, ObjectInfo, RemoteObject, StoreError
from ckptfs.peers.membership import Membership, takers_of
from ckptfs.peers.records import LIVE, rendezvous

PUT_LIMIT, READ_LIMIT = 3500, 5500  # requests per second per prefix (S3's documented baseline)
PRICE_PER_1000 = {"put": 0.005, "list": 0.005, "delete": 0.0, "get": 0.0004}  # S3 Standard, us-east-1
SECONDS_PER_MONTH = 30 * 24 * 3600
EPOCH = 1_800_000_000.0  # the simulated wall clock starts here


@dataclass
class S3Model:
    """The bucket as membership uses it."""

    rng: random.Random
    failure_rate: float = 0.01
    objects: dict[str, tuple[bytes, str, float]] = field(default_factory=dict)  # key -> (body, etag, LastModified)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    throttled: collections.Counter[str] = field(default_factory=collections.Counter)
    failed: int = 0
    _second: int = -1
    _this_second: collections.Counter[str] = field(default_factory=collections.Counter)
    serial: int = 0

    slow_down = "SlowDown: please reduce your request rate"
    injected = "InternalError (injected)"

    def _limit(self, kind: str) -> tuple[str, int] | None:
        """(the class of requests `kind` counts against, its limit per second); None: not a request."""
        return ("write", PUT_LIMIT) if kind in ("put", "delete") else ("read", READ_LIMIT)

    def _enter(self, kind: str) -> None:
        limit = self._limit(kind)
        if limit is None:
            return
        now = int(trio.current_time())
        if now != self._second:
            self._second, self._this_second = now, collections.Counter()
        self._this_second[limit[0]] += 1
        if self._this_second[limit[0]] > limit[1]:
            self.throttled[kind] += 1
            raise StoreError(SERVER, self.slow_down)
        self.counts[kind] += 1
        if self.rng.random() < self.failure_rate:
            self.failed += 1
            raise StoreError(SERVER, self.injected)

    def _etag(self) -> str:
        self.serial += 1
        return f"{self.serial:032x}"

    def list(self, prefix: str, recursive: bool = False, on_page: Callable[[], None] | None = None) -> Listing:
        keys = sorted(k for k in self.objects if k.startswith(prefix))
        out = []
        for start in range(0, max(1, len(keys)), 1000):
            self._enter("list")
            for k in keys[start:start + 1000]:
                body, etag, modified = self.objects[k]
                out.append(RemoteObject(k[len(prefix):], len(body), etag, modified))
            if on_page is not None:
                on_page()
        return Listing([], out, False)

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        self._enter("get")
        if key not in self.objects:
            raise StoreError(NO_OBJECT, f"{key} does not exist")
        body, etag, _ = self.objects[key]
        return body, etag

    def head_object(self, key: str) -> ObjectInfo:
        self._enter("get")
        if key not in self.objects:
            raise StoreError(NO_OBJECT, f"{key} does not exist")
        body, etag, modified = self.objects[key]
        return ObjectInfo(len(body), etag, None, {}, modified)

    def put_bytes(self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None,
                  **_: Any) -> str:
        self._enter("put")
        cur = self.objects.get(key)
        if if_none_match and cur is not None or if_match is not None and cur is not None and cur[1] != if_match:
            raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile")
        if if_match is not None and cur is None:
            raise StoreError(NO_OBJECT, f"{key} does not exist")
        etag = self._etag()
        self.objects[key] = (body, etag, EPOCH + trio.current_time())
        return etag

    def delete_if_match(self, key: str, etag: str) -> None:
        self._enter("delete")
        cur = self.objects.get(key)
        if cur is None:
            raise StoreError(NO_OBJECT, f"{key} does not exist")
        if cur[1] != etag:
            raise StoreError(PRECONDITION, f"{key} was written by someone else meanwhile")
        del self.objects[key]


@dataclass
class EtcdModel(S3Model):
    """etcd as store/etcd.py uses it: the same conditional writes (transactions on revisions), a LIST answered from
    the watched copy of the prefix (no request: one process, one copy, the watch taken as instant), writes and
    ranges at etcd's pace (1-5 ms; its own benchmark takes ~44,000 writes a second: 503-like errors above it)."""

    write_limit: int = 40_000
    slow_down = "etcdserver: too many requests"
    injected = "etcdserver: request timed out (injected)"

    def _limit(self, kind: str) -> tuple[str, int] | None:
        return None if kind == "list" else ("all", self.write_limit)  # a LIST: the watch's copy, no request


@dataclass
class VirtualNode:
    m: Membership
    scope: trio.CancelScope | None = None
    running: bool = False
    died_at: float | None = None
    paused: tuple[float, float] | None = None  # (from, until)
    claimed_at: float | None = None  # when another node's claim of it succeeded
    claimed_while_running: bool = False


class Simulation:
    def __init__(self, nodes: int, ttl: float, seed: int, failure_rate: float, read_all: bool = False,
                 membership: str = "bucket") -> None:
        self.read_all = read_all  # every changed record read in full (the refresh before issue 44): the comparison
        self.rng = random.Random(seed)
        self.membership = membership
        self.store = (EtcdModel if membership == "etcd" else S3Model)(self.rng, failure_rate)
        self.latency = (0.001, 0.005) if membership == "etcd" else (0.02, 0.06)
        self.ttl = ttl
        self.cfg = load_config(environ={}, overrides=dict(bucket="ckpt", prefix="p", mountpoint="/m", cache_dir="/tmp",
                                                          peer_lease_ttl=ttl))
        self.names = [f"node{i:05d}" for i in range(nodes)]
        self.nodes: dict[str, VirtualNode] = {}
        self.holder_of = {}  # owner -> its first rendezvous choice (who holds its replicas)
        for n in self.names:
            self.nodes[n] = VirtualNode(Membership(self.cfg, self.store, lambda p: f"p/{p}", n, f"{n}-1",  # type: ignore[arg-type]
                                                   f"10.0.{int(n[4:]) // 250}.{int(n[4:]) % 250}:7470",
                                                   clock=lambda: EPOCH + trio.current_time(), monotonic=trio.current_time))
        sample = self.names if nodes <= 2000 else self.rng.sample(self.names, 2000)
        for n in self.names:
            others = [o for o in sample if o != n][:64] or [o for o in self.names if o != n]
            self.holder_of[n] = rendezvous(n, others)[0]
        self.held: dict[str, set[str]] = collections.defaultdict(set)
        for owner, holder in self.holder_of.items():
            self.held[holder].add(owner)

    async def _latency(self, fn: Callable[[], Any], limiter: Any = None) -> Any:
        await trio.sleep(self.rng.uniform(*self.latency))
        return fn()

    async def _node(self, vn: VirtualNode) -> None:
        m = vn.m
        held = self.held[m.me]
        m.interest = lambda: takers_of(m, sorted(held))
        m.confirming = lambda: held
        if self.read_all:
            m.interest = lambda: None
        with trio.CancelScope() as scope:
            vn.scope, vn.running = scope, True
            async with trio.open_nursery() as nursery:
                await nursery.start(m.run)
                m.listing.ask([self.holder_of[m.me]])
                while True:  # the takeover loop's claims (and the reconcile's rejoin of a node taken over while away)
                    await trio.sleep(self.ttl / 3)
                    if m.fenced:
                        try:
                            if await m.takeover_settled():
                                await m.rejoin()
                        except StoreError:
                            pass
                        continue
                    for owner in sorted(set(m.dead()) & held):
                        try:
                            won = await m.claim(owner)
                        except StoreError:
                            continue
                        if won:
                            target = self.nodes[owner]
                            target.claimed_at = trio.current_time()
                            target.claimed_while_running = target.running
                            try:
                                await m.mark_takeover_done(owner)
                            except StoreError:
                                pass
        vn.running = False

    async def run(self, minutes: float, warmup: float) -> dict[str, Any]:
        threads_call = threads.call
        threads.call = self._latency  # type: ignore[assignment]
        started = time.monotonic()
        try:
            async with trio.open_nursery() as nursery:
                for i, vn in enumerate(self.nodes.values()):
                    nursery.start_soon(self._node, vn)
                    if i % 50 == 49:
                        await trio.sleep(self.ttl / 3 / max(1, len(self.nodes) / 50))  # a rolling start
                await trio.sleep(warmup)
                base = dict(self.store.counts)
                t0 = trio.current_time()
                dying = self.rng.sample(self.names, max(1, len(self.names) // 100))
                pausing = self.rng.sample([n for n in self.names if n not in dying], max(1, len(self.names) // 10))
                for n in dying:
                    vn = self.nodes[n]
                    vn.died_at = trio.current_time()
                    assert vn.scope is not None
                    vn.scope.cancel()
                for n in pausing:
                    vn = self.nodes[n]
                    vn.paused = (trio.current_time(), trio.current_time() + 2 * self.ttl)
                    assert vn.scope is not None
                    vn.scope.cancel()
                await trio.sleep(2 * self.ttl)
                for n in pausing:
                    nursery.start_soon(self._node, self.nodes[n])  # resumed: its loops go on from its state
                await trio.sleep(max(0.0, minutes * 60 - 2 * self.ttl))
                elapsed = trio.current_time() - t0
                nursery.cancel_scope.cancel()
        finally:
            threads.call = threads_call  # type: ignore[assignment]
        done = {k: self.store.counts[k] - base.get(k, 0) for k in ("put", "list", "get", "delete")}
        per_second = {k: v / elapsed for k, v in done.items()}
        periods = elapsed / (self.ttl / 3)
        delays = [vn.claimed_at - vn.died_at for vn in self.nodes.values() if vn.died_at is not None and vn.claimed_at is not None]
        false = [n for n, vn in self.nodes.items() if vn.claimed_at is not None and vn.died_at is None and vn.paused is None]
        bill = 0.0 if self.membership == "etcd" else round(sum(per_second[k] * SECONDS_PER_MONTH / 1000 * PRICE_PER_1000[k] for k in done), 0)
        return {
            "membership": self.membership, "bucket_requests_for_liveness": 0 if self.membership == "etcd" else sum(done.values()),
            "nodes": len(self.names), "ttl_seconds": self.ttl, "read_all": self.read_all, "simulated_seconds": round(elapsed, 1),
            "wall_seconds": round(time.monotonic() - started, 1),
            "requests_per_second": {k: round(v, 1) for k, v in per_second.items()},
            "requests_per_node_per_third_ttl": round(sum(done.values()) / len(self.names) / periods, 2),
            "monthly_bill_usd": bill,
            "throttled": dict(self.store.throttled), "failed_at_random": self.store.failed,
            "dead": len([vn for vn in self.nodes.values() if vn.died_at is not None]),
            "dead_claimed": len(delays),
            "death_to_claim_seconds": {"max": round(max(delays), 1), "median": round(statistics.median(delays), 1)} if delays else None,
            "paused_claimed": len([vn for vn in self.nodes.values() if vn.paused is not None and vn.claimed_at is not None]),
            "paused": len([vn for vn in self.nodes.values() if vn.paused is not None]),
            "false_takeovers": len(false),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers_scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=10.0, help="simulated minutes after the warm-up")
    ap.add_argument("--ttl", type=float, default=30.0, help="peer_lease_ttl")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--failure-rate", type=float, default=0.01)
    ap.add_argument("--read-all", action="store_true", help="read every changed record in full (the refresh before issue 44)")
    ap.add_argument("--membership", choices=("bucket", "etcd"), default="bucket",
                    help="peer_membership: the bucket (S3's limits) or etcd (a watch instead of the LIST)")
    ap.add_argument("--json", help="write the report here too")
    a = ap.parse_args(argv)
    logging.getLogger("ckptfs").setLevel(logging.CRITICAL)  # a thousand nodes' warnings about injected failures
    sim = Simulation(a.nodes, a.ttl, a.seed, a.failure_rate, a.read_all, a.membership)
    report = trio.run(sim.run, a.minutes, 2 * a.ttl, clock=trio.testing.MockClock(autojump_threshold=0))
    print(json.dumps(report, indent=1, sort_keys=True))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    return 0 if report["false_takeovers"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
