"""The floor of acknowledging on a peer on this machine: no ckptfs, no FUSE, no framing, no Python between the bytes.

Why: the peers figure `peers_ack_single` / `peers_ack_writers` is local / peer for write + fsync + close,
with both nodes on this machine's cores. This measures, in the same run, the best any design could do here:
each writer process writes its file on tmpfs (as a passthrough mount does) while a thread of the same process
streams what is written with `os.sendfile` to a separate receiving process (the peer), which `recv_into`s
and `pwrite`s it into its own tmpfs file; the writer's fsync returns when the receiver has every byte and
answered. With `checks`, the two hashes the design needs are added: the receiver hashes (xxh3-128 and BLAKE3) what
arrives, and the sender reads its file back and hashes it at the seal (under passthrough the kernel may have
rewritten bytes it already sent), and the receiver compares.

floor / plain (the same writers with no peer) is the highest local / peer ratio possible here: where it is
under a target, no implementation reaches that target on this machine.

`python -m bench.peerfloor [--size-mib N]` prints the figures; bench/peers.py runs it in its own run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ckptfs.peers.sealhash import SealHash

from bench import writer
from bench.env import MiB, ROOT, run_writers

HEADER = 8  # the file's size, then its bytes, then (with checks) its seal digests
DIGEST = 32 + 64  # the seal digests, hex: xxh3-128 and BLAKE3-256
BUFFER = 1 << 20
CHECKS = {"none": False, "hashed": True}


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError("the sender closed early")
        out += got
    return bytes(out)


def _packed(h: SealHash) -> bytes:
    """The seal's two digests as the design sends them (xxh3-128 and BLAKE3-256, hex): DIGEST bytes."""
    d = h.digest()
    return (d.xxh3 + d.blake3).encode()


def _serve_one(conn: socket.socket, path: str, checks: bool) -> None:
    with conn:
        size = int.from_bytes(_recv_exactly(conn, HEADER), "little")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            h = SealHash()
            buf = bytearray(BUFFER)
            view = memoryview(buf)
            done = 0
            while done < size:
                n = conn.recv_into(view[:min(BUFFER, size - done)])
                if not n:
                    raise ConnectionError("the sender closed early")
                if checks:
                    h.update(view[:n])
                os.pwrite(fd, view[:n], done)
                done += n
            ok = True
            if checks:
                ok = _recv_exactly(conn, DIGEST) == _packed(h)
            os.fsync(fd)
        finally:
            os.close(fd)
        conn.sendall(b"k" if ok else b"x")


def receive(directory: str, checks: bool) -> int:
    """The peer: accept connections until stdin closes, each file into `directory`, answered once all of it is in."""
    srv = socket.create_server(("127.0.0.1", 0))
    print(srv.getsockname()[1], flush=True)
    threads = []
    srv.settimeout(0.2)
    count = 0
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        t = threading.Thread(target=_serve_one, args=(conn, os.path.join(directory, f"r{count}"), checks))
        count += 1
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return 0


def write_replicated(path: str, size: int, chunk: int, port: int, checks: bool) -> dict[str, float]:
    """Write + fsync + close `path` as bench/writer.py does, the fsync waiting for the peer to hold every byte."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(size.to_bytes(HEADER, "little"))
    buf = writer.chunk_buffer(size, chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    rfd = os.open(path, os.O_RDONLY)
    failed: list[BaseException] = []

    def stream() -> None:  # what the owner's sender does: send what the kernel has written, as it is written
        sent = 0
        try:
            while sent < size:
                have = os.fstat(rfd).st_size
                if have > sent:
                    sent += os.sendfile(sock.fileno(), rfd, sent, have - sent)
                else:
                    time.sleep(0.001)
        except BaseException as e:  # noqa: BLE001 - reported by the writer
            failed.append(e)

    started = time.monotonic()
    sender = threading.Thread(target=stream)
    sender.start()
    try:
        writer.write_stamped(fd, size, buf)
        written = time.monotonic()
        os.fsync(fd)
        sender.join()
        if failed:
            raise failed[0]
        if checks:  # the seal: the file read back and hashed, the peer compares
            h = SealHash()
            read = bytearray(BUFFER)
            rview = memoryview(read)
            pos = 0
            while pos < size:
                n = os.preadv(rfd, [rview[:min(BUFFER, size - pos)]], pos)
                h.update(rview[:n])
                pos += n
            sock.sendall(_packed(h))
        if _recv_exactly(sock, 1) != b"k":
            raise RuntimeError("the peer's copy differs")
        fsynced = time.monotonic()
    finally:
        os.close(fd)
        os.close(rfd)
        sock.close()
    closed = time.monotonic()
    return {"started": started, "written": written, "fsynced": fsynced, "closed": closed}


def floor(root: Path, size: int, writers: int, chunk: int) -> dict[str, Any]:
    """plain (no peer), then the floor with no checks and with the hashes, each for 1 file and `writers` at once."""
    out: dict[str, Any] = {}
    for part, count, each in (("single", 1, size), ("writers", writers, size // writers)):
        d = root / part
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        plain = run_writers([d / f"p{i}" for i in range(count)], each, chunk).ack_seconds
        shutil.rmtree(d)
        row: dict[str, Any] = {"plain_s": plain}
        for name, checks in CHECKS.items():
            d.mkdir(parents=True)
            (d / "peer").mkdir()
            peer = subprocess.Popen([sys.executable, "-m", "bench.peerfloor", "receive", str(d / "peer"), name],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            try:
                assert peer.stdout is not None and peer.stdin is not None
                port = int(peer.stdout.readline())
                row[f"{name}_s"] = run_writers([d / f"w{i}" for i in range(count)], each, chunk, ("-m", "bench.peerfloor", "write"),
                                               (str(port), name)).ack_seconds
                peer.stdin.close()
                peer.wait(timeout=60)
            finally:
                if peer.poll() is None:
                    peer.kill()
                    peer.wait()
            shutil.rmtree(d)
            row[f"ratio_{name}"] = plain / row[f"{name}_s"]
        out[part] = row
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["receive"]:
        return receive(argv[1], CHECKS[argv[2]])
    if argv[:1] == ["write"]:
        path, size, chunk, port, checks = argv[1], int(argv[2]), int(argv[3]), int(argv[4]), CHECKS[argv[5]]
        print("ready", flush=True)
        if not sys.stdin.readline():
            return 1
        try:
            result: dict[str, object] = dict(write_replicated(path, size, chunk, port, checks))
        except (OSError, RuntimeError) as e:
            result = {"error": f"{path}: {e}"}
        print(json.dumps(result), flush=True)
        return 0 if "error" not in result else 1
    p = argparse.ArgumentParser(prog="python -m bench.peerfloor", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024)
    args = p.parse_args(argv)
    root = Path("/dev/shm") / f"ckptfs-peerfloor-{os.getpid()}"
    try:
        print(json.dumps(floor(root, args.size_mib * MiB, 4, 4 * MiB), indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
