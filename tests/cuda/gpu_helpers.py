"""What the CUDA tests share: random tensors of any dtype, byte-exact comparison across
devices, and values that a GPU stream produces late (to catch copies that do not wait)."""

from __future__ import annotations

from typing import Any

import torch

from shardsafe.format.dtypes import DTYPES

SLOW_CYCLES = 500_000_000  # about a quarter to half a second of one GPU thread spinning


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a format dtype name; None where this torch has none."""
    dt = getattr(torch, name, None)
    return dt if isinstance(dt, torch.dtype) else None


DTYPE_NAMES = sorted(DTYPES)


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A CPU tensor of ``dtype`` and ``shape`` with random bytes (bool: random 0/1), so
    every bit pattern of the dtype can occur (NaNs too: compare with ``host_bytes``)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.uint8).bool()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * itemsize,), generator=g, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def host_bytes(t: torch.Tensor) -> torch.Tensor:
    """The logical values of ``t`` (any device, view bits resolved) as row-major CPU bytes."""
    t = t.detach().resolve_conj().resolve_neg().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8)


def assert_bytes_equal(got: Any, want: Any, what: str = "") -> None:
    """Same dtype, shape and bytes (NaN payloads and -0.0 included)."""
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (what, got.dtype, got.shape)
    assert torch.equal(host_bytes(got), host_bytes(want)), what


def blank_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor like ``t`` (device, dtype, shape) of zero bytes; also for dtypes that
    have no fill kernel (``zeros_like`` of float4 raises)."""
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    out.reshape(-1).view(torch.uint8).zero_()
    return out


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t`` that shares no memory with it (also when ``t`` is on the CPU)."""
    return t.detach().to("cpu", copy=True)


def fill_late(t: torch.Tensor, value: float) -> None:
    """Queues, on the current stream, a spin of ``SLOW_CYCLES`` and then ``t.fill_(value)``:
    the new value lands long after this call returns, so a copy that does not wait for this
    stream reads the old one."""
    torch.cuda._sleep(SLOW_CYCLES)
    t.fill_(value)
