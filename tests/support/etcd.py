"""Run a real etcd (Debian's `etcd-server`) for the tests of `peer_membership = etcd`, like SeaweedFS for S3.

One member on 127.0.0.1, its client and peer ports picked at start, a data directory of its own that `stop()`
removes. `pause()`/`resume()` stop and continue the process (an etcd that does not answer: the nodes' renewals
time out, as a partitioned etcd would make them).
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.extras import required
from tests.support.seaweed import free_port

READY_TIMEOUT = 30.0


def etcd_binary() -> str | None:
    return shutil.which("etcd")


def etcd_value(endpoint: str, key: str) -> bytes | None:
    """The value at `key` in the etcd at `endpoint` (None: none), through its JSON gateway."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    req = urllib.request.Request(f"{endpoint}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        out: dict[str, Any] = json.loads(r.read())
    kvs = out.get("kvs") or []
    return base64.b64decode(kvs[0].get("value", "")) if kvs else None


class EtcdServer:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> "EtcdServer":
        binary = etcd_binary()
        if binary is None:
            message = "etcd is not installed (Debian package etcd-server; `make test` installs it)"
            if required():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        self.data.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.data / "etcd.log", "ab")
        self.proc = subprocess.Popen(
            [binary, "--name", "ckptfs-test", "--data-dir", str(self.data / "member"),
             "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"ckptfs-test={peer}", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: {(self.data / 'etcd.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/health", timeout=2) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"etcd did not answer /health in {READY_TIMEOUT:.0f} s")

    def get(self, key: str) -> bytes | None:
        return etcd_value(self.endpoint, key)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.proc is not None:
            if self.paused:
                self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        shutil.rmtree(self.data, ignore_errors=True)
