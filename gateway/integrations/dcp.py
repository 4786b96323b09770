"""torch.distributed.checkpoint (DCP): save and commit a step, load the newest committed one.

    ckptfs.integrations.dcp.save(state_dict, f"{run_dir}/step_{step}", metadata={"loss": loss})
    ck = ckptfs.integrations.dcp.load(state_dict, run_dir)    # None: nothing committed yet

DCP writes one shard per rank and `.metadata` last; a directory whose `.metadata` is missing or
whose shards never all reached the bucket is not committed, and `load` passes over it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ckptfs.api import Checkpoint, Commit, commit, latest, wait_durable
from ckptfs.integrations.committer import jsonable, require

torch = require("torch", "torch", "ckptfs.integrations.dcp")
dcp = require("torch.distributed.checkpoint", "torch", "ckptfs.integrations.dcp")
dist = require("torch.distributed", "torch", "ckptfs.integrations.dcp")

__all__ = ["save", "load", "latest"]


def save(state_dict: dict[str, Any], checkpoint_dir: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None,
         **dcp_options: Any) -> Commit | None:
    """`dcp.save(state_dict, checkpoint_id=checkpoint_dir)`, then commit the directory with `metadata`.

    In a process group every rank calls it: one rank per node (LOCAL_RANK 0) waits until its node's
    shards are durable, and after a barrier global rank 0 commits (returning the Commit; the other
    ranks get None). The commit waits until the files are durable in the bucket.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    dcp.save(state_dict, checkpoint_id=checkpoint_dir, **dcp_options)
    if not (dist.is_available() and dist.is_initialized()):
        return commit(checkpoint_dir, jsonable(metadata or {}))
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        wait_durable(checkpoint_dir)  # this node's shards: the commit on rank 0 sees only its own node's
    dist.barrier()
    return commit(checkpoint_dir, jsonable(metadata or {})) if dist.get_rank() == 0 else None


def load(state_dict: dict[str, Any], run_dir: str | os.PathLike[str], **dcp_options: Any) -> Checkpoint | None:
    """Load the newest committed checkpoint under `run_dir` into `state_dict` (in place, as `dcp.load`);
    return it (its path, step and metadata), or None, leaving `state_dict` as it is, if none is committed."""
    ck = latest(run_dir)
    if ck is None:
        return None
    dcp.load(state_dict, checkpoint_id=str(ck.path), **dcp_options)
    return ck
