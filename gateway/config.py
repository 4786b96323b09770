"""One typed configuration object for the daemon.

Every option is declared once, in `Config`, with its default and a help text.
The sources are layered: defaults < TOML file < environment (`CKPTFS_<NAME>`)
< command-line flags. `docs/configuration.md` is generated from these
declarations (`python -m ckptfs.config --markdown`), so it cannot drift.

Validation happens here, before anything is mounted, and every problem is
reported as one `ConfigError` line that names the option and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from .encryption import Encryption, EncryptionError
from .patterns import PatternError, compile_patterns
from .peering import PeerOptionError, check_peer_options
from .sizes import (GiB, KiB, MiB, S3_MAX_KEY_BYTES, S3_MAX_PART_SIZE, S3_MAX_PARTS, S3_MIN_PART_SIZE, TiB,  # noqa: F401 (for callers)
                    SMALL_OBJECTS_PER_PART, fmt_bytes, part_size_for, small_objects_in_flight)
from .storageclass import TierError, parse_prices, parse_transitions

UNIX_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path is 108 with its NUL): the control socket's
AUTO_MIN_FREE_PERCENT = 5  # default cache_min_free: this share of the cache file system, at most 1 GiB


class ConfigError(Exception):
    """A user-fixable configuration problem; the message is one line."""


def _opt(default: Any, help: str, kind: str = "", **extra: Any) -> Any:
    meta = {"help": help, "kind": kind, **extra}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Config:
    """What one mount is configured with. Field order is the order in the docs."""

    # where
    bucket: str = _opt("", "Bucket that backs the mount (from `s3://BUCKET/PREFIX`).")
    prefix: str = _opt("", "Key prefix under which the mount's tree is stored; empty for the bucket root.")
    mountpoint: str = _opt("", "Directory to mount on (must exist and be empty).")
    cache_dir: str = _opt("", "Local directory (NVMe) for cached file data and the journal. Must exist and be writable.")
    endpoint_url: str = _opt("", "S3 endpoint URL (MinIO, SeaweedFS, Ceph RGW); empty for AWS S3.")
    region: str = _opt("us-east-1", "S3 region name used for request signing.")
    profile: str = _opt("", "AWS profile name for credentials; empty for the default chain (environment, ~/.aws, instance role).")
    sign_payload_over_http: bool = _opt(True, "Over a plain `http://` endpoint, sign each upload's bytes (their SHA-256 in the request's signature, botocore's rule), so that nothing on the path can alter them unseen. `false` sends them as UNSIGNED-PAYLOAD, checked by the store against the signed CRC32 of each part alone, which catches corruption but not a deliberate change: about 0.6 s less CPU per GiB uploaded (docs/benchmarks.md), for a store on a network you trust. Over `https://` the bytes are never hashed for the signature: TLS protects them.")
    ca_bundle: str = _opt("", "A PEM file of CA certificates to verify the endpoint's TLS certificate with (an internal CA); empty uses the system's, or `AWS_CA_BUNDLE` if set. TLS is always verified.")

    # encryption (docs/security.md)
    sse: str = _opt("", "Server-side encryption of the objects this mount writes: \"\" (none asked; the bucket's default applies), \"AES256\" (SSE-S3) or \"aws:kms\" (SSE-KMS, with `sse_kms_key_id`). For SSE-C set `sse_c_key_file` instead.")
    sse_kms_key_id: str = _opt("", "With sse = \"aws:kms\": the KMS key id or ARN; empty uses the account's default `aws/s3` key.")
    sse_c_key_file: str = _opt("", "SSE-C: a file holding the 256-bit key (32 raw bytes or their base64), owned by the mounting user and readable by nobody else (chmod 600). Every request that touches object bytes carries it; objects written with it can only be read with it.")
    metrics_addr: str = _opt("", "HOST:PORT to serve Prometheus metrics on (`/metrics`); empty to disable. Use 127.0.0.1 unless it must be reachable from elsewhere.")
    metrics_read_timeout: float = _opt(10.0, "Seconds a client of `metrics_addr` has to send a whole request, from connecting or from its previous answer; then it is disconnected (a client trickling header bytes cannot hold a connection). At most 64 connections are open at once: past that, the oldest is closed.")
    ui_enabled: bool = _opt(False, "Serve the read-only catalogue page (docs/ui.md) on `metrics_addr` under `/ui`. Needs `metrics_addr`; on an address that is not loopback also `ui_token_file`.")
    ui_token_file: str = _opt("", "With `ui_enabled`: a file (chmod 600) holding the token every request to `/ui` must carry; required when `metrics_addr` is not a loopback address.")

    # drain
    upload_delay: float = _opt(0.5, "Seconds a closed file waits before its upload starts, so that `write tmp, close, rename` renames before any byte is sent.", "seconds")
    multipart_threshold: int = _opt(16 * MiB, "Files at least this large are uploaded as multipart uploads; smaller ones with one PutObject.", "bytes")
    part_size: int = _opt(64 * MiB, "Multipart part size. Between 5 MiB and 5 GiB, and large enough that `max_file_size` needs at most 10,000 parts. Parts are streamed from the cache file, so this does not set memory use.", "bytes")
    max_parts_in_flight: int = _opt(8, f"Parts of multipart uploads (and server-side copies) sent at once across all files. Files below `multipart_threshold`, one PutObject each, go {SMALL_OBJECTS_PER_PART} times as many at once: a small request waits on the store's latency rather than on the bandwidth.")
    max_file_size: int = _opt(0, "Largest file the mount accepts; writes beyond it fail with EFBIG. 0 means part_size x 10,000 (the most one multipart upload can hold). Under FUSE passthrough the daemon does not see each write: a file at or past the limit is opened in copy mode (where a write beyond it gets EFBIG), but a handle opened with passthrough below the limit is not stopped at it.", "bytes")
    commit_markers: list[str] = _opt(
        [".metadata", "*.index.json", "latest", "COMMIT"],
        "File name patterns (fnmatch) of commit markers: a marker is uploaded only after every other file under its directory written on this node is durable.",
    )
    temporary_dir_patterns: list[str] = _opt(
        ["*.orbax-checkpoint-tmp*", "*.tmp", "tmp-*", ".tmp*"],
        "Directory name patterns (fnmatch) that mark a directory temporary (docs/semantics.md, \"Temporary directories\"): files at any depth below one are not uploaded until the directory is renamed to a name that matches none (they then go straight to their final keys), or until `temporary_hold_seconds` after their last close (then under the name they have). Empty `dir/` markers of such directories wait the same way. An empty list holds nothing back.",
    )
    temporary_hold_seconds: float = _opt(3600.0, "Longest a file under a temporary directory (`temporary_dir_patterns`) waits after its last close for the directory to be renamed; past it the file is uploaded under its temporary name, so a writer that crashed mid-save still has its bytes in the bucket. `ckptfs flush` does not wait for it. 0 holds nothing back.", "seconds")

    # namespace and reads
    metadata_ttl: float = _opt(5.0, "Seconds a directory's bucket listing is trusted: files written, changed or deleted by other nodes show up after their upload plus at most this long. 0 lists on every lookup.", "seconds")
    listing_timeout: float = _opt(1.5, "Seconds a lookup, `ls`, `stat` or `open` waits for a directory listing from the bucket that gives no answer (a listing that keeps returning pages is waited for). After that the request is answered from what this node knows, the directory counts as stale (`ckptfs status`, metric `ckptfs_stale_directories`) and its listing is retried in the background until it succeeds; a stale directory is not waited for again. 0 waits as long as the store takes.", "seconds")
    read_range_size: int = _opt(8 * MiB, "Size of the first ranged GET when a file that is only in the bucket is read into the cache; each next range is twice the last, up to read_range_max_size.", "bytes")
    read_range_max_size: int = _opt(64 * MiB, "Largest ranged GET when reading a file from the bucket. Larger ranges cost the daemon less CPU per GiB; a reader waits at most for one range.", "bytes")
    read_concurrency: int = _opt(8, "Ranged GETs in flight per file being read from the bucket.")
    read_range_timeout: float = _opt(60.0, "Seconds one ranged GET may take, retries included, when a file that is not in the cache is read from the bucket; after that the reader gets EIO and the log says the object store did not answer. 0 waits as long as the store takes.", "seconds")
    kernel_read_ahead: int = _opt(2 * MiB, "Read-ahead the kernel uses on the mount (its `read_ahead_kb`, set at mount when running as root). Larger reads mean fewer FUSE requests, each one a round trip through Python. 0 keeps the kernel's default.", "bytes")
    copy_multipart_threshold: int = _opt(5 * GiB, "Renaming a durable file copies its object inside the store; objects at least this large are copied in parts (UploadPartCopy of `part_size`), as S3 requires above 5 GiB.", "bytes")

    # cache
    cache_capacity: int = _opt(0, "Bytes of cache the mount may use; 0 means 90% of the cache file system's size.", "bytes")
    cache_min_free: int | None = _opt(None, "Free space to leave on the cache file system, whatever the capacity says. Empty (or `auto`) means 5% of the cache file system, at most 1 GiB, so a small disk is not reserved whole.", "bytes")
    cache_high_watermark: float = _opt(0.9, "When the cache holds more than this fraction of `cache_capacity`, clean (durable) copies are evicted in the background, least recently used first, down to `cache_low_watermark`.")
    cache_low_watermark: float = _opt(0.75, "Fraction of `cache_capacity` that background eviction brings the cache down to. Dirty or uploading files are never evicted.")
    write_stall_timeout: float = _opt(60.0, "When the cache is full of data not yet uploaded, a writer waits up to this many seconds for the drain to free space, then gets ENOSPC. With nothing left to drain (no other file's bytes on their way to the bucket) it gets ENOSPC at once.", "seconds")

    # checkpoints (docs/lifecycle.md)
    checkpoint_patterns: list[str] = _opt(
        ["step_{step}", "step-{step}", "checkpoint-{step}", "global_step{step}", "iter_{step}", "{step}",
         "file:epoch=*-step={step}.ckpt", "file:checkpoints/*{step}.ckpt", "file:checkpoints/*{step}.pt"],
        "Directory names that make a checkpoint (docs/lifecycle.md): `{step}` stands for the step number (digits) and `*` for any characters; the whole name must match. A checkpoint may sit at any depth (`run/step_100`); directories inside a checkpoint are part of it. A pattern beginning `file:` matches a checkpoint saved as one file (Lightning's `epoch=0-step=100.ckpt`), and may name the directories right above the file (`file:checkpoints/*{step}.pt`). An empty list turns checkpoint tracking off.",
    )
    checkpoint_quiet_seconds: float = _opt(60.0, "A checkpoint is committed (its manifest written) once every file in it is durable and nothing in it has changed, on this node or in the bucket, for this many seconds; `ckptfs checkpoint commit` commits at once.", "seconds")

    # storage tiers and cost (docs/lifecycle.md, "Tiers" and "Cost")
    checkpoint_tags: bool = _opt(True, "Tag the objects of each committed checkpoint with `ckptfs-state` (committed, protected), `ckptfs-protected` (true, false) and `ckptfs-step`, when its manifest is written and on protect/unprotect: the bucket lifecycle rules of `ckptfs lifecycle plan` select checkpoints by these tags. Other tags on the objects are kept.")
    tier_transitions: list[str] = _opt([], "Storage-class transitions for committed, not protected checkpoints, as `DAYS:CLASS` (days after an object was written), e.g. `30:STANDARD_IA, 90:GLACIER_IR`. Empty: no transitions. `ckptfs lifecycle plan` shows the bucket rules, `ckptfs lifecycle apply` sets them.")
    tier_expiring_delete_days: int = _opt(0, "Add a bucket lifecycle rule that deletes objects of checkpoints tagged `ckptfs-state=expiring` this many days after they were written (S3 counts from the object's creation); 0: no such rule.", "days")
    tier_move_target: str = _opt("", "For stores without lifecycle transitions (SeaweedFS answers them with 501): the name of a `[replica.NAME]` table that the daemon itself moves old checkpoints to (docs/lifecycle.md, \"Moving to a cold target\"). Committed, not protected, not expiring checkpoints committed more than `tier_move_after` ago are copied there (server-side on the same endpoint, else streamed), verified (size and xxh3-128, read back), and only then deleted from this bucket; the manifest stays here with a record of the move, and `ckptfs restore PATH` brings one back. That table is then a cold target only: the replicator does not copy checkpoints to it. Empty: no moves.")
    tier_move_after: float = _opt(90 * 86400.0, "With `tier_move_target`: move a checkpoint once this many seconds have passed since it was committed (or since it was restored). Never less than any job needs to read it: a file open on another node is not seen from the moving node.", "seconds")
    tier_move_interval: float = _opt(3600.0, "With `tier_move_target`: seconds between passes of the mover (the node holding the `tier-move` lease looks for checkpoints to move each time).", "seconds")
    cold_compression: str = _opt("auto", "With `tier_move_target`: how a moved checkpoint's files are stored on the cold target (docs/lifecycle.md, \"Compressed cold tier\"). `auto`: tensors with a codec for their dtype (the exponent bytes apart: safetensors by their header, torch.save and DCP files by their pickled storage types, else by trying), zstd for the rest; `zstd`: zstd for every byte; `none`: as they are. A compressed file's object is named `FILE.ckptfs-z`; one that saves less than `cold_compression_threshold` is stored as it is.")
    cold_compression_threshold: float = _opt(0.03, "With `cold_compression`: a file whose compressed copy would save less than this fraction of its size is stored as it is (its own name, no decoding on restore).")
    tier_noncurrent_delete_days: int = _opt(0, "On a versioned bucket (Object Lock turns versioning on), deleting an object (retention's deletes, overwrites) keeps its old version, still stored and billed. This many days after a version became noncurrent, a bucket lifecycle rule deletes it, and the delete markers left without versions; 0: no such rule (`ckptfs lifecycle plan` warns when the bucket is versioned). Versions under legal hold or Object Lock retention are kept by the store whatever the rule says.", "days")
    restore_days: int = _opt(7, "`ckptfs restore` asks for archived objects to be readable for this many days.", "days")
    restore_tier: str = _opt("Standard", "`ckptfs restore` retrieval tier: Expedited, Standard or Bulk (price and speed differ per store and class).")
    storage_prices: list[str] = _opt(
        ["STANDARD:0.023", "INTELLIGENT_TIERING:0.023", "STANDARD_IA:0.0125", "ONEZONE_IA:0.01", "GLACIER_IR:0.004",
         "GLACIER:0.0036", "DEEP_ARCHIVE:0.00099", "REDUCED_REDUNDANCY:0.024"],
        "Price per GiB-month of each storage class, as `CLASS:PRICE`, for the estimates of `ckptfs usage` and the cost metrics. The defaults are EXAMPLES (AWS S3 us-east-1 list prices, USD, first tier, at the time of writing), not quotes: put your store's prices here. A class missing from the table is priced as STANDARD.",
    )
    # replication (docs/replication.md); the targets are `[replica.NAME]` tables, see below
    replication_interval: float = _opt(30.0, "Seconds between replication passes: every node surveys each `[replica.NAME]` target (for `ckptfs replicate status` and the metrics) and the node holding the `replication` lease copies what is missing.", "seconds")
    replication_lease_ttl: float = _opt(60.0, "Seconds the `replication` lease in the bucket lasts unless its holder renews it (every third of it): a node that dies mid-copy is taken over after at most this long.", "seconds")
    replication_part_size: int = _opt(16 * MiB, "Part size of a replica copy (streamed: GET from the primary, multipart PUT to a target on another endpoint; inside the store: UploadPartCopy). Raised, in whole MiB, for a file that would need more than S3's 10,000 parts (as `part_size` is for uploads). A streamed copy holds at most `replication_part_size` x `replication_parts_in_flight` bytes in memory: a raised part holds as many slots as it is worth, so fewer are in flight; only a single part larger than that whole bound (a file above 10,000 x the bound) is held alone, above it.", "bytes")
    replication_parts_in_flight: int = _opt(8, "Parts (or small objects) copied at once to each target, across all files; a part raised past `replication_part_size` (a file of more than 10,000 parts) counts as several.")
    replication_read_timeout: float = _opt(30.0, "Seconds to wait for a replica target's answer before retrying (3 attempts): a target that hangs shows as an error after about three times this, and never holds up the mount, the drain or the primary.", "seconds")
    read_only: bool = _opt(False, "Mount read-only (`-o read_only=true`): every change fails with EROFS, nothing is uploaded or committed. For a mount of a replica's bucket, or any bucket this node must not change.")
    retention_keep_last: int = _opt(0, "Retention (docs/lifecycle.md): keep the newest N committed checkpoints of each directory of checkpoints. 0 turns this rule off. With every keep rule off, retention keeps everything.")
    retention_keep_every_steps: int = _opt(0, "Retention: keep every checkpoint whose step is a multiple of K (milestones). 0 turns this rule off.")
    retention_keep_every_seconds: float = _opt(0.0, "Retention: keep one checkpoint per this many seconds of commit time (the oldest, then the first at least this long after the last one kept). 0 turns this rule off.", "seconds")
    retention_min_age: float = _opt(3600.0, "Retention deletes no checkpoint committed less than this many seconds ago, whatever the rules say.", "seconds")
    retention_grace: float = _opt(86400.0, "A checkpoint retention lets go is first marked expiring (still readable, `ckptfs retention restore` takes it back) and deleted this many seconds later.", "seconds")
    retention_interval: float = _opt(0.0, "Seconds between scheduled retention runs (`retention apply` on the whole mount); one node at a time runs it, holding a lease in the bucket. 0 = no schedule (run `ckptfs retention apply` yourself).", "seconds")

    # object store client
    connect_timeout: float = _opt(5.0, "Seconds to wait for a TCP connection to the object store (more than 0).", "seconds")
    read_timeout: float = _opt(60.0, "Seconds to wait for a response from the object store before retrying (more than 0).", "seconds")
    mount_check_timeout: float = _opt(30.0, "Seconds the check of the bucket at mount (HeadBucket, up to 3 attempts) takes at most, connections, answers and the pauses between attempts included; a store that accepts the connection and does not answer in time fails the mount with one line. Keep it well below systemd's TimeoutStartSec (120 s in the shipped unit), or systemd kills the start before that line is written (more than 0).", "seconds")
    retry_max_backoff: float = _opt(60.0, "Upper bound, in seconds, of the exponential backoff between attempts to upload a file. Attempts never stop for acknowledged data.", "seconds")
    retry_auth_backoff: float = _opt(30.0, "Seconds between attempts while the store answers 403 (credentials, permissions) or 404 (bucket gone): these need an operator, so retry slowly.", "seconds")
    abort_stale_uploads_after: float = _opt(86400.0, "At mount, abort multipart uploads under the prefix started this many seconds ago or more that no journal owns (left by a crashed node). 0 disables.", "seconds")

    # lifecycle
    shutdown_timeout: float = _opt(30.0, "On SIGTERM or `ckptfs unmount`, seconds to keep draining before stopping; what is left stays in the journal for the next mount.", "seconds")
    direct_io_writes: bool = _opt(True, "Handles opened for writing bypass the kernel's page cache (FUSE direct_io): writes are acknowledged up to several times faster and a just-written file renames in about a millisecond instead of the kernel dropping its cached pages (~150 ms per GiB). The price: a file open for writing cannot be mapped with mmap(MAP_SHARED) (ENODEV). Set false if an application writes through shared memory maps. Write handles under FUSE passthrough (`fuse_transport`) need neither: the kernel writes the cache file itself, and shared writable maps work.")
    allow_other: bool = _opt(False, "Let users other than the mounting one access the mount (FUSE allow_other; needed for NFS re-export).")
    passthrough_min_room: int = _opt(1 * GiB, "With FUSE passthrough the kernel writes cache files itself, so the daemon cannot slow a single write down when the cache fills: a new write handle gets passthrough only while the cache has at least this much room (capacity minus what it holds, and the disk's free space above `cache_min_free`); otherwise it gets copy mode, where writers wait for the drain and then get ENOSPC. A passthrough writer that fills the disk gets ENOSPC from the kernel; nothing acknowledged before is lost.", "bytes")
    fuse_transport: str = _opt("auto", "How the daemon talks to the kernel. `kernel`: it speaks the FUSE protocol on /dev/fuse itself (root; any kernel from Linux 5.4, FUSE 7.31), and with FUSE passthrough (Linux 6.9 or later) the kernel reads and writes cache files directly, without the daemon copying the bytes; on older kernels it serves in copy mode. `libfuse`: through pyfuse3/libfuse, for any user (mounts via fusermount3); the daemon copies every byte. `auto`: kernel when running as root (passthrough where the kernel offers it), else libfuse. docs/semantics.md says which transport and data path each kernel gets.")
    fuse_passthrough: bool = _opt(True, "With `fuse_transport` kernel, ask the kernel for FUSE passthrough (granted to root on Linux 6.9 or later). Set false to serve every read and write in copy mode through the daemon, as where passthrough is refused: to rule passthrough out when chasing a problem, or to compare the two (`python -m bench` does). Has no effect on `fuse_transport` libfuse, which never has passthrough.")
    fuse_workers: str = _opt("auto", "With `fuse_transport` kernel: request workers, each a thread on its own clone of /dev/fuse that moves the bytes of copy-mode reads and writes (the read from /dev/fuse, the pwrite into the cache file, the pread and the reply) on a core of its own, while the filesystem's logic stays on the daemon's one event loop. `auto`: in copy mode one per core the daemon may run on, at most 8 (past that the kernel's own copies, not the daemon, set the pace: docs/benchmarks.md); under passthrough one, since the kernel moves the bytes and a worker's hand-over to the event loop adds to every request (a small file costs ~1.5x the daemon CPU through workers). 1: one reader on the event loop itself. 2 to 64: that many workers, under passthrough too (for the handles that still get copy mode: the cache short of `passthrough_min_room`, a file still arriving from the bucket). No effect on `fuse_transport` libfuse.")
    log_level: str = _opt("info", "Log level: debug, info, warning or error.")
    # peers (docs/peers.md)
    durability: str = _opt("local", "When an fsync (and, for a file written without one, its close) returns. `local`: once the bytes are on this node's cache disk (and its journal). `peer`: once they are also on `peer_replicas` other nodes' disks (docs/peers.md), so losing this node before the drain finishes loses nothing; needs `peer_addr` and `peer_secret_file`.")
    node_name: str = _opt("", "This node's name among the mounts of the bucket (node records, manifests, the audit log). Empty: the host name. Three mounts on one machine are three nodes when each has its own.")
    peers: list[str] = _opt([], "A static list of the nodes to replicate to, as `NAME=HOST:PORT` (with `@DOMAIN` for its `failure_domain`, `NAME=HOST:PORT@DOMAIN`). Empty: nodes announce themselves in the bucket (`.ckptfs/nodes/`) and find each other there. Liveness and takeover go through the bucket either way.")
    peer_addr: str = _opt("", "With `durability = peer`: HOST:PORT this node's replication listener binds to and other nodes connect to (port 0: any free one, announced in the node record). A non-loopback address needs `peer_secret_file`.")
    peer_secret_file: str = _opt("", "A file (chmod 600, owned by the mounting user) holding the cluster's shared secret (at least 32 bytes) that peers prove to each other when they connect (challenge-response, HMAC-SHA256); every node of the cluster has the same. Required with `durability = peer`.")
    peer_secret_previous_file: str = _opt("", "During a rotation of the shared secret: a file holding the previous one (the same checks as `peer_secret_file`). This node accepts connections proven with either, and connects with `peer_secret_file`'s first, then this one: nodes that have only the old secret and nodes that have the new one keep replicating to each other while they are remounted one at a time (docs/peers.md, Rotating the secret). Empty once every node has the new secret.")
    peer_encryption: str = _opt("none", "With `durability = peer`: `aes-gcm` encrypts the replicated bytes on the wire (AES-256-GCM, keyed from each connection's handshake on the shared secret; names, sizes and offsets stay MACed, not encrypted), at the cost of reading every byte through the daemon instead of `sendfile`; `none` sends them in clear (MACed frame headers, the seal's BLAKE3 still catching any change). Every node must have the same setting: a node refuses a peer whose setting differs (docs/peers.md).")
    peer_replicas: int = _opt(1, "With `durability = peer`: how many other nodes hold a copy of each file until it is durable (R).")
    failure_domain: str = _opt("", "This node's failure domain (a rack, a power feed): replicas go only to nodes of another domain. Empty: every other node is another domain.")
    peer_timeout: float = _opt(10.0, "Seconds a peer may take to acknowledge before it is replaced by the next candidate (and the waiting fsync or close goes on with it); also how long a peer that died silently goes unnoticed at most (an idle connection is pinged, with TCP keepalive and `TCP_USER_TIMEOUT` under it).", "seconds")
    on_no_peer: str = _opt("degrade", "With `durability = peer`, when no peer can take a copy: `degrade` acknowledges on the local disk alone (counted in `ckptfs_peer_degraded_writes_total`, alerted: the file is single-copy until it drains) or `fail` answers the fsync or close with EIO. A `rename`, `unlink` or `rmdir` (already applied on this node) returns either way, counted as degraded ([semantics.md](semantics.md#a-rename-that-returned)).")
    peer_lease_ttl: float = _opt(30.0, "Seconds a node's record in the bucket stays valid unless renewed (every third of it). A node not heard from for this long is dead: a node holding its replicas takes it over and uploads what it had not. A node paused longer than this finds itself fenced and uploads nothing until it has reconciled.", "seconds")
    peer_membership: str = _opt("bucket", "With `durability = peer`: where the nodes keep their records, renew their leases and claim a dead node. `bucket`: in the mount's bucket (`.ckptfs/nodes/`), nothing more to run; each node makes about two requests per third of the lease, and the LIST of the records grows a page per 1,000 nodes (up to about 1,000 nodes with the default lease: docs/peers.md). `etcd`: in an etcd cluster (`etcd_endpoints`), whose watch replaces the LIST: one write per node per third of the lease and no request for the others' liveness, for clusters past a few hundred nodes. Every node of a cluster must use the same.")
    etcd_endpoints: str = _opt("", "With `peer_membership = etcd`: the etcd cluster's client URLs, comma-separated (`http://10.0.0.5:2379,http://10.0.0.6:2379`), tried in turn; `https://` verifies the server against the system's CAs (client certificates and etcd users are not supported).")
    etcd_prefix: str = _opt("/ckptfs/", "With `peer_membership = etcd`: the prefix of ckptfs's keys in etcd; a node's record is at PREFIX + BUCKET/MOUNT_PREFIX/.ckptfs/nodes/NODE.json, so clusters of other buckets or prefixes can share one etcd.")
    peer_capacity: int = _opt(0, "Bytes of the cache disk kept for other nodes' replicas, apart from `cache_capacity`. 0: a quarter of the cache file system. A peer past it refuses new replicas (the sender tries the next). Size it at about one checkpoint interval of the peers' writes (docs/peers.md).", "bytes")
    peer_max_bandwidth: int = _opt(0, "Bytes per second replication may send to peers, all peers together; 0: no cap.", "bytes")
    peer_record_expiry: float = _opt(7 * 86400.0, "Seconds a node record in the bucket (`.ckptfs/nodes/`) is kept after its node was taken over and the takeover finished, with nothing written to it since: then a sweep deletes it (If-Match: a node that came back and wrote its record again is never removed) and `ckptfs status` stops listing the node. A node that comes back with its cache after this long finds no record saying it was taken over: bring it back with an empty cache directory.", "seconds")
    peer_drop_grace: float = _opt(60.0, "Seconds a replica may outlive its file's durability: the owner tells its peers at once; a sweep every this long asks the bucket about replicas of owners that are gone.", "seconds")
    replica: dict = _opt({}, "Replica targets, from `[replica.NAME]` tables in the TOML file (see the replica table below); not settable from the environment or `-o`.", "table")

    # ------------------------------------------------------------------ derived
    @property
    def key_prefix(self) -> str:
        """The prefix as it is joined to paths: empty, or ending in '/'."""
        p = self.prefix.strip("/")
        return f"{p}/" if p else ""

    @property
    def file_size_limit(self) -> int:
        return self.max_file_size or self.part_size * S3_MAX_PARTS

    @property
    def control_socket(self) -> Path:
        return Path(self.cache_dir) / "control.sock"

    # -------------------------------------------------------------- validation
    def validate(self) -> None:
        if not self.bucket:
            raise ConfigError("no bucket: give the source as s3://BUCKET[/PREFIX], or source = \"s3://BUCKET[/PREFIX]\" in the config file")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-_]{1,254}", self.bucket):
            raise ConfigError(f"bucket name {self.bucket!r} is not a valid S3 bucket name")
        if not self.mountpoint:
            raise ConfigError("no mount point: give MOUNTPOINT, or mountpoint = \"/path\" in the config file")
        if not self.cache_dir:
            raise ConfigError("no cache directory: pass --cache-dir DIR or set cache_dir in the config file")
        sock = os.fsencode(os.path.abspath(self.control_socket))
        if len(sock) > UNIX_PATH_MAX:
            raise ConfigError(f"cache_dir {self.cache_dir} is too long: the control socket in it would be a path of {len(sock)} bytes, "
                              f"and a Unix socket's is at most {UNIX_PATH_MAX}: give a shorter cache directory")
        check_prefix(self.prefix)
        for name in ("connect_timeout", "read_timeout", "mount_check_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} = {getattr(self, name)}: give a number of seconds greater than 0")
        for name in ("upload_delay", "shutdown_timeout", "retry_max_backoff",
                     "retry_auth_backoff", "write_stall_timeout", "abort_stale_uploads_after", "checkpoint_quiet_seconds",
                     "listing_timeout", "read_range_timeout",
                     "retention_keep_every_seconds", "retention_min_age", "retention_grace", "retention_interval",
                     "temporary_hold_seconds"):
            if not getattr(self, name) >= 0:  # NaN too
                raise ConfigError(f"{name} = {getattr(self, name)} is negative: give a number of seconds >= 0")
        for name in ("multipart_threshold", "part_size", "max_file_size", "cache_capacity", "cache_min_free"):
            if (getattr(self, name) or 0) < 0:
                raise ConfigError(f"{name} = {getattr(self, name)} is negative: give a size in bytes >= 0")
        if self.part_size < S3_MIN_PART_SIZE:
            raise ConfigError(f"part_size = {fmt_bytes(self.part_size)} is below the S3 minimum of 5 MiB: raise it")
        if self.part_size > S3_MAX_PART_SIZE:
            raise ConfigError(f"part_size = {fmt_bytes(self.part_size)} is above the S3 maximum of 5 GiB: lower it")
        if self.file_size_limit > self.part_size * S3_MAX_PARTS:
            need = -(-self.max_file_size // S3_MAX_PARTS)
            raise ConfigError(
                f"part_size = {fmt_bytes(self.part_size)} would need more than 10,000 parts for max_file_size = "
                f"{fmt_bytes(self.max_file_size)}: raise part_size to at least {fmt_bytes(need)} or lower max_file_size"
            )
        if self.multipart_threshold < 1:
            raise ConfigError("multipart_threshold must be at least 1 byte")
        if self.read_range_size < 64 * KiB:
            raise ConfigError(f"read_range_size = {fmt_bytes(self.read_range_size)} is too small: give at least 64 KiB")
        if self.read_range_max_size < self.read_range_size:
            raise ConfigError(f"read_range_max_size = {fmt_bytes(self.read_range_max_size)} is below read_range_size = {fmt_bytes(self.read_range_size)}: give at least as much")
        if self.read_concurrency < 1:
            raise ConfigError(f"read_concurrency = {self.read_concurrency}: give at least 1")
        if self.metadata_ttl < 0:
            raise ConfigError(f"metadata_ttl = {self.metadata_ttl} is negative: give a number of seconds >= 0")
        if not 0 < self.cache_low_watermark <= self.cache_high_watermark <= 1:
            raise ConfigError(
                f"cache watermarks low = {self.cache_low_watermark}, high = {self.cache_high_watermark}: "
                "need 0 < cache_low_watermark <= cache_high_watermark <= 1"
            )
        if not S3_MIN_PART_SIZE <= self.copy_multipart_threshold <= S3_MAX_PART_SIZE:
            raise ConfigError(f"copy_multipart_threshold = {fmt_bytes(self.copy_multipart_threshold)}: give 5 MiB to 5 GiB")
        for name in ("retention_keep_last", "retention_keep_every_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} = {getattr(self, name)} is negative: give a count >= 0 (0 turns the rule off)")
        if self.max_parts_in_flight < 1:
            raise ConfigError(f"max_parts_in_flight = {self.max_parts_in_flight}: give at least 1")
        if self.fuse_transport not in ("auto", "kernel", "libfuse"):
            raise ConfigError(f"fuse_transport = {self.fuse_transport!r}: use auto, kernel or libfuse")
        if self.fuse_workers != "auto" and not (self.fuse_workers.isdigit() and 1 <= int(self.fuse_workers) <= 64):
            raise ConfigError(f"fuse_workers = {self.fuse_workers!r}: give auto or a number from 1 to 64")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"log_level = {self.log_level!r}: use debug, info, warning or error")
        if self.metrics_addr:
            parse_hostport(self.metrics_addr)
        if not self.metrics_read_timeout > 0:  # NaN too
            raise ConfigError(f"metrics_read_timeout = {self.metrics_read_timeout}: give a number of seconds > 0")
        if self.ui_enabled and not self.metrics_addr:
            raise ConfigError("ui_enabled = true needs metrics_addr: the catalogue page is served there under /ui")
        for pattern in self.temporary_dir_patterns:
            if not pattern or "/" in pattern:
                raise ConfigError(f"temporary_dir_patterns: {pattern!r} is not a directory name pattern: give fnmatch patterns of one name each, without '/'")
        try:
            compile_patterns(self.checkpoint_patterns)
        except PatternError as e:
            raise ConfigError(f"checkpoint_patterns: {e}") from None
        try:
            Encryption.from_config(self)
        except EncryptionError as e:
            raise ConfigError(str(e)) from None
        if self.ca_bundle and not os.path.isfile(self.ca_bundle):
            raise ConfigError(f"ca_bundle = {self.ca_bundle!r} is not a file: give a PEM file of CA certificates")
        try:
            parse_transitions(self.tier_transitions)
            parse_prices(self.storage_prices)
        except TierError as e:
            raise ConfigError(str(e)) from None
        if self.tier_expiring_delete_days < 0 or self.tier_noncurrent_delete_days < 0 or self.restore_days < 1:
            raise ConfigError("tier_expiring_delete_days and tier_noncurrent_delete_days must be >= 0 and restore_days >= 1: give a number of days")
        if self.restore_tier not in ("Expedited", "Standard", "Bulk"):
            raise ConfigError(f"restore_tier = {self.restore_tier!r}: use Expedited, Standard or Bulk")
        if self.endpoint_url and not re.match(r"https?://[^/]+", self.endpoint_url):
            raise ConfigError(f"endpoint_url = {self.endpoint_url!r} is not an http:// or https:// URL")
        for name in ("replication_interval", "replication_lease_ttl", "replication_read_timeout"):
            if not getattr(self, name) > 0:  # NaN too
                raise ConfigError(f"{name} = {getattr(self, name)}: give a number of seconds > 0")
        if not S3_MIN_PART_SIZE <= self.replication_part_size <= S3_MAX_PART_SIZE:
            raise ConfigError(f"replication_part_size = {fmt_bytes(self.replication_part_size)}: give 5 MiB to 5 GiB")
        if self.replication_parts_in_flight < 1:
            raise ConfigError(f"replication_parts_in_flight = {self.replication_parts_in_flight}: give at least 1")
        if self.tier_move_target and self.tier_move_target not in self.replica:
            known = ", ".join(self.replica) or "none"
            raise ConfigError(f"tier_move_target = {self.tier_move_target!r} names no [replica.{self.tier_move_target}] table "
                              f"(tables: {known}): add one with source = \"s3://BUCKET/PREFIX\" (docs/lifecycle.md)")
        for name in ("tier_move_after", "tier_move_interval"):
            if not getattr(self, name) > 0:  # NaN too
                raise ConfigError(f"{name} = {getattr(self, name)}: give a number of seconds > 0")
        if self.cold_compression not in ("auto", "zstd", "none"):
            raise ConfigError(f"cold_compression = {self.cold_compression!r}: give auto, zstd or none")
        if not 0 <= self.cold_compression_threshold < 1:  # NaN too
            raise ConfigError(f"cold_compression_threshold = {self.cold_compression_threshold}: give a fraction from 0 to below 1 (0.03: 3%)")
        try:
            check_peer_options(self)
        except PeerOptionError as e:
            raise ConfigError(str(e)) from None
        for r in self.replica.values():
            if (r.endpoint_url or "") == (self.endpoint_url or "") and r.bucket == self.bucket and (
                    r.key_prefix.startswith(self.key_prefix) or self.key_prefix.startswith(r.key_prefix)):
                raise ConfigError(f"replica.{r.name}: s3://{r.bucket}/{r.prefix} overlaps the mount's own s3://{self.bucket}/{self.prefix}: "
                                  "give another bucket or a prefix outside the mount's")
            self._check_replica_policy(r)

    def _check_replica_policy(self, r: "Replica") -> None:
        """A replica's own retention may only keep more than the primary's: one line naming the rule otherwise."""
        if not r.own_policy:
            return
        if not (self.retention_keep_last or self.retention_keep_every_steps or self.retention_keep_every_seconds):
            raise ConfigError(f"[replica.{r.name}] {r.own_policy}: the primary's retention keeps every checkpoint (no retention_keep_* "
                              f"rule), and so does the replica: remove the replica's keep_* keys, or give the primary a retention policy")
        mine, primary = r.keep_last, self.retention_keep_last
        if mine and primary and mine < primary:
            raise ConfigError(f"[replica.{r.name}] keep_last = {mine} keeps fewer than the primary's retention_keep_last = {primary}: "
                              f"a replica keeps at least what the primary keeps: give keep_last >= {primary}, or leave it out")
        mine, primary = r.keep_every_steps, self.retention_keep_every_steps
        if mine and primary and primary % mine:
            raise ConfigError(f"[replica.{r.name}] keep_every_steps = {mine} would not keep every checkpoint the primary's "
                              f"retention_keep_every_steps = {primary} keeps: give a divisor of {primary}, or leave it out")
        mine_s, primary_s = r.keep_every_seconds, self.retention_keep_every_seconds
        if mine_s and primary_s and mine_s > primary_s:
            raise ConfigError(f"[replica.{r.name}] keep_every_seconds = {mine_s:g} keeps fewer than the primary's "
                              f"retention_keep_every_seconds = {primary_s:g}: give at most {primary_s:g}, or leave it out")


# -------------------------------------------------------------------- replicas
REPLICA_FIELDS = {
    "source": "`s3://BUCKET[/PREFIX]` on the target: where the copies go (required). The mount's tree is copied below PREFIX as it is below the mount's prefix.",
    "endpoint_url": "The target's S3 endpoint; empty: the mount's own (whether it came from the file, the environment or `--endpoint-url`). When it is the mount's own endpoint, objects are copied inside the store (CopyObject, UploadPartCopy above 5 GiB); otherwise streamed (GET, multipart PUT).",
    "region": "Region for request signing (default: the mount's `region`).",
    "profile": "AWS profile with the target's credentials; empty for the standard chain (environment, ~/.aws, instance role). Credentials are never logged.",
    "select": "Which committed checkpoints go there: `all`, `protected` (golden only) or `every:K` (steps that are multiples of K). Protected checkpoints go to every target whatever this says.",
    "keep_last": "The replica's own, longer retention (optional; by default a replica keeps what the primary keeps): also keep the newest N committed checkpoints of each directory of checkpoints on the replica after the primary's retention deleted them. At least the primary's `retention_keep_last`.",
    "keep_every_steps": "Own retention: also keep every checkpoint whose step is a multiple of K. Must divide the primary's `retention_keep_every_steps` (so it keeps every milestone the primary keeps).",
    "keep_every_seconds": "Own retention: also keep one checkpoint per this many seconds of commit time. At most the primary's `retention_keep_every_seconds`.",
}
REPLICA_POLICY = ("keep_last", "keep_every_steps", "keep_every_seconds")  # mirror retention_keep_*
_REPLICA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_SELECT = re.compile(r"all|protected|every:([1-9][0-9]*)")


@dataclass
class Replica:
    """One `[replica.NAME]` table: a second store that committed checkpoints are copied to."""

    name: str
    bucket: str
    prefix: str = ""
    endpoint_url: str = ""
    region: str = "us-east-1"
    profile: str = ""
    select: str = "all"
    keep_last: int = 0  # the replica's own retention (0: off); see REPLICA_FIELDS
    keep_every_steps: int = 0
    keep_every_seconds: float = 0.0

    @property
    def own_policy(self) -> str | None:
        """The replica's own retention rules in words, or None if it only follows the primary."""
        rules = [f"{k} = {getattr(self, k):g}" for k in REPLICA_POLICY if getattr(self, k)]
        return ", ".join(rules) or None

    @property
    def key_prefix(self) -> str:
        p = self.prefix.strip("/")
        return f"{p}/" if p else ""

    @property
    def every(self) -> int | None:
        """K of `every:K`, else None."""
        m = _SELECT.fullmatch(self.select)
        return int(m.group(1)) if m and m.group(1) else None

    def wants(self, step: int, protected: bool) -> bool:
        """Whether a committed checkpoint at `step` goes to this target."""
        if protected or self.select == "all":
            return True
        k = self.every
        return k is not None and step % k == 0

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean NAME?)' for the closest known name to a mistyped one, or ''."""
    close = difflib.get_close_matches(name.replace("-", "_").lower(), list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def parse_replicas(data: Any, origin: str) -> dict[str, Replica]:
    """`[replica.NAME]` tables -> {NAME: Replica}; one ConfigError line per problem."""
    if not isinstance(data, dict):
        raise ConfigError(f"replica in {origin} must be tables [replica.NAME], one per target")
    out: dict[str, Replica] = {}
    for name, table in data.items():
        if not _REPLICA_NAME.fullmatch(name):
            raise ConfigError(f"[replica.{name}] in {origin}: a target name is letters, digits, '.', '_' and '-'")
        if not isinstance(table, dict):
            raise ConfigError(f"replica.{name} in {origin} must be a table [replica.{name}] with source = \"s3://BUCKET/PREFIX\"")
        unknown = sorted(set(table) - set(REPLICA_FIELDS))
        if unknown:
            raise ConfigError(f"[replica.{name}] in {origin}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], REPLICA_FIELDS)}: "
                              f"the keys are {', '.join(REPLICA_FIELDS)}")
        policy: dict[str, Any] = {}
        for key, value in table.items():
            if key in REPLICA_POLICY:
                kind = float if key == "keep_every_seconds" else int
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value \
                        or (kind is int and not float(value).is_integer()):
                    raise ConfigError(f"[replica.{name}] {key} = {value!r} in {origin}: give a whole number >= 0"
                                      if kind is int else f"[replica.{name}] {key} = {value!r} in {origin}: give a number of seconds >= 0")
                policy[key] = kind(value)
            elif not isinstance(value, str):
                raise ConfigError(f"[replica.{name}] {key} = {value!r} in {origin}: give a string")
        if "source" not in table:
            raise ConfigError(f"[replica.{name}] in {origin} has no source: add source = \"s3://BUCKET/PREFIX\"")
        try:
            bucket, prefix = parse_source(table["source"])
        except ConfigError as e:
            raise ConfigError(f"[replica.{name}] {e}") from None
        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-_]{1,254}", bucket):
            raise ConfigError(f"[replica.{name}] bucket name {bucket!r} is not a valid S3 bucket name")
        endpoint = table.get("endpoint_url", "")
        if endpoint and not re.match(r"https?://[^/]+", endpoint):
            raise ConfigError(f"[replica.{name}] endpoint_url = {endpoint!r} is not an http:// or https:// URL")
        select = table.get("select", "all").strip()
        if not _SELECT.fullmatch(select):
            raise ConfigError(f"[replica.{name}] select = {select!r}: use all, protected or every:K (K a positive step count)")
        out[name] = Replica(name, bucket, prefix, endpoint, table.get("region", ""),  # "": the mount's (load_config)
                            table.get("profile", ""), select, **policy)
    return out


