"""One rank of a 2-rank PyTorch Distributed Checkpoint job (gloo, CPU), each rank on a node of its own.

    python -m tests.support.dcp_nodes save RANK PORT DIR DIGESTS.json
    python -m tests.support.dcp_nodes load RANK PORT DIR DIGESTS.json

Unlike tests/support/dcp_job.py (4 ranks of one node, one directory), each rank is its own process,
started by the test, and writes into the checkpoint directory as its node mounts it: rank 0 through
node A's mount (its shard and, as the coordinator, `.metadata`), rank 1 through node B's. `save`
writes the sha256 of every tensor the rank saved to DIGESTS.json.RANK; `load` (both ranks on one
node) loads into freshly initialised modules and exits 1 unless every tensor is bit-identical.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from tests.support.dcp_job import Block, digest, flat

WORLD = 2
BLOCKS_PER_RANK = 2  # 2 blocks x 3.2M params x 4 bytes x 3 (AdamW) = about 75 MiB per rank


class Stage(nn.Module):
    def __init__(self, rank: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed * 100 + rank)
        self.blocks = nn.ModuleDict({f"layer{rank * BLOCKS_PER_RANK + i}": Block() for i in range(BLOCKS_PER_RANK)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return x


def state_of(rank: int, seed: int, train: bool) -> tuple[dict, nn.Module, torch.optim.Optimizer]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = Stage(rank, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if train:
        torch.manual_seed(rank)
        model(torch.randn(2, 4, 512)).sum().backward()
    else:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    opt.step()
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd}, model, opt


def main() -> int:
    mode, rank, port, path, digests = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        if mode == "save":
            state, _, _ = state_of(rank, seed=1, train=True)
            dcp.save(state, checkpoint_id=path)
            with open(f"{digests}.{rank}", "w") as f:
                json.dump({k: digest(v) for k, v in flat(state).items()}, f)
        else:
            from torch.distributed.checkpoint.state_dict import set_state_dict

            state, model, opt = state_of(rank, seed=2, train=False)  # fresh, different values
            dcp.load(state, checkpoint_id=path)
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            with open(f"{digests}.{rank}") as f:
                want = json.load(f)
            got = {k: digest(v) for k, v in flat(state).items()}
            bad = [k for k in want if got.get(k) != want[k]]
            if bad or len(got) != len(want):
                print(f"rank {rank}: {len(bad)} tensors differ after load, e.g. {bad[:3]}", file=sys.stderr)
                return 1
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
