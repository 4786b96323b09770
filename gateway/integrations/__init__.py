"""Callbacks that commit the checkpoints a trainer saves, and resume from the newest committed one.

`ckptfs.integrations.transformers` (Hugging Face Trainer), `ckptfs.integrations.lightning`
(PyTorch Lightning), `ckptfs.integrations.dcp` (torch.distributed.checkpoint): see
docs/training.md. No framework is a dependency of ckptfs: each module imports its framework
when it is imported itself, and says what to install if it is missing. Nothing in ckptfs
imports this package: it is the top of its own stack, on the Python API (`ckptfs.api`).
"""
