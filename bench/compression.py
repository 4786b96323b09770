"""The compressed cold tier (issue 26): the codec's ratios and speed on real checkpoints, and a restore with and without it.

1. A transformer is trained on CPU for the run (tests/support/train_tiny.py; its size follows the scale,
   once per `python -m bench`) and saved the ways trainers do: safetensors of BF16 weights, torch DCP with
   the model and its FP32 AdamW state, a torch.save state dict.
2. In this process, on those files, in one run: the cold mover's codec as the mover runs it (layout.Planner
   and codec.encode per 4 MiB chunk), against **byte-grouped zstd -3** (the same layout and chunks; each
   float value's bytes in separate streams, not rotated, each stream zstd level 3: ZipNN's byte grouping
   without its exponent byte; a `try` range as the best of 1, 2 and 4 streams) and **plain zstd -3** (the
   whole file, one zstd frame at level 3): stored / original bytes per file. The codec's speed is its CPU
   time on one thread (`time.thread_time`: what one core does, whatever else runs), compressing (planning
   included) and decoding; and the wall time of both cores compressing the files at once (threads, as the
   daemon runs it).
3. The daemon: the same files as a checkpoint in a ckptfs mount, moved (tier_move_target) to a second
   SeaweedFS server, first with `cold_compression = auto`, then, as another checkpoint, `none`; then
   `ckptfs restore` of each is timed (streamed from the second server to the first: fewer bytes to fetch,
   decoded on several cores, against a plain streamed copy).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zstandard

from bench.env import ROOT, BenchServer
from bench.mounts import CkptfsMount
from bench.replication import ReplicatingMount
from ckptfs.lifecycle import codec, layout

FILES = ("model.safetensors", "model.pt", "dcp/__0_0.distcp", "dcp/.metadata")
TRAINING = ("dcp/__0_0.distcp", "dcp/.metadata")  # the full training checkpoint: weights and AdamW state, FP32
TARGET = "cold"


def model_args(scale: float) -> list[str]:
    """The trained model's size for a scale: at 1, ~10M parameters (a DCP checkpoint of ~125 MB with AdamW)."""
    if scale >= 0.25:
        return ["--width", "256", "--layers", "4", "--vocab", "32768", "--steps", "200"]
    if scale >= 0.02:
        return ["--width", "128", "--layers", "4", "--vocab", "8192", "--steps", "200"]
    return ["--width", "32", "--layers", "2", "--vocab", "1024", "--steps", "20"]


def train(out: Path, scale: float, log: Callable[[str], None]) -> Path:
    """The trained checkpoint files (made once per bench run, kept in its work directory)."""
    if not (out / "config.json").exists():
        log(f"compression: training a model on CPU ({' '.join(model_args(scale))})")
        subprocess.run([sys.executable, "-m", "tests.support.train_tiny", str(out), *model_args(scale)], cwd=ROOT, check=True,
                       capture_output=True, timeout=3600)
    return out


# ------------------------------------------------------------------ the codec, in this process
REPEAT = 3  # the codec's CPU time is the least of this many passes: what a core does when the others' load leaves it be


def ours(data: bytes, repeat: int = REPEAT) -> tuple[int, float, list[bytes]]:
    """(stored bytes, CPU seconds, frames) of the mover's codec on `data`."""
    chunks = [(at, data[at:at + codec.CHUNK]) for at in range(0, len(data), codec.CHUNK)]  # bytes, as ranged GETs give them
    best = float("inf")
    for _ in range(repeat):
        planner = layout.Planner("auto")
        frames: list[list[Any]] = [[codec.MAGIC]]
        t = time.thread_time()
        for at, chunk in chunks:
            frames.append(codec.encode(chunk, planner.plan(at, chunk))[0])
        best = min(best, time.thread_time() - t)
    joined = [b"".join(f) for f in frames]  # not timed: the daemon writes the pieces into its part buffers
    return sum(map(len, joined)), best, joined


def decode_seconds(frames: list[bytes], size: int, repeat: int = REPEAT) -> float:
    """CPU seconds to decode (and check) every frame, the least of `repeat` passes; asserts the bytes come back."""
    return min(_decode_once(frames, size) for _ in range(repeat))


def _decode_once(frames: list[bytes], size: int) -> float:
    reader = codec.FrameReader()
    t = time.thread_time()
    got = 0
    for frame in frames:
        for body, n, digest, offset in reader.feed(frame):
            got += len(codec.decode_body(body, n, digest, offset))
    reader.close()
    seconds = time.thread_time() - t
    if got != size:
        raise RuntimeError(f"decoded {got} bytes of {size}")
    return seconds


def byte_grouped(data: bytes) -> int:
    """Stored bytes with byte grouping (no rotation) and zstd -3 per stream, on the same layout and chunks."""
    z = zstandard.ZstdCompressor(level=3)

    def grouped(seg: bytes, width: int) -> int:
        n = len(seg) // width * width
        planes = np.frombuffer(seg[:n], np.uint8).reshape(-1, width).T if n else np.zeros((width, 0), np.uint8)
        return sum(len(z.compress(np.ascontiguousarray(p).tobytes())) for p in planes) + len(seg) - n

    planner = layout.Planner("auto")
    total = 0
    for at in range(0, len(data), codec.CHUNK):
        chunk = data[at:at + codec.CHUNK]
        pos = 0
        for n, kind in planner.plan(at, chunk):
            seg = chunk[pos:pos + n]
            pos += n
            if kind in codec.WIDTH:
                total += grouped(seg, codec.WIDTH[kind])
            elif kind == "try":
                total += min(len(z.compress(seg)), grouped(seg, 2), grouped(seg, 4))
            else:
                total += len(z.compress(seg)) if kind != "raw" else len(seg)
    return total


