"""Node records in etcd (`peer_membership = etcd`): the part of a store that membership uses, over etcd's v3 API.

Why this shape: membership's safety rests on conditional writes with exactly one winner (If-None-Match: *, and
If-Match on the ETag a record was judged by), which etcd gives as transactions comparing a key's create and mod
revisions: a record's ETag here is its mod_revision. So the same Membership code (announce, renew, claim, the
holder list, the prune) runs on either backend, and what was proved of it (tests/unit/test_peers_records_machine.py)
holds on both. What etcd adds is the LIST: a watch on the records' prefix keeps a copy of every record in this
process (`list` answers from it, no request), so a node's steady state costs etcd one write per ttl/3 (its
renewal) and nothing for the others' liveness, whatever the number of nodes; only writes, claims and the reads
of the few records a node needs in full (which must be current: a GET is a range request) reach etcd.

etcd's own leases are not used for liveness: a key bound to one vanishes with it, and a takeover needs the dead
node's record (its incarnation, holders and journal) to claim it. The record's `expires_at`, renewed by a
conditional write every ttl/3, is the lease here as on the bucket; a renewal is one transaction either way.

A watch that silently stopped would leave the copy stale, live nodes seeming silent: every write of ours goes
through here, so `list` checks that the watch delivered our own last write (past `WATCH_LAG` it has not) and that
it delivered anything within a lease (`quiet`: our own renewals come every third of one; each read of the stream is
bounded by it too); otherwise the prefix is read again in one range request and a new watch started (counted, and
logged).

The client: etcd3gw (OpenStack's, maintained), over etcd's JSON gateway (HTTP and JSON, from trio's worker
threads like the S3 client): no gRPC and protobuf stack to pin, and the same endpoints answer curl. Each
endpoint is tried in turn on a connection failure.
"""

from __future__ import annotations

import base64
import collections
import logging
import threading
import time
from typing import Any, Callable

import requests.adapters
from etcd3gw import exceptions as etcd_errors
from etcd3gw.client import Etcd3Client
from etcd3gw.watch import Watcher

from ..objects import NETWORK, NO_OBJECT, PRECONDITION, SERVER, Listing, ObjectInfo, RemoteObject, StoreError
from ..peering import parse_etcd_endpoints

log = logging.getLogger(__name__)

WATCH_LAG = 5.0  # seconds our own write may take to come back through the watch before the copy is read again
KINDS = ("list", "get", "put", "delete", "watch")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _key(kv: dict[str, Any]) -> bytes:
    key = kv["key"]
    return key if isinstance(key, bytes) else base64.b64decode(key)


def _value(kv: dict[str, Any]) -> bytes:
    value = kv.get("value", b"")
    return value if isinstance(value, bytes) else base64.b64decode(value)