# ---------------------------------------------------------------------- values
_SIZE_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}
_SIZE_HINT = "give a whole number of bytes or a size with a unit, like '800M', '64MiB' or '1.5GiB'"


def parse_size(value: Any, name: str = "size") -> int:
    """Bytes from an int or a string like '64MiB', '1.5G', '800M', '4096'. Binary units (K = 1024).

    A plain number is a count of bytes and must be whole: `1.5` is refused, not read as 1 byte.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name} = {value!r} is not a size: {_SIZE_HINT}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ConfigError(f"{name} = {value!r} is not a whole number of bytes: {_SIZE_HINT}")
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(f"{name} = {value!r} is not a size: {_SIZE_HINT}")
    number, unit = m.group(1), (m.group(2) or "").upper()[:1]
    if unit in ("", "B") and "." in number:
        raise ConfigError(f"{name} = {value!r} is not a whole number of bytes: {_SIZE_HINT}")
    if unit in ("", "B"):
        return int(number)
    return int(float(number) * _UNITS[unit])


def auto_min_free(fs_size: int) -> int:
    """The default `cache_min_free` for a cache file system of `fs_size` bytes: 5%, at most 1 GiB."""
    return min(GiB, fs_size * AUTO_MIN_FREE_PERCENT // 100)


def parse_hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ConfigError(f"metrics_addr = {value!r} is not HOST:PORT (for example 127.0.0.1:9464)")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_source(source: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix)."""
    m = re.fullmatch(r"s3://([^/]+)(?:/(.*))?", source.strip())
    if not m:
        raise ConfigError(f"source {source!r} is not of the form s3://BUCKET[/PREFIX]")
    prefix = (m.group(2) or "").strip("/")
    check_prefix(prefix, source.strip())
    return m.group(1), prefix


