"""Not a test (not collected): measures A's daemon CPU per GiB replicated under durability = peer.
Run: .venv/bin/python -m pytest -q -s tests/integration/measure_peer_cpu.py -k kernel   (ROUNDS=3, PERF_DATA=path)
Two daemons of one bucket as tests/integration/test_peers_replicate.py starts them, caches on /dev/shm; each round
writes, fsyncs and closes 1 GiB on a; A's and B's utime+stime from /proc/PID/stat before and after.
`.venv/bin/python -m tests.integration.measure_peer_cpu` instead: the floor, a plain sendfile loop of 1 GiB from /dev/shm to a
separate receiving process, and xxh3-128 of 1 GiB read through buffers of a few sizes."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.integration.test_peers_replicate import peer_options

GIB = 1 << 30
ROUNDS = int(os.environ.get("ROUNDS", "3"))


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="peercpu-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_measure(make_mount: Any, tmp_path: Path) -> None:
    b = make_mount("b", **peer_options(tmp_path, "b"))
    a = make_mount("a", **peer_options(tmp_path, "a", on_no_peer="fail", upload_delay=3600))
    pid = a.status()["pid"]
    bpid = b.status()["pid"]
    block = os.urandom(8 << 20)
    spy = None
    if os.environ.get("PERF_DATA"):  # a kernel+native profile of A's daemon over the rounds: perf report -i PERF_DATA
        import subprocess
        spy = subprocess.Popen(["perf", "record", "-g", "-F", "999", "-p", str(pid), "-o", os.environ["PERF_DATA"]],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import time
        time.sleep(1)
    per: list[float] = []
    bper: list[float] = []
    for r in range(ROUNDS):
        path = a.path / f"r{r}.bin"
        c0, b0 = cpu_s(pid), cpu_s(bpid)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        for _ in range(GIB // len(block)):
            os.write(fd, block)
        os.fsync(fd)
        os.close(fd)
        per.append(cpu_s(pid) - c0)
        bper.append(cpu_s(bpid) - b0)
        assert os.getxattr(path, "user.ckptfs.state") == b"replicated"
        os.unlink(path)
    if spy is not None:
        import signal
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    print(f"\nA cpu s/GiB: {[round(x, 3) for x in per]} median {statistics.median(per):.3f}"
          f" spread {max(per) - min(per):.3f}; B: {[round(x, 3) for x in bper]}")


def floor() -> None:
    import resource
    import select
    import socket
    import subprocess
    import sys

    import xxhash

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    path = "/dev/shm/peercpu-floor"
    with open(path, "wb") as f:
        block = os.urandom(8 << 20)
        for _ in range(GIB // len(block)):
            f.write(block)
    receiver = ("import socket,os\ns=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1); print(s.getsockname()[1], flush=True)\n"
                "c,_=s.accept(); buf=bytearray(1<<20)\nwhile c.recv_into(buf): pass\n")
    try:
        sent = []
        for _ in range(ROUNDS):
            p = subprocess.Popen([sys.executable, "-c", receiver], stdout=subprocess.PIPE, text=True)
            assert p.stdout is not None
            s = socket.create_connection(("127.0.0.1", int(p.stdout.readline())))
            s.setblocking(False)
            poller = select.poll()
            poller.register(s.fileno(), select.POLLOUT)
            fd = os.open(path, os.O_RDONLY)
            c, off = cpu(), 0
            while off < GIB:
                try:
                    off += os.sendfile(s.fileno(), fd, off, min(8 << 20, GIB - off))
                except BlockingIOError:
                    poller.poll(1000)
            sent.append(cpu() - c)
            s.close()
            os.close(fd)
            p.wait()
        print(f"plain sendfile to another process, s/GiB: {[round(x, 3) for x in sent]}")
        for size in (16 << 20, 1 << 20):
            took = []
            for _ in range(ROUNDS):
                c = cpu()
                h, buf = xxhash.xxh3_128(), bytearray(size)
                view = memoryview(buf)
                with open(path, "rb", buffering=0) as f:
                    while n := f.readinto(buf):
                        h.update(view[:n])
                took.append(cpu() - c)
            print(f"xxh3-128 read through {size >> 20} MiB, s/GiB: {[round(x, 3) for x in took]}")
    finally:
        os.unlink(path)


if __name__ == "__main__":
    floor()
