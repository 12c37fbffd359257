"""The CUDA tests: run on a GPU machine by ``scripts/gpu-check`` (docs/development.md,
"GPU check"); everywhere else each test is collected and skipped with the reason."""

from __future__ import annotations

import pytest
import torch

NO_CUDA = "no CUDA device here: these tests run on a GPU machine (scripts/gpu-check, docs/development.md)"


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip(NO_CUDA)


@pytest.fixture
def device() -> torch.device:
    """The GPU the tests use (the current one)."""
    return torch.device("cuda", torch.cuda.current_device())
