"""The sender's CPU per GiB replicated over loopback (issue 36's budget: 0.3 s), in two processes so the
receiver's CPU is not counted: `python -m tests.support.peers_transport_cpu [GiB] [rounds]`.

The cache file and the receiver's cache directory are on /dev/shm. `--mode copy` sends the same bytes
read through Python, `--mode blake2b` also MACs them (what a data MAC would cost), for comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import trio
import xxhash

from ckptfs.peers.link import PeerLink
from ckptfs.peers.listener import Listener
from ckptfs.peers.replicas import ReplicaStore
from ckptfs.peers.wire import Kind

SECRET = b"x" * 40
GiB = 1 << 30
CHUNK = 64 << 20


def config(capacity: int) -> SimpleNamespace:
    return SimpleNamespace(peer_addr="127.0.0.1:0", peer_timeout=60.0, peer_capacity=capacity, cache_min_free=0)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def receive(cache_dir: str, capacity: int) -> None:
    """The peer: serve until stdin closes, then print its CPU per GiB received."""
    start = cpu()
    store = ReplicaStore(config(capacity), cache_dir)
    listener = Listener(config(capacity), store, SECRET, "b")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(listener.run)
        print(port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()
    print(f"receiver: {(cpu() - start) * GiB / max(1, listener.bytes_received):.3f} s CPU per GiB (seal's hash included)")


async def send(port: int, src: str, mode: str, rounds: int) -> None:
    size = os.path.getsize(src)
    link = await PeerLink.open(config(0), "a", "i", "b", f"127.0.0.1:{port}", SECRET)
    fd = os.open(src, os.O_RDONLY)
    with open(src, "rb") as f:
        digest = xxhash.xxh3_128_hexdigest(f.read())
    for r in range(rounds):
        await link.entry(r, {"key": f"k{r}", "version": 1, "size": size, "seq": r})
        c0, t0 = cpu(), time.monotonic()
        for offset in range(0, size, CHUNK):
            n = min(CHUNK, size - offset)
            if mode == "sendfile":
                await link.write(r, fd, offset, n)
                continue
            mac = hashlib.blake2b(key=b"k" * 32, digest_size=16) if mode == "blake2b" else None
            async with link._send_lock:  # what PeerLink would do were the bytes to pass through Python
                await link.stream.send_all(link.session.encode(Kind.WRITE, {"ino": r, "offset": offset}, n))
                p = offset
                while p < offset + n:
                    data = os.pread(fd, 1 << 20, p)
                    if mac is not None:
                        mac.update(data)
                    await link.stream.send_all(data)
                    p += len(data)
        await link.seal(r, 1, size, digest)
        c1, t1 = cpu(), time.monotonic()
        print(f"{mode}: sender {(c1 - c0) * GiB / size:.3f} s CPU per GiB, {size / (t1 - t0) / GiB:.2f} GiB/s (seal included)")
        await link.forget(r, None)
        await link.barrier()
    os.close(fd)
    await link.aclose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gib", type=int, nargs="?", default=1)
    ap.add_argument("rounds", type=int, nargs="?", default=3)
    ap.add_argument("--mode", choices=("sendfile", "copy", "blake2b"), default="sendfile")
    ap.add_argument("--receive", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.receive:
        trio.run(receive, args.receive[0], int(args.receive[1]))
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        src = os.path.join(d, "cache-file")
        with open(src, "wb") as f:
            for _ in range(args.gib * 1024):
                f.write(os.urandom(1 << 20))
        os.mkdir(os.path.join(d, "peer"))
        peer = subprocess.Popen([sys.executable, "-m", "tests.support.peers_transport_cpu", "--receive",
                                 os.path.join(d, "peer"), str(2 * args.gib * GiB)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert peer.stdout is not None and peer.stdin is not None
        port = int(peer.stdout.readline())
        try:
            trio.run(send, port, src, args.mode, args.rounds)
        finally:
            peer.stdin.close()
            print(peer.stdout.read().strip())
            peer.wait()


if __name__ == "__main__":
    main()
