"""Exact comparison helpers for round-trip tests (bytes, types and structure)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The logical values of ``t`` as row-major bytes (conj/neg bits resolved)."""
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8)


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random bit patterns of ``dtype`` (NaN payloads included: the round trip must keep them)."""
    g = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = math.prod(shape) * itemsize
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)


def assert_same(got: Any, want: Any, path: str = "<root>") -> None:
    """Asserts equal structure, exact types, and bit-identical tensors/arrays/floats."""
    if isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor, f"{path}: {type(got)}"
        assert got.device.type == "cpu", path
        assert got.dtype == want.dtype and got.shape == want.shape, (path, got.dtype, got.shape)
        assert torch.equal(raw_bytes(got), raw_bytes(want)), path
        return
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), path
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), path
    elif isinstance(want, float):
        assert math.isnan(got) if math.isnan(want) else (got == want and math.copysign(1, got) == math.copysign(1, want)), path
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}.{i}")
    else:
        assert got == want, path
