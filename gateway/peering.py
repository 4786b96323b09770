"""What the peer options mean (docs/peers.md): names, addresses, the static list, their checks.

A leaf: `config` validates the options with it, and the peers package (membership, the listener)
reads the same parsed values, so an address or a list entry means one thing everywhere. The checks
that look at files (the secret's mode and length) are here too: a mount refused for a secret anyone
can read is refused before anything starts, with one line.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import stat
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DURABILITY_LEVELS = ("local", "peer")
ON_NO_PEER = ("degrade", "fail")
# what `ckptfs flush --level` and `ckptfs.wait_durable(level=)` wait for: in the bucket, or on peer_replicas peers' disks
# too (durability = peer; a durable file counts as replicated)
FLUSH_LEVELS = ("durable", "replicated")
SECRET_MIN_BYTES = 32
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class PeerOptionError(Exception):
    """A peer option a user got wrong; the message is one line naming the option and the fix."""


@dataclass(frozen=True)
class StaticPeer:
    """One entry of the `peers` option."""

    name: str
    host: str
    port: int
    failure_domain: str = ""

    @property
    def addr(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def node_name_of(cfg: Any) -> str:
    """This node's name: `node_name`, or the host name."""
    return cfg.node_name or socket.gethostname()


def parse_addr(value: str, option: str = "peer_addr") -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets) -> (host, port); one line naming `option` otherwise."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise PeerOptionError(f"{option} = {value!r} is not HOST:PORT (for example 10.0.0.5:7470, or 127.0.0.1:0 for any free port)")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_peer(entry: str) -> StaticPeer:
    """`NAME=HOST:PORT[@DOMAIN]` -> StaticPeer."""
    name, sep, rest = entry.partition("=")
    if not sep or not NODE_NAME.fullmatch(name.strip()):
        raise PeerOptionError(f"peers: {entry!r} is not NAME=HOST:PORT (optionally @DOMAIN), for example node-b=10.0.0.6:7470@rack2")
    addr, _, domain = rest.partition("@")
    host, port = parse_addr(addr.strip(), "peers")
    if port == 0:
        raise PeerOptionError(f"peers: {entry!r} has port 0: give the port that node's peer_addr listens on")
    return StaticPeer(name.strip(), host, port, domain.strip())


