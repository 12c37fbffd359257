"""The benchmark states: (a) large fp32 tensors, (b) many small tensors, (e) tiny tensors."""

from __future__ import annotations

from typing import Any

import torch

MiB = 1 << 20


def large_tensors(total: int, tensor_bytes: int = 64 * MiB) -> dict[str, Any]:
    """Case (a): ``total`` bytes of fp32 in tensors of ``tensor_bytes`` (a flat dict)."""
    g = torch.Generator().manual_seed(0)
    n = max(1, total // tensor_bytes)
    per = max(1, min(tensor_bytes, total) // 4)
    return {f"layer{i:04d}.weight": torch.randn(per, generator=g) for i in range(n)}


def small_tensors(count: int, lo: int = 1 << 10, hi: int = 64 << 10) -> dict[str, Any]:
    """Case (b): ``count`` fp32 tensors of ``lo``..``hi`` bytes each (sizes log-uniform)."""
    g = torch.Generator().manual_seed(1)
    logs = torch.empty(count).uniform_(float(torch.tensor(lo).log2()), float(torch.tensor(hi).log2()),
                                       generator=g)
    sizes = (2 ** logs).long() // 4
    return {f"p{i:05d}": torch.randn(int(s), generator=g) for i, s in enumerate(sizes)}


def tiny_tensors(count: int, numel: int = 16) -> dict[str, Any]:
    """Case (e): ``count`` fp32 tensors of ``numel`` elements (per-tensor cost, not bandwidth)."""
    g = torch.Generator().manual_seed(2)
    return {f"t{i:06d}": torch.randn(numel, generator=g) for i in range(count)}


def nbytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def zeros_like(state: dict[str, Any]) -> dict[str, Any]:
    """A same-layout target for in-place loads."""
    return {k: torch.zeros_like(v) for k, v in state.items()}
