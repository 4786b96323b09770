"""Train a small transformer on CPU for a few hundred steps and save it the ways trainers do (nothing downloaded).

    python -m tests.support.train_tiny OUT [--steps N] [--width D] [--layers L] [--vocab V]

Writes OUT/model.safetensors (the weights in BF16, as released models are), OUT/model.pt
(`torch.save` of the FP32 state dict), OUT/dcp/ (torch DCP: the model and its AdamW state, FP32:
`.metadata` and `__0_0.distcp`) and OUT/config.json. Real trained tensors, not random bytes: the
cold tier's codec is measured and tested on these (tests/integration/test_coldcompress.py, bench).
The task: predict the next token of sequences that follow a rule, so the weights move from their
initial values the way training moves them. One thread: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()

    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    torch.manual_seed(0)
    started = time.monotonic()
    d, v = args.width, args.vocab
    layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=2 * d, batch_first=True, dropout=0.0)
    model = torch.nn.Sequential(torch.nn.Embedding(v, d), torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False),
                                torch.nn.Linear(d, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(args.steps):
        start = torch.randint(0, v, (args.batch, 1))
        x = (start + 7 * torch.arange(args.seq)) % v  # a rule the model can learn: the next token is 7 on
        y = (x + 7) % 256
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    save_file({k: t.to(torch.bfloat16).contiguous() for k, t in state.items()}, str(out / "model.safetensors"))
    torch.save(state, out / "model.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... assuming a single process": it is one
        dcp.save({"model": state, "optim": opt.state_dict()}, checkpoint_id=str(out / "dcp"))
    (out / "config.json").write_text(json.dumps({"width": d, "layers": args.layers, "vocab": v, "steps": args.steps,
                                                 "loss_first": losses[0], "loss_last": losses[-1],
                                                 "seconds": round(time.monotonic() - started, 1)}, indent=1))


if __name__ == "__main__":
    main()
