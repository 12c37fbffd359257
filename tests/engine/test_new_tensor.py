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


def _anon_huge_kib(addr: int) -> int:
    """AnonHugePages (KiB) of the mapping holding ``addr`` in this process (/proc/self/smaps)."""
    current = False
    with open("/proc/self/smaps", encoding="ascii") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                current = lo <= addr < hi
            elif current and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


def test_a_cold_load_reads_into_huge_pages_a_warm_one_into_small_ones(tmp_path):
    """Bytes read with direct I/O (the file out of the page cache) land in huge pages (2x
    faster on the project VM), bytes copied from the page cache in 4 KiB pages (2-3x
    faster there); LocalStorage.reads_direct tells the two apart, without I/O."""
    import os

    from shardsafe.storage import LocalStorage

    path = str(tmp_path / "c")
    shardsafe.save({"w": torch.ones(8 * HUGE // 4)}, path)
    data = os.path.join(path, next(f for f in os.listdir(path) if f.startswith("data-")))
    storage = LocalStorage()
    if not storage.direct_io:
        pytest.skip("this filesystem refuses O_DIRECT: every read is buffered")
    fd = os.open(data, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert storage.reads_direct(data)
    cold = shardsafe.load(path)["w"]
    for _ in range(5):  # a file in the page cache all through its load (memory pressure may evict it)
        with open(data, "rb") as f:  # into the page cache
            f.read()
        assert not storage.reads_direct(data)
        warm = shardsafe.load(path)["w"]
        if not storage.reads_direct(data):
            break
    assert torch.equal(cold, warm) and bool((cold == 1).all())
    with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
        thp = f.read()
    if "[never]" not in thp:
        assert _anon_huge_kib(cold.data_ptr()) > 0
    assert _anon_huge_kib(warm.data_ptr()) == 0
