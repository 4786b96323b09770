"""`peer_max_bandwidth`: what replication may take of the node's network, all peers together."""

from __future__ import annotations

import time
from typing import Callable

import trio


class TokenBucket:
    """`peer_max_bandwidth`: bytes per second over all channels (one second of burst; a chunk larger than
    the burst is let through and paid for by waiting after). 0: no cap. A dozen lines, where the rate
    limiters on PyPI are asyncio's or threads'."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.clock = rate, clock
        self.tokens = rate
        self.at = clock()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        while True:
            now = self.clock()
            self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
            self.at = now
            need = min(n, self.rate)
            if self.tokens >= need:
                self.tokens -= n
                return
            await trio.sleep((need - self.tokens) / self.rate)