def read_secret(path: str) -> bytes:
    """The shared secret in `path`, after the checks a key file gets (owner only, long enough).

    The checks are of the file actually read: they are made with fstat on the open descriptor, never on the name
    before opening it (a name swapped in between would pass the checks with one file and be read from another). The
    name itself is opened without following a symbolic link; a link is followed once, to its target, only when it is
    the mounting user's or root's (a Kubernetes secret volume's names are root's links into `..data/`), and that
    target is opened the same way. O_NONBLOCK: a FIFO put there answers at once instead of hanging the mount."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    fail = f"give a file of at least {SECRET_MIN_BYTES} random bytes, chmod 600"
    try:
        try:
            fd = os.open(path, flags)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            link = os.lstat(path)
            if link.st_uid not in (os.geteuid(), 0):
                raise PeerOptionError(f"peer_secret_file = {path!r} is a symbolic link owned by uid {link.st_uid}: give the "
                                      "file itself, or a link of the mounting user's or root's") from None
            fd = os.open(os.path.realpath(path), flags)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise PeerOptionError(f"peer_secret_file = {path!r} is not a regular file: {fail}")
            secret = os.read(fd, 1 << 16).strip()
        finally:
            os.close(fd)
    except OSError as e:
        raise PeerOptionError(f"peer_secret_file = {path!r} cannot be read ({e.strerror}): {fail}") from None
    if st.st_mode & 0o077:
        raise PeerOptionError(f"peer_secret_file = {path!r} can be read by others (mode {stat.S_IMODE(st.st_mode):o}): chmod 600 {path}")
    if st.st_uid != os.geteuid():
        raise PeerOptionError(f"peer_secret_file = {path!r} is owned by uid {st.st_uid}, not the mounting user: chown it to uid {os.geteuid()}")
    if len(secret) < SECRET_MIN_BYTES:
        raise PeerOptionError(f"peer_secret_file = {path!r} holds {len(secret)} bytes: give at least {SECRET_MIN_BYTES} random bytes "
                              f"(head -c 48 /dev/urandom | base64 > {path}; chmod 600 {path})")
    return secret


def parse_etcd_endpoints(value: str) -> list[tuple[str, str, int]]:
    """`etcd_endpoints` (comma-separated http(s)://HOST:PORT URLs) -> [(scheme, host, port)]; one line otherwise."""
    out = []
    for url in (u.strip() for u in value.split(",")):
        if not url:
            continue
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None or parts.path.strip("/"):
            raise PeerOptionError(f"etcd_endpoints: {url!r} is not http://HOST:PORT (for example http://10.0.0.5:2379; "
                                  "several comma-separated)")
        out.append((parts.scheme, parts.hostname, port))
    if not out:
        raise PeerOptionError("peer_membership = etcd needs etcd_endpoints: the etcd cluster's client URLs, comma-separated "
                              "(for example http://10.0.0.5:2379)")
    return out


def peer_warnings(cfg: Any) -> list[str]:
    """What a mount's peer options leave unsafe though valid: one line each, naming the option to change (`ckptfs
    mount` prints them, the daemon logs them)."""
    if cfg.durability != "peer":
        return []
    out = []
    if cfg.peer_replicas == 1 and not cfg.failure_domain:
        out.append("durability = peer with peer_replicas = 1 and no failure_domain: a file's one other copy may go to a node "
                   "in this node's rack or on its power feed, and losing that loses both; set failure_domain (the same "
                   "on every node of a rack) or peer_replicas = 2 (docs/peers.md)")
    return out


def check_peer_options(cfg: Any) -> None:
    """Every peer option's check; raises PeerOptionError with one line."""
    if cfg.durability not in DURABILITY_LEVELS:
        raise PeerOptionError(f"durability = {cfg.durability!r}: use local or peer")
    if cfg.on_no_peer not in ON_NO_PEER:
        raise PeerOptionError(f"on_no_peer = {cfg.on_no_peer!r}: use degrade or fail")
    if cfg.node_name and not NODE_NAME.fullmatch(cfg.node_name):
        raise PeerOptionError(f"node_name = {cfg.node_name!r}: give letters, digits, '.', '_' or '-' (at most 63), starting with a letter or digit")
    if getattr(cfg, "peer_encryption", "none") not in ("none", "aes-gcm"):
        raise PeerOptionError(f"peer_encryption = {cfg.peer_encryption!r}: use none or aes-gcm (the same on every node)")
    if getattr(cfg, "peer_membership", "bucket") not in ("bucket", "etcd"):
        raise PeerOptionError(f"peer_membership = {cfg.peer_membership!r}: use bucket or etcd (the same on every node)")
    if getattr(cfg, "peer_membership", "bucket") == "etcd":
        parse_etcd_endpoints(cfg.etcd_endpoints)
        if not cfg.etcd_prefix.startswith("/") or not cfg.etcd_prefix.endswith("/"):
            raise PeerOptionError(f"etcd_prefix = {cfg.etcd_prefix!r}: give a key prefix that starts and ends with '/' "
                                  "(default /ckptfs/)")
    if cfg.peer_replicas < 1:
        raise PeerOptionError(f"peer_replicas = {cfg.peer_replicas}: give at least 1")
    for name in ("peer_timeout", "peer_lease_ttl", "peer_drop_grace"):
        if not getattr(cfg, name) > 0:  # NaN too
            raise PeerOptionError(f"{name} = {getattr(cfg, name)}: give a number of seconds > 0")
    for name in ("peer_capacity", "peer_max_bandwidth"):
        if getattr(cfg, name) < 0:
            raise PeerOptionError(f"{name} = {getattr(cfg, name)} is negative: give bytes >= 0 (0: {'automatic' if name == 'peer_capacity' else 'no cap'})")
    if cfg.failure_domain and not NODE_NAME.fullmatch(cfg.failure_domain):
        raise PeerOptionError(f"failure_domain = {cfg.failure_domain!r}: give letters, digits, '.', '_' or '-' (at most 63)")
    names = [parse_peer(p).name for p in cfg.peers]
    if len(set(names)) != len(names):
        raise PeerOptionError(f"peers: a node is named twice ({', '.join(sorted({n for n in names if names.count(n) > 1}))}): give each node once")
    if cfg.durability != "peer":
        return
    if not cfg.peer_addr:
        raise PeerOptionError("durability = peer needs peer_addr: the HOST:PORT other nodes reach this one on (docs/peers.md)")
    host, _ = parse_addr(cfg.peer_addr)
    if not cfg.peer_secret_file:
        where = "" if is_loopback(host) else f" (peer_addr {cfg.peer_addr} is not a loopback address: unauthenticated replication is refused)"
        raise PeerOptionError(f"durability = peer needs peer_secret_file{where}: give a file of at least {SECRET_MIN_BYTES} random bytes, chmod 600, the same on every node")
    read_secret(cfg.peer_secret_file)
    if getattr(cfg, "peer_secret_previous_file", ""):
        read_secret(cfg.peer_secret_previous_file)
