"""Assertions and state builders shared by the CLI tests."""

from __future__ import annotations

import os
import random
import subprocess

import numpy as np
import torch

import shardsafe


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """Asserts the process failed with exactly one line on stderr and no traceback."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def manager_state(step: int) -> dict:
    """A small training state whose values depend on ``step``."""
    g = torch.Generator().manual_seed(step)
    return {"model": {"layer.weight": torch.randn(8, 4, generator=g),
                      "layer.bias": torch.zeros(4, dtype=torch.bfloat16) + step},
            "optim": {"step": step, "betas": (0.9, 0.999), "blob": b"\x00\x01", "empty": {}},
            "table": np.arange(6, dtype=np.int64).reshape(2, 3) * step}


def save_step(run: str, step: int, **kwargs) -> str:
    """Saves ``manager_state(step)`` as the manager would: ``step_<8 digits>`` with metrics."""
    path = os.path.join(run, f"step_{step:08d}") if "://" not in run else f"{run}/step_{step:08d}"
    shardsafe.save(manager_state(step), path,
                   metadata={"shardsafe.manager": {"step": step, "metrics": {"loss": 1.0 / step}}},
                   **kwargs)
    return path


def rng_heavy_state(path: str, step: int) -> None:
    """A getting-started state: a module, an optimizer, the RNG state (~630 leaves), a step."""
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optim.step()
    random.seed(step)
    shardsafe.save({"model": model, "optim": optim, "rng": shardsafe.RNGState(), "step": step}, path)
