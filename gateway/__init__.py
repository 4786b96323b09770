"""ckptfs: a caching write-back FUSE gateway for ML checkpoints, and the Python API training code uses.

    import ckptfs
    ckptfs.commit(step_dir, {"eval_loss": 0.31, "git_commit": sha})
    ckpt = ckptfs.latest(run_dir)          # the newest *committed* checkpoint, or None

The functions (gateway/api.py, docs/training.md) talk to the mount's daemon through its control
socket. Importing this package stays cheap (the standard library and sniffio): the CLI, the daemon
and every training process import it, so it loads neither the daemon nor boto3, trio or pyfuse3.
Framework callbacks are in `ckptfs.integrations` (Hugging Face Trainer, Lightning, torch DCP).
"""

from ckptfs.api import (
    Checkpoint,
    Commit,
    State,
    checkpoints,
    checkpoints_async,
    commit,
    commit_async,
    latest,
    latest_async,
    protect,
    protect_async,
    state,
    state_async,
    unprotect,
    unprotect_async,
    wait_durable,
    wait_durable_async,
)
from ckptfs.client import CkptfsError, NotAllowed, StoppedEarly, TimedOut

__all__ = [
    "Checkpoint", "Commit", "State", "CkptfsError", "NotAllowed", "StoppedEarly", "TimedOut",
    "state", "wait_durable", "commit", "checkpoints", "latest", "protect", "unprotect",
    "state_async", "wait_durable_async", "commit_async", "checkpoints_async", "latest_async", "protect_async", "unprotect_async",
]
