"""engine.buffers.new_tensor: the memory load(path) reads new tensors into."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.engine.buffers import new_tensor
from shardsafe.storage.memory import HUGE


@pytest.mark.parametrize("kind,dtype,shape", [("torch", "bfloat16", (1024, 1536)),
                                              ("torch", "float32", (HUGE // 4,)),
                                              ("numpy", "float64", (3, HUGE // 8))])
def test_large_values_get_a_page_aligned_mapping_their_bytes_alias(kind, dtype, shape):
    value, dest = new_tensor(kind, dtype, shape)
    assert tuple(value.shape) == shape and dest.dtype == np.uint8
    addr = value.data_ptr() if kind == "torch" else value.ctypes.data
    assert addr % mmap.PAGESIZE == 0 and dest.ctypes.data == addr
    dest[:8] = 0xFF  # the bytes are the value's memory
    first = value.reshape(-1)[0]
    assert (torch.isnan(first) if kind == "torch" else np.isnan(first))


def test_small_values_come_from_the_ordinary_allocator():
    value, dest = new_tensor("torch", "float32", (10, 10))
    assert value.dtype == torch.float32 and dest.size == 400
    dest[:] = 0
    assert not value.any()


def test_load_returns_large_tensors_in_their_own_memory(tmp_path):
    state = {"big": torch.randn(1 << 20), "small": torch.arange(10)}
    shardsafe.save(state, str(tmp_path / "c"))
    got = shardsafe.load(str(tmp_path / "c"))
    assert torch.equal(got["big"], state["big"]) and torch.equal(got["small"], state["small"])
    assert got["big"].data_ptr() % mmap.PAGESIZE == 0
    got["big"].add_(1)  # writable, and independent of the other tensors
    assert torch.equal(got["big"], state["big"] + 1)
