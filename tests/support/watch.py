"""A thread that lists a bucket over and over and remembers every key it ever saw.

For the tests and the benchmark of temporary directories and the trainers (issue 24): a key that was in the bucket
for a moment between two of our checks is still caught. Test support code: a plain thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class BucketWatcher:
    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.seen: set[str] = set()
        self.listings = 0  # complete listings so far
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                self.seen.update(o["Key"] for o in page.get("Contents", []))
            self.listings += 1
            time.sleep(0.02)

    def listed_once_more(self, timeout: float = 300.0) -> None:
        """Return once a listing that started after this call has ended."""
        target = self.listings + 2
        deadline = time.monotonic() + timeout
        while self.listings < target:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise AssertionError("the bucket was not listed again")
            time.sleep(0.02)

    def __enter__(self) -> "BucketWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
