"""examples/: what a new user runs first. Without PyTorch (`make run`'s venv has none) the training example
says in one line what to install, instead of a ModuleNotFoundError traceback."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.conftest import ROOT

# runs the example as `python examples/train_loop.py` does, in an interpreter where torch cannot be imported
WITHOUT_TORCH = """
import runpy, sys
sys.modules["torch"] = None  # `import torch` fails as where it is not installed
sys.argv = ["examples/train_loop.py", "--dir", "/nonexistent"]
runpy.run_path("examples/train_loop.py", run_name="__main__")
"""


def test_train_loop_without_torch_says_what_to_install() -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "train_loop.py needs PyTorch, which is not installed here: .venv/bin/pip install torch==2.13.0 "
        "(or pip install -e '.[train]' from the checkout)"], proc.stderr


def test_train_loop_and_training_md_name_the_torch_the_train_extra_pins() -> None:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    torch_pin = next(p for p in pins if p.startswith("torch=="))
    head = (ROOT / "examples" / "train_loop.py").read_text().split('"""')[1]
    assert f"pip install {torch_pin}" in head and "'.[train]'" in head
    assert f".venv/bin/pip install {torch_pin}" in (ROOT / "docs" / "training.md").read_text()
