"""A 4-rank PyTorch Distributed Checkpoint job on the CPU (gloo), run by the tests as a subprocess.

    python -m tests.support.dcp_job save DIR DIGESTS.json
    python -m tests.support.dcp_job load DIR DIGESTS.json

Each rank owns a quarter of a small transformer-like model's layers (as in pipeline
parallelism), takes one AdamW step, and saves {model, optim} with
`torch.distributed.checkpoint.save`. `save` writes the sha256 of every tensor it saved;
`load` builds freshly (differently) initialised modules, loads the checkpoint into them with
`torch.distributed.checkpoint.load`, and exits 1 unless every tensor is bit-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn

WORLD = 4
LAYERS = 8  # two per rank
WIDTH = 512  # 8 blocks x 3.2M params x 4 bytes = 100 MiB of weights, x 3 with AdamW = 300 MiB


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / WIDTH**0.5, dim=-1) @ v
        x = x + self.proj(att)
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Stage(nn.Module):
    """The layers one rank owns; parameter names carry the global layer index, so ranks never collide."""

    def __init__(self, rank: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed * 100 + rank)
        per = LAYERS // WORLD
        self.blocks = nn.ModuleDict({f"layer{rank * per + i}": Block() for i in range(per)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return x


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def flat(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if isinstance(state, torch.Tensor):
        out[prefix] = state
    elif isinstance(state, dict):
        for k, v in state.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(flat(v, f"{prefix}.{i}"))
    return out


def state_of(rank: int, seed: int, train: bool) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = Stage(rank, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if train:
        torch.manual_seed(rank)
        model(torch.randn(2, 4, WIDTH)).sum().backward()
    else:
        for p in model.parameters():  # optimizer state must exist to be loaded into
            p.grad = torch.zeros_like(p)
    opt.step()
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd, "_objs": (model, opt)}


def worker(rank: int, mode: str, path: str, digests_path: str, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        if mode == "save":
            state = state_of(rank, seed=1, train=True)
            state.pop("_objs")
            dcp.save(state, checkpoint_id=path)
            with open(f"{digests_path}.{rank}", "w") as f:
                json.dump({k: digest(v) for k, v in flat(state).items()}, f)
        else:
            state = state_of(rank, seed=2, train=False)  # fresh, different values
            objs = state.pop("_objs")
            dcp.load(state, checkpoint_id=path)
            from torch.distributed.checkpoint.state_dict import set_state_dict

            set_state_dict(objs[0], objs[1], model_state_dict=state["model"], optim_state_dict=state["optim"])
            with open(digests_path) as f:
                want = json.load(f)[str(rank)]
            got = {k: digest(v) for k, v in flat(state).items()}
            bad = [k for k in want if got.get(k) != want[k]]
            if bad or len(got) != len(want):
                raise SystemExit(f"rank {rank}: {len(bad)} tensors differ after load, e.g. {bad[:3]}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> int:
    mode, path, digests_path = sys.argv[1:4]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(mode, path, digests_path, port), nprocs=WORLD, join=True)
    if mode == "save":
        merged = {}
        for rank in range(WORLD):
            with open(f"{digests_path}.{rank}") as f:
                merged[str(rank)] = json.load(f)
            os.unlink(f"{digests_path}.{rank}")
        with open(digests_path, "w") as f:
            json.dump(merged, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
