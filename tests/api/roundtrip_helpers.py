"""Random tensors for round-trip tests (every bit pattern, NaN payloads included);
they are compared with helpers.assert_same."""

from __future__ import annotations

import math

import torch


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random bit patterns of ``dtype`` (NaN payloads included: the round trip must keep them)."""
    g = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = math.prod(shape) * itemsize
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)