class _Bounded(requests.adapters.HTTPAdapter):
    """etcd3gw starts a watch without a timeout: the one given here bounds its connection, and each read of its
    stream by `quiet` (a lease: this node's own renewals come through it every third of one), so an etcd that stops
    answering ends the watch (then read again, `EtcdRecords.list`) instead of hanging a thread on it."""

    def __init__(self, timeout: float, quiet: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.default_timeout, self.quiet = timeout, quiet

    def send(self, request: Any, **kw: Any) -> Any:  # type: ignore[override]
        if kw.get("timeout") is None:
            kw["timeout"] = (self.default_timeout, self.quiet if kw.get("stream") else self.default_timeout)
        return super().send(request, **kw)


class EtcdRecords:
    """list, get_bytes, put_bytes (If-None-Match / If-Match), delete_if_match, head_object over etcd under `prefix`."""

    def __init__(self, endpoints: str, prefix: str, timeout: float = 10.0, quiet: float = 30.0) -> None:
        self.prefix = prefix.encode()
        self.endpoints = parse_etcd_endpoints(endpoints)
        self.quiet = quiet  # seconds the watch may go without an event before the copy is read again (a lease)
        self.clients = [self._client(scheme, host, port, timeout, quiet) for scheme, host, port in self.endpoints]
        self.requests_by_kind: collections.Counter[str] = collections.Counter({k: 0 for k in KINDS})
        self._lock = threading.Lock()
        self._copy: dict[bytes, tuple[bytes, int]] = {}  # key (without our prefix) -> (value, mod_revision)
        self._watcher: Watcher | None = None
        self._watched: bytes | None = None  # the store prefix the copy holds
        self._seen_revision = 0  # the latest revision the copy reflects
        self._written: tuple[int, float] | None = None  # our last write's revision, and when (monotonic)
        self._heard_at = 0.0  # monotonic: the last event of the watch, or its start
        self.resyncs_total = 0

    @staticmethod
    def _client(scheme: str, host: str, port: int, timeout: float, quiet: float) -> Etcd3Client:
        client = Etcd3Client(host=host, port=port, protocol=scheme, timeout=timeout, api_path="/v3/")
        # membership reads 16 records at once, and the watch holds a connection of its own
        client.session.mount(f"{scheme}://", _Bounded(timeout, quiet, pool_maxsize=32))
        return client

    def describe(self) -> str:
        return ",".join(f"{s}://{h}:{p}" for s, h, p in self.endpoints)

    # ------------------------------------------------------------ requests
    def _call(self, kind: str, fn: Callable[[Etcd3Client], Any]) -> Any:
        """`fn` on the first endpoint that answers; StoreError(NETWORK) when none does, (SERVER) on an error answer."""
        with self._lock:
            self.requests_by_kind[kind] += 1
        last: Exception | None = None
        for i, client in enumerate(self.clients):
            try:
                out = fn(client)
            except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError) as e:
                last = e
                continue
            except etcd_errors.Etcd3Exception as e:
                raise StoreError(SERVER, f"etcd at {self.describe()} answered an error: {e.detail_text or e}") from e
            if i:
                self.clients.insert(0, self.clients.pop(i))  # the one that answered first, next time
            return out
        why = getattr(last, "detail_text", None) or str(last) or type(last).__name__
        raise StoreError(NETWORK, f"etcd at {self.describe()} cannot be reached: {why}")

    def _txn(self, kind: str, compare: dict[str, Any], request: dict[str, Any]) -> int:
        """One transaction: `request` if `compare` holds (its revision), else StoreError: PRECONDITION where the key
        exists, NO_OBJECT where it does not (S3's answers to a conditional write)."""
        key = compare["key"]
        txn = {"compare": [compare], "success": [request], "failure": [{"request_range": {"key": key}}]}
        out = self._call(kind, lambda c: c.transaction(txn))
        revision = int(out.get("header", {}).get("revision", 0))
        if not out.get("succeeded"):
            kvs = (out.get("responses") or [{}])[0].get("response_range", {}).get("kvs") or []
            raise StoreError(PRECONDITION if kvs else NO_OBJECT, f"{base64.b64decode(key).decode()} "
                             f"{'was written by someone else meanwhile' if kvs else 'does not exist'}")
        with self._lock:
            self._written = (revision, time.monotonic())
        return revision

    def put_bytes(self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None,
                  **_: Any) -> str:
        full = _b64(self.prefix + key.encode())
        put = {"request_put": {"key": full, "value": _b64(body)}}
        if if_match is not None:
            compare = {"key": full, "result": "EQUAL", "target": "MOD", "mod_revision": int(if_match)}
        elif if_none_match:
            compare = {"key": full, "result": "EQUAL", "target": "CREATE", "create_revision": 0}
        else:
            compare = {"key": full, "result": "GREATER", "target": "MOD", "mod_revision": -1}  # always true
        try:
            revision = self._txn("put", compare, put)
        except StoreError as e:
            if e.kind == NO_OBJECT and if_match is None:
                raise StoreError(PRECONDITION, str(e)) from e  # If-None-Match found one (the range raced a delete)
            raise
        self._learn(key.encode(), body, revision)
        return str(revision)

    def delete_if_match(self, key: str, etag: str) -> None:
        full = _b64(self.prefix + key.encode())
        compare = {"key": full, "result": "EQUAL", "target": "MOD", "mod_revision": int(etag)}
        self._txn("delete", compare, {"request_delete_range": {"key": full}})
        with self._lock:
            self._copy.pop(key.encode(), None)

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        """The record now (a range request: a claim and a listener's admission must judge the current one)."""
        kvs = self._call("get", lambda c: c.get(self.prefix + key.encode(), metadata=True))
        if not kvs:
            raise StoreError(NO_OBJECT, f"{key} does not exist")
        value, meta = kvs[0]
        return value, str(meta["mod_revision"])

    def head_object(self, key: str) -> ObjectInfo:
        body, etag = self.get_bytes(key)
        return ObjectInfo(len(body), etag, None, {}, 0.0)

    # ------------------------------------------------------------ the watched copy
    def list(self, prefix: str, recursive: bool = False, on_page: Callable[[], None] | None = None) -> Listing:
        """The records under `prefix` from the watched copy (no request); the first call, or one that finds the watch
        behind our own last write by WATCH_LAG, reads the prefix in one range request and watches from there."""
        p = prefix.encode()
        now = time.monotonic()
        with self._lock:
            stale = self._watched != p or now - self._heard_at > self.quiet or (
                self._written is not None and self._written[0] > self._seen_revision and now - self._written[1] > WATCH_LAG)
        if stale:
            self._resync(p)
        with self._lock:
            objects = [RemoteObject(k[len(p):].decode(), len(v), str(rev), 0.0)
                       for k, (v, rev) in sorted(self._copy.items()) if k.startswith(p)]
        return Listing([], objects, False)

    def _resync(self, p: bytes) -> None:
        if self._watched is not None:
            self.resyncs_total += 1
            log.warning("etcd at %s: the watch of the node records fell behind this node's own writes, or was silent "
                        "for %.0f s: read again", self.describe(), self.quiet)
        self.stop()
        full = self.prefix + p
        end = full[:-1] + bytes([full[-1] + 1]) if full else b"\0"
        out = self._call("list", lambda c: c.post(c.get_url("/kv/range"), json={"key": _b64(full), "range_end": _b64(end)}))
        revision = int(out.get("header", {}).get("revision", 0))
        copy = {_key(kv)[len(self.prefix):]: (_value(kv), int(kv["mod_revision"])) for kv in out.get("kvs") or []}
        with self._lock:
            self._copy, self._seen_revision, self._watched, self._heard_at = copy, revision, p, time.monotonic()
        self._watch(full, end, revision + 1)

    def _watch(self, full: bytes, end: bytes, start: int) -> None:
        def event(ev: dict[str, Any]) -> None:
            kv = ev["kv"]
            key = _key(kv)[len(self.prefix):]
            revision = int(kv.get("mod_revision") or 0)
            with self._lock:
                if ev.get("type") == "DELETE":
                    if self._revision(key) < revision:  # not a key written again since (an older watch's event)
                        self._copy.pop(key, None)
                elif revision >= self._revision(key):
                    self._copy[key] = (_value(kv), revision)
                self._seen_revision = max(self._seen_revision, revision)
                self._heard_at = time.monotonic()

        def start_watch(c: Etcd3Client) -> Watcher:
            return Watcher(c, full, event, range_end=end, start_revision=start)  # type: ignore[arg-type]

        self._watcher = self._call("watch", start_watch)

    def _revision(self, key: bytes) -> int:
        """The mod_revision the copy holds of `key` (0: none); under the lock."""
        return self._copy[key][1] if key in self._copy else 0

    def _learn(self, key: bytes, body: bytes, revision: int) -> None:
        """Our own write, into the copy at once (its watch event follows: the same revision, no change)."""
        with self._lock:
            if self._watched is not None and key.startswith(self._watched) and revision >= self._revision(key):
                self._copy[key] = (body, revision)

    def stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            try:
                watcher.stop()
            except Exception as e:  # a stream already broken: nothing left to close
                log.debug("etcd watch stop: %s", e)
