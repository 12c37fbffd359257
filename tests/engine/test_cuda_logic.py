"""The parts of the CUDA path that are plain logic and run the same on the CPU: which
elements a unit's byte range touches in a strided tensor, gathering just those bytes
(real CPU tensors: the code is device-agnostic), finding torch's CUDA runtime in a
process's mappings, and what happens without CUDA. The GPU side is in tests/cuda."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from shardsafe.engine import cuda
from shardsafe.engine.buffers import HostBuffer


def _logical_bytes(t: torch.Tensor) -> bytes:
    return t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("shape,lo,hi,want", [
    ((10,), 3, 7, [((), 3, 7)]),
    ((4, 5), 0, 20, [((), 0, 4)]),
    ((4, 5), 5, 15, [((), 1, 3)]),
    ((4, 5), 2, 4, [((0,), 2, 4)]),
    ((4, 5), 3, 17, [((0,), 3, 5), ((), 1, 3), ((3,), 0, 2)]),
    ((2, 3, 4), 5, 19, [((0, 1), 1, 4), ((0,), 2, 3), ((1,), 0, 1), ((1, 1), 0, 3)]),
    ((3, 4), 6, 6, []),
])
def test_element_blocks_table(shape, lo, hi, want):
    assert cuda.element_blocks(shape, lo, hi) == want


def test_element_blocks_tile_any_range_of_any_shape_in_order():
    rng = random.Random(5)
    for _ in range(400):
        shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 5)))
        total = math.prod(shape)
        lo = rng.randint(0, total)
        hi = rng.randint(lo, total)
        a = np.arange(total).reshape(shape)
        blocks = cuda.element_blocks(shape, lo, hi)
        got = np.concatenate([a[ix][x:y].reshape(-1) for ix, x, y in blocks] or [np.zeros(0, a.dtype)])
        assert got.tolist() == list(range(lo, hi)), (shape, lo, hi, blocks)
        assert len(blocks) <= max(1, 2 * len(shape) - 1)
        assert all(y > x for _, x, y in blocks)


def _views() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 29, generator=g)
    c = torch.randn(13, 11, dtype=torch.complex64, generator=g)
    out = {
        "contiguous": x,
        "transposed": x.t(),
        "strided": x[::3, 1::2],
        "offset": x[20:, 5:],
        "expanded": torch.randn(7, 1, generator=g).expand(7, 9),
        "channels_last": torch.randn(2, 3, 5, 4, generator=g).contiguous(memory_format=torch.channels_last),
        "conj": c.conj(),
        "conj_transposed": c.conj().t(),
        "neg": c.conj().imag,
        "bf16_transposed": x.to(torch.bfloat16).t(),
        "bool_strided": (x > 0)[::2],
        "int64_transposed": torch.randint(-9, 9, (6, 10), generator=g).t(),
        "scalar_conj": c[0, 0].conj(),
        "fp64_3d": torch.randn(4, 5, 6, dtype=torch.float64, generator=g).permute(2, 0, 1),
    }
    if hasattr(torch, "float8_e4m3fn"):
        out["fp8_strided"] = torch.randn(30, 8, generator=g).to(torch.float8_e4m3fn)[::2]
    if hasattr(torch, "complex32"):
        out["complex32_transposed"] = torch.randn(6, 4, dtype=torch.complex64, generator=g).to(torch.complex32).t()
    return out


@pytest.mark.parametrize("name", list(_views()))
def test_byte_range_gives_the_logical_bytes_of_any_range(name):
    t = _views()[name]
    want = _logical_bytes(t)
    rng = random.Random(name)
    ranges = [(0, len(want)), (0, 1), (len(want) - 1, 1)]
    ranges += [(a, rng.randint(0, len(want) - a)) for a in (rng.randrange(len(want)) for _ in range(12))]
    for start, n in ranges:
        got = cuda.byte_range(t, start, n)
        assert got.dtype == torch.uint8 and got.dim() == 1
        assert got.numpy().tobytes() == want[start : start + n], (name, start, n)
    assert _logical_bytes(t) == want  # the source is unchanged (no bit resolved in place)


def test_byte_range_of_a_non_contiguous_tensor_copies_only_what_the_range_touches():
    """A large transposed weight streamed in small units: each unit gathers about its own
    bytes, not the whole tensor (which per unit would be quadratic work and memory)."""
    t = torch.arange(512 * 384, dtype=torch.float32).reshape(512, 384).t()
    n = 4096 + 3
    piece = cuda.byte_range(t, 10_001, n)
    assert piece.untyped_storage().nbytes() <= n + 2 * t.element_size()
    assert piece.numpy().tobytes() == _logical_bytes(t)[10_001 : 10_001 + n]


def test_byte_range_of_a_contiguous_tensor_is_a_view():
    t = torch.arange(1000, dtype=torch.int32)
    piece = cuda.byte_range(t, 8, 40)
    assert piece.data_ptr() == t.data_ptr() + 8


MAPS = """\
7f1c2a000000-7f1c2a200000 r--p 00000000 103:02 1234  /usr/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so
7f1c2b000000-7f1c2b010000 r-xp 00000000 103:02 5678  /venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13
7f1c2b010000-7f1c2b012000 rw-p 00010000 103:02 5678  /venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13
7f1c2c000000-7f1c2c001000 rw-p 00000000 00:00 0
"""


@pytest.mark.parametrize("maps,want", [
    (MAPS, ["/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13"]),
    ("7f00-7f10 r-xp 00000000 08:01 42 /opt/torch/lib/libcudart-9335f6a2.so.12\n",
     ["/opt/torch/lib/libcudart-9335f6a2.so.12"]),
    ("7f00-7f10 r-xp 00000000 08:01 42 /opt/my libs/libcudart.so.12.4.127\n", ["/opt/my libs/libcudart.so.12.4.127"]),
    ("7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/libcudart_static_helper.so\n"
     "7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/libcudnn.so.9\n", []),
    (MAPS + "7f1d00000000-7f1d00100000 r-xp 00000000 103:02 9 /opt/cupy/lib/libcudart.so.12\n",
     ["/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13", "/opt/cupy/lib/libcudart.so.12"]),
    ("", []),
])
def test_the_cuda_runtimes_are_found_in_a_process_maps(maps, want):
    assert cuda.cudart_paths(maps) == want


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_without_cuda_nothing_is_fenced_pinned_or_initialised():
    state = [torch.zeros(3), np.zeros(2), 5]
    assert cuda.Fence.capture(state) is None
    buf = HostBuffer(4096)
    assert buf.pin_for(0) is False and buf.pin_for(0) is False and not buf.pinned
    buf.close()
    assert not torch.cuda.is_initialized()
