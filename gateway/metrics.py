"""Prometheus metrics and their HTTP endpoint.

Gauges are computed at scrape time from the namespace (one source of truth,
no gauge to forget to update). Counters and the time-to-durable histogram are
updated by the drainer as things happen. FUSE requests are counted by fs.py in
`FUSE_COUNTERS`: plain integer increments in dicts on the request path (one
trio thread, so no locks, and no prometheus_client object touched per
request), turned into metric families only when scraped.

Peer durability (docs/peers.md): the single-copy window (`single_copy_*`) is served by every mount,
read from the daemon's status (with durability = local, the namespace's files not yet durable).
The `ckptfs_peer_*` metrics are served only with durability = peer, all read from the status at
scrape time, which has them from `Peers.status()`: the gauges (`peer_up` and
`peer_replication_lag_seconds` by peer, so a peer that leaves leaves no stale series;
`peer_replica_bytes`) and the counters the peers package keeps (takeovers, bytes replicated,
degraded writes), so `ckptfs status` and the metrics never disagree.

Every metric is documented in docs/metrics.md; a test compares that table
with a scrape of a live mount, and `promtool check metrics` lints the scrape.

The endpoint is prometheus-client's ASGI application served by httpserver.py
(hypercorn under the daemon's nursery) instead of
`prometheus_client.start_http_server`, which would start a thread outside the
daemon's structured concurrency and read daemon state from that thread.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any, Callable

from prometheus_client import CollectorRegistry, disable_created_metrics, Counter, Gauge, Histogram, ProcessCollector, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .version import VERSION

if TYPE_CHECKING:  # the server (and hypercorn) is imported by whoever serves the app, not by every user of the counters
    from .httpserver import ASGIApp, Receive, Send

DURABLE_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, float("inf"))

GAUGES = {
    "dirty_files": "Files written on this node that are not durable in the bucket yet (dirty or uploading).",
    "dirty_bytes": "Bytes of those files.",
    "uploading_files": "Files whose upload is running.",
    "temporary_held_files": "Files held back under a directory with a temporary name (`temporary_dir_patterns`) until it is renamed or `temporary_hold_seconds` pass.",
    "oldest_dirty_age_seconds": "Seconds since the oldest not-yet-durable file was closed: the drain lag. Files held under a temporary directory (`temporary_held_files`) do not count until their hold ends.",
    "pending_deletes": "Object deletions queued (removed or renamed files).",
    "pending_markers": "Directory marker objects (`dir/`, for empty directories) queued.",
    "cache_used_bytes": "Bytes of file data in the local cache.",
    "cache_capacity_bytes": "Bytes the cache may hold.",
    "stalled_writers": "Writes waiting for the drain to free cache space (backpressure).",
    "stale_directories": "Directories served without a current listing because the store did not answer one in time (retried in the background).",
    "passthrough_handles": "Open file handles the kernel reads and writes itself (FUSE passthrough).",
    "single_copy_bytes": "Bytes acknowledged to writers that exist on this node's disk only: with durability = local every byte not yet durable in the bucket, with durability = peer those neither durable nor replicated to peer_replicas peers. Losing the node now loses them.",
    "single_copy_oldest_age_seconds": "Seconds since the oldest file counted in single_copy_bytes was closed (0 when none): how long the window has been open.",
}

# totals kept by the namespace and fetcher, exported as counters (names without _total)
STATE_COUNTERS = {
    "evicted_files": "Clean cache copies evicted to make room.",
    "evicted_bytes": "Bytes of clean cache copies evicted.",
    "write_stalls": "Writes that had to wait for cache space.",
    "write_stall_seconds": "Seconds writers spent waiting for cache space.",
    "enospc": "Writes refused with ENOSPC after waiting write_stall_timeout.",
    "fetched_bytes": "Bytes read from the bucket into the cache (files not written here, or evicted).",
    "fetched_files": "Files read whole from the bucket into the cache and checked.",
    "read_errors": "Reads from the bucket that failed (the reader got EIO).",
    "archived_reads_refused": "Opens and reads refused with ENOMEDIUM because the object is archived (GLACIER, DEEP_ARCHIVE) and not restored: `ckptfs restore PATH`.",
    "listings": "Directory listings of the bucket.",
    "listing_errors": "Directory listings of the bucket that failed (the mount kept showing what it knew).",
    "listing_timeouts": "Requests answered from what the node knew because a listing did not answer within listing_timeout.",
    "remote_removed": "Entries removed from the mount because their object was deleted from the bucket elsewhere.",
    "remote_changed": "Files whose object was replaced in the bucket elsewhere (their cached copy was dropped).",
    "checksum_mismatches": "Downloads refused because the object's bytes did not match the recorded xxh3.",
    "deletes_not_permitted": "Object deletions the store refused with AccessDenied (credentials without delete permission): dropped, not retried; the objects stay.",
}


CACHE_STATES = ("dirty", "uploading", "clean")


class FuseCounters:
    """Counts kept on the FUSE request path; read at scrape time.

    `requests[op]` and `errors[(op, errno name)]` are bumped by fs.py's error
    mapping wrapper for every request it handles; `cache_hits`/`cache_misses`
    by `open`: a hit finds the file's bytes in the local cache, a miss has to
    read them from the bucket.
    """

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.cache_hits = 0
        self.cache_misses = 0

    def error(self, op: str, code: int) -> None:
        key = (op, errno.errorcode.get(code, str(code)))
        self.errors[key] = self.errors.get(key, 0) + 1


FUSE_COUNTERS = FuseCounters()


class _StateCollector(Collector):
    def __init__(self, read: Callable[[], dict[str, Any]], fuse: FuseCounters, peers: bool = False) -> None:
        self.read = read
        self.fuse = fuse
        self.peers = peers
        self.version = VERSION

    def collect(self):  # type: ignore[no-untyped-def]
        values = self.read()
        info = GaugeMetricFamily("ckptfs_mount_info", "Always 1; labels say what this daemon mounts, from where, and its version.",
                                 labels=["source", "mountpoint", "version"])
        info.add_metric([str(values.get("source", "")), str(values.get("mountpoint", "")), self.version], 1.0)
        yield info
        # the cache split by state: what is not dirty or uploading is clean (durable copies, reads from the bucket)
        dirty = float(values.get("cache_dirty_bytes", 0))
        uploading = float(values.get("cache_uploading_bytes", 0))
        clean = max(0.0, float(values.get("cache_used_bytes", 0)) - dirty - uploading)
        by_state = GaugeMetricFamily("ckptfs_cache_bytes", "Bytes of file data in the local cache by state: dirty (not uploaded), uploading, clean (durable copies and reads from the bucket).",
                                     labels=["state"])
        for state, value in zip(CACHE_STATES, (dirty, uploading, clean)):
            by_state.add_metric([state], value)
        yield by_state
        fuse = self.fuse
        requests = CounterMetricFamily("ckptfs_fuse_requests", "FUSE requests handled, by operation.", labels=["op"])
        for op, n in sorted(fuse.requests.items()):
            requests.add_metric([op], float(n))
        yield requests
        errors = CounterMetricFamily("ckptfs_fuse_errors", "FUSE requests answered with an error, by operation and errno name (ENOENT on lookup is normal; EIO and ENOSPC are not).",
                                     labels=["op", "errno"])
        for (op, name), n in sorted(fuse.errors.items()):
            errors.add_metric([op, name], float(n))
        yield errors
        hits = CounterMetricFamily("ckptfs_cache_hits", "Opens of files whose bytes were in the local cache.")
        hits.add_metric([], float(fuse.cache_hits))
        yield hits
        misses = CounterMetricFamily("ckptfs_cache_misses", "Opens of files whose bytes had to be read from the bucket.")
        misses.add_metric([], float(fuse.cache_misses))
        yield misses
        for name, doc in GAUGES.items():
            g = GaugeMetricFamily(f"ckptfs_{name}", doc)
            g.add_metric([], float(values.get(name, 0)))
            yield g
        for name, doc in STATE_COUNTERS.items():
            c = CounterMetricFamily(f"ckptfs_{name}", doc)
            c.add_metric([], float(values.get(f"{name}_total", 0)))
            yield c
        restarts = CounterMetricFamily("ckptfs_service_restarts", "Restarts of a background service after an unexpected error "
                                       "(supervisor.py; its last error is in `ckptfs status`).", labels=["service"])
        for service, state in sorted((values.get("services") or {}).items()):
            restarts.add_metric([service], float(state.get("restarts", 0)))
        yield restarts
        if self.peers:
            yield from peer_families(values)


PEER_COUNTERS = {
    "peer_takeovers": "Dead nodes whose replicas this node took over and uploaded.",
    "peer_replicated_bytes": "Bytes of this node's files sent to peers and acknowledged by them.",
    "peer_degraded_writes": "Fsyncs and closes acknowledged on this node alone because no peer took a copy in time "
                            "(on_no_peer = degrade): those files are single-copy until they drain.",
    "peer_keys_refused": "Frames from other nodes that named a key outside this mount's prefix (or in its .ckptfs/): refused, "
                         "their connection dropped. Nodes that share the secret but not the bucket and prefix, or a bad actor.",
    "peer_refused_writes": "Fsyncs and closes answered EIO because no peer took a copy in time (on_no_peer = fail).",
    "peer_replicas_refused": "Other nodes' files this node refused to hold because its replica space (peer_capacity) or its "
                             "cache disk was full; their owners tried another peer, then on_no_peer.",
    "peer_owners_redirected": "Owners this node sent on to their next candidate because it already took replicas from its "
                              "share of them (2 x peer_replicas): the spread over unequal failure domains. An owner that "
                              "every candidate redirects is taken anyway.",
    "peer_handshake_refused": "Connections to this node's peer_addr closed without authenticating: a wrong secret, no handshake "
                              "in time, or too many unauthenticated at once (from one address, or from addresses no node "
                              "announces). A steady rise is a flood or a misconfigured node.",
}


def peer_families(values: dict[str, Any]) -> list[GaugeMetricFamily | CounterMetricFamily]:
    """The peer metrics (durability = peer), from the status: its `peers` list, `peer_replica_bytes`, the counters."""
    up = GaugeMetricFamily("ckptfs_peer_up", "1 while the peer's node record is live (renewed within peer_lease_ttl) and it accepts "
                           "this node's handshake, 0 while it is down, taken over or refusing; no series for a node that left, nor for one "
                           "whose record stopped changing that this node did not read since (its holders say).",
                           labels=["peer"])
    lag = GaugeMetricFamily("ckptfs_peer_replication_lag_seconds", "Seconds the peer's copies are behind what this node wrote for it "
                            "(0: it holds everything sent to it).", labels=["peer"])
    # a peer whose record stopped changing that this node did not read since (`known_from` listing) may have died, left
    # or been taken over: no series from here (its holders and the nodes sending to it read it and say which)
    for p in sorted((p for p in values.get("peers") or [] if p.get("node") and p.get("state") != "left"
                     and (p.get("state") == "live" or p.get("known_from") != "listing")), key=lambda p: str(p["node"])):
        up.add_metric([str(p["node"])], 1.0 if p.get("state") == "live" else 0.0)
        if p.get("lag_seconds") is not None:
            lag.add_metric([str(p["node"])], float(p["lag_seconds"]))
    held = GaugeMetricFamily("ckptfs_peer_replica_bytes", "Bytes of other nodes' files this node holds as their peer until the bucket has them (peer_capacity).")
    held.add_metric([], float(values.get("peer_replica_bytes", 0)))
    unclaimed = GaugeMetricFamily("ckptfs_peer_unclaimed_nodes", "Nodes dead for 2 x peer_lease_ttl that no node took over: "
                                  "no live node holds their copies (they had nothing undrained, or their holders are down too).")
    unclaimed.add_metric([], float(len(values.get("peer_unclaimed_nodes") or [])))
    requests = CounterMetricFamily("ckptfs_membership_requests", "Requests this node made to keep its node record and read the "
                                   "others' (a LIST counted by its pages), by membership backend and kind.", labels=["backend", "kind"])
    membership = values.get("membership") or {}
    for kind, n in sorted((membership.get("requests") or {}).items()):
        requests.add_metric([str(membership.get("backend") or "bucket"), str(kind)], float(n))
    families: list[GaugeMetricFamily | CounterMetricFamily] = [up, lag, held, unclaimed, requests]
    for name, doc in PEER_COUNTERS.items():
        c = CounterMetricFamily(f"ckptfs_{name}", doc)
        c.add_metric([], float(values.get(f"{name}_total", 0)))
        families.append(c)
    return families


class Metrics:
    def __init__(self, read_state: Callable[[], dict[str, Any]], fuse: FuseCounters = FUSE_COUNTERS, peers: bool = False) -> None:
        disable_created_metrics()  # the *_created series only clutter dashboards
        self.registry = CollectorRegistry()
        r = self.registry
        self.uploaded_bytes = Counter("ckptfs_uploaded_bytes", "Bytes uploaded to the object store (parts and single objects that succeeded).", registry=r)
        self.uploaded_files = Counter("ckptfs_uploaded_files", "Files that became durable.", registry=r)
        self.upload_errors = Counter("ckptfs_upload_errors", "Failed object store requests while draining (each is retried).", ["kind"], registry=r)
        self.deleted_objects = Counter("ckptfs_deleted_objects", "Objects deleted because their file was removed or renamed.", registry=r)
        self.copied_objects = Counter("ckptfs_copied_objects", "Objects copied inside the store because a durable file was renamed.", registry=r)
        self.abandoned_uploads = Counter("ckptfs_abandoned_uploads", "Uploads abandoned because the file changed, moved or was removed meanwhile.", registry=r)
        self.parts_in_flight = Gauge("ckptfs_parts_in_flight", "Parts or single-object uploads being sent now.", registry=r)
        self.time_to_durable = Histogram(
            "ckptfs_time_to_durable_seconds", "Seconds from a file's last close to it being durable in the bucket.",
            buckets=DURABLE_BUCKETS, registry=r,
        )
        r.register(_StateCollector(read_state, fuse, peers))  # `peers`: durability = peer, the ckptfs_peer_* metrics too
        ProcessCollector(registry=r)  # process_* (CPU, memory, open fds, start time): restarts and leaks show
        for kind in ("network", "server", "auth", "no-bucket", "no-upload", "other"):
            self.upload_errors.labels(kind)

    def errors_total(self) -> float:
        return sum(self.upload_errors.labels(k)._value.get() for k in ("network", "server", "auth", "no-bucket", "no-upload", "other"))

    def app(self, page: ASGIApp | None = None) -> ASGIApp:
        """The ASGI application of metrics_addr: `/metrics` (and `/`) prometheus-client's, the rest `page`'s
        (the catalogue page, ui_enabled) or 404."""
        metrics = make_asgi_app(self.registry)

        async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close"})  # refused before the handshake: 403
                return
            if scope["type"] != "http":
                return  # lifespan: nothing to start
            if scope["path"] in ("/metrics", "/") and scope["method"] in ("GET", "HEAD"):
                await metrics(scope, receive, send)
            elif page is not None:
                await page(scope, receive, send)
            else:
                await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"not found: try /metrics\n"})

        return app