def check_prefix(prefix: str, source: str = "") -> None:
    """A prefix is a path of names: `.`, `..` or empty components (`a//b`) would make keys no path maps to."""
    parts = prefix.strip("/").split("/") if prefix.strip("/") else []
    bad = next((p for p in parts if p in ("", ".", "..")), None)
    if bad is not None:
        what = f"source {source!r}" if source else f"prefix {prefix!r}"
        shown = "an empty component ('//')" if bad == "" else f"a {bad!r} component"
        raise ConfigError(f"{what} has {shown}: give the prefix as names separated by single '/', like s3://BUCKET/runs/llama")
    if len(prefix.encode()) + 2 > S3_MAX_KEY_BYTES:
        raise ConfigError(f"prefix is {len(prefix.encode())} bytes: object keys are at most {S3_MAX_KEY_BYTES} bytes, give a shorter prefix")


def _coerce(f: dataclasses.Field, value: Any, origin: str) -> Any:
    name = f.name
    ftype = f.type if isinstance(f.type, str) else f.type.__name__
    if f.metadata.get("kind") == "table":
        raise ConfigError(f"{name} in {origin}: replica targets are given only as [replica.NAME] tables in the TOML file")
    try:
        if f.default is None and (value is None or str(value).strip().lower() in ("", "auto")):
            return None  # an option whose default depends on the machine
        if f.metadata.get("kind") == "bytes":
            return parse_size(value, name)
        if ftype == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if ftype == "int":
            if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if ftype == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if ftype.startswith("list"):
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return list(value)
            raise ValueError
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ValueError
        return str(value)
    except ConfigError:
        raise
    except (ValueError, TypeError):
        raise ConfigError(f"{name} = {value!r} in {origin} is not a valid {ftype}") from None


FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def load_config(
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults < TOML file < CKPTFS_* environment < overrides (CLI flags)."""
    values: dict[str, Any] = {}
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file {config_file} does not exist: check the path given to --config")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {config_file} is not valid TOML: {e}") from None
        except OSError as e:
            raise ConfigError(f"config file {config_file} cannot be read: {e.strerror}") from None
        if "source" in data:
            data["bucket"], data["prefix"] = parse_source(str(data.pop("source")))
        if "replica" in data:
            values["replica"] = parse_replicas(data.pop("replica"), config_file)
        for key, value in data.items():
            if key not in FIELDS:
                raise ConfigError(f"unknown option {key!r} in {config_file}{did_you_mean(key, FIELDS)}: see docs/configuration.md for the valid names")
            values[key] = _coerce(FIELDS[key], value, config_file)
    env = os.environ if environ is None else environ
    for name, f in FIELDS.items():
        var = f"CKPTFS_{name.upper()}"
        if var in env:
            values[name] = _coerce(f, env[var], f"environment variable {var}")
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in FIELDS:
            raise ConfigError(f"unknown option {key!r}{did_you_mean(key, FIELDS)}: see docs/configuration.md for the valid names")
        values[key] = _coerce(FIELDS[key], value, "the command line")
    cfg = Config(**values)
    # a target without endpoint_url (or region) is on the mount's own endpoint (region), however that was given
    # (TOML, environment or --endpoint-url): left empty, boto3 would send its requests to AWS
    cfg.replica = {name: dataclasses.replace(r, endpoint_url=r.endpoint_url or cfg.endpoint_url, region=r.region or cfg.region)
                   for name, r in cfg.replica.items()}
    cfg.validate()
    return cfg


def markdown_reference() -> str:
    """The configuration reference, generated from `Config` itself."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by `python -m ckptfs.config --markdown`; do not edit by hand -->",
        "",
        "Options come from, lowest precedence first: the defaults below, the TOML file given",
        "with `--config`, environment variables `CKPTFS_<NAME>`, and command-line flags.",
        "Sizes accept a whole number of bytes or strings with binary units (`\"64MiB\"`, `\"1G\"`,",
        "`\"1.5GiB\"`, `\"800M\"`; K, M, G, T are powers of 1024); anything else is refused. In the TOML",
        "file, `source = \"s3://bucket/prefix\"` may stand for `bucket` and `prefix`.",
        "",
        "| option | environment | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for name, f in FIELDS.items():
        if f.metadata.get("kind") == "table":
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if default is None:
            shown = "auto"
        elif f.metadata.get("kind") == "bytes" and default:
            shown = f"{default} ({fmt_bytes(default)})"
        elif isinstance(default, list):
            shown = ", ".join(f"`{d}`" for d in default)
        else:
            shown = f"`{default!r}`" if default != "" else "(empty)"
        unit = f.metadata.get("kind")
        unit = f" ({unit})" if unit else ""
        lines.append(f"| `{name}`{unit} | `CKPTFS_{name.upper()}` | {shown} | {f.metadata['help']} |")
    lines += [
        "",
        "## Replica targets",
        "",
        "Each `[replica.NAME]` table in the TOML file is one target that committed checkpoints are",
        "copied to (docs/replication.md). They can be given only in the file, not in the environment or with `-o`.",
        "",
        "```toml",
        "[replica.dr]",
        'source = "s3://ckpt-dr/runs/llama"',
        'endpoint_url = "https://s3.other-region.example"',
        'profile = "dr"',
        'select = "every:1000"',
        "keep_last = 20          # optional: keep more than the primary does (its own retention)",
        "```",
        "",
        "By default a replica keeps what the primary keeps, deleting a copy only once the primary's retention",
        "deleted the checkpoint (after `retention_grace`). The `keep_*` keys give it its own, longer retention",
        "on top of that; one that would delete what the primary keeps is refused when the config is loaded.",
        "",
        "| key | meaning |",
        "| --- | --- |",
    ]
    lines += [f"| `{k}` | {v} |" for k, v in REPLICA_FIELDS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(markdown_reference())
    else:
        sys.exit("usage: python -m ckptfs.config --markdown")