def codec_figures(files: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"files": {}}
    blobs = {name: (files / name).read_bytes() for name in FILES}
    for data in blobs.values():  # warm: the daemon's threads are long-lived (their zstd contexts and memory reused)
        ours(data[:2 * codec.CHUNK], 1)
    for name, data in blobs.items():
        stored, enc_s, frames = ours(data)
        out["files"][name] = {"size": len(data), "ours": stored, "byte_grouped_zstd3": byte_grouped(data),
                              "zstd3": len(zstandard.ZstdCompressor(level=3).compress(data)),
                              "encode_cpu_s": enc_s, "decode_cpu_s": decode_seconds(frames, len(data))}
    # both cores at once, as the daemon codes chunks (one worker thread per core)
    plans = {}
    for name, data in blobs.items():  # the plans in order (the daemon makes them in order too), timed apart
        planner = layout.Planner("auto")
        for at in range(0, len(data), codec.CHUNK):
            plans[(name, at)] = planner.plan(at, data[at:at + codec.CHUNK])
    jobs = [(d[at:at + codec.CHUNK], plans[(name, at)]) for name, d in blobs.items() for at in range(0, len(d), codec.CHUNK)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        t = time.monotonic()
        list(pool.map(lambda job: codec.encode(*job), jobs))
        out["parallel_encode_s"] = time.monotonic() - t
    out["parallel_threads"] = 2
    out["bytes"] = sum(len(d) for d in blobs.values())
    return out


# ------------------------------------------------------------------ the daemon: move, then restore
def checkpoint(m: CkptfsMount, rel: str) -> dict[str, Any]:
    """The checkpoint `rel` as `ckptfs checkpoints --json` shows it."""
    r = m._cli("checkpoints", str(m.path / rel), "--json", timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"ckptfs checkpoints failed: {(r.stderr or r.stdout).strip()[:300]}")
    return next(e for e in json.loads(r.stdout) if e["path"] == rel)


def move_and_restore(server: BenchServer, cold: BenchServer, bucket: str, cold_bucket: str, state: Path, files: Path,
                     policy: str, rel: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Mount with `cold_compression = policy`, put the files in checkpoint `rel`, time its move, then its restore."""
    state.mkdir(parents=True, exist_ok=True)
    config = state / "cold.toml"
    config.write_text(f'[replica.{TARGET}]\nsource = "s3://{cold_bucket}"\nendpoint_url = "{cold.endpoint_url}"\n')
    opts: dict[str, Any] = {"tier_move_target": TARGET, "tier_move_interval": 1, "tier_move_after": 1, "metadata_ttl": 0,
                            "checkpoint_quiet_seconds": 3600, "replication_lease_ttl": 10, "cold_compression": policy}
    m = ReplicatingMount(server, bucket, state / "mnt", state, config=config, **opts)
    m.start()
    try:
        shutil.copytree(files, m.path / rel, ignore=shutil.ignore_patterns("config.json"))
        r = m._cli("checkpoint", "commit", str(m.path / rel), timeout=3600)
        if r.returncode != 0:
            raise RuntimeError(f"ckptfs checkpoint commit failed: {(r.stderr or r.stdout).strip()[:300]}")
        t = time.monotonic()
        log(f"compression: moving {rel} to the cold target (cold_compression = {policy})")
        while (e := checkpoint(m, rel))["storage_class"] != f"moved:{TARGET}":
            if time.monotonic() - t > 3600:
                raise RuntimeError(f"{rel} was not moved within an hour: {m.status().get('tier_move')}")
            time.sleep(0.5)
        moved_s = time.monotonic() - t
    finally:
        m.stop()
    m.options["tier_move_after"] = 86400  # so it stays once it is back
    m.start()
    try:
        log(f"compression: restoring {rel} (cold_compression = {policy})")
        t = time.monotonic()
        r = m._cli("restore", str(m.path / rel), timeout=3600)
        restore_s = time.monotonic() - t
        if r.returncode != 0:
            raise RuntimeError(f"ckptfs restore failed: {(r.stderr or r.stdout).strip()[:300]}")
        back = checkpoint(m, rel)
        if back["storage_class"] == f"moved:{TARGET}" or back["moved"]["state"] != "restored":
            raise RuntimeError(f"{rel} is not back after the restore: {back['storage_class']}")
    finally:
        m.stop()
    return {"move_s": moved_s, "restore_s": restore_s, "original_bytes": e["original_bytes"], "stored_bytes": e["stored_bytes"]}


def compression(plan: Any, server: BenchServer, tag: str, log: Callable[[str], None]) -> dict[str, Any]:
    files = train(plan.work / "trained", plan.scale, log)
    log("compression: the codec against byte-grouped and plain zstd -3 on the trained files")
    out = codec_figures(files)
    out["model"] = json.loads((files / "config.json").read_text())
    state = plan.work / "cz"  # short: the daemon's control socket under it must fit a Unix socket path
    shutil.rmtree(state, ignore_errors=True)
    cold = BenchServer(state / "seaweed2")
    bucket, cold_bucket = f"bench-{tag}-cz", f"bench-{tag}-czcold"
    try:
        log("compression: second SeaweedFS server (the cold target)")
        cold.start()
        server.make_bucket(bucket)
        cold.make_bucket(cold_bucket)
        for step, policy in enumerate(("auto", "none"), 1):
            out[f"daemon_{policy}"] = move_and_restore(server, cold, bucket, cold_bucket, state / policy, files, policy,
                                                       f"run/step_{step}", log)
        return out
    finally:
        server.drop_bucket(bucket)
        if cold.running:
            cold.stop()
        shutil.rmtree(state, ignore_errors=True)
