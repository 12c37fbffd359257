"""Parallel reads into targets: every block verified (a flipped byte anywhere is caught,
named by file and key), small chunks coalesced, partial pieces read only what they need."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from helpers import flip_byte

import shardsafe
from shardsafe.engine.load import reader as reader_mod
from shardsafe.engine.commit import read_index
from shardsafe.format import INDEX_NAME
from shardsafe.engine.load.reader import ChunkReader, ReadJob, _byte_span
from shardsafe.plan.load_plan import pieces_for
from shardsafe.storage.local import LocalStorage

DATA = "data-r00000-000.safetensors"


@pytest.fixture
def saved(tmp_path, monkeypatch):
    monkeypatch.setattr(reader_mod, "SPLIT_MIN", 4096)
    g = torch.Generator().manual_seed(1)
    state = {"big": torch.randn(5 << 20, generator=g),  # 20 MiB: two 16 MiB checksum blocks
             "mid": torch.randn(3000, 7, generator=g),
             "small": [torch.randn(i + 1, generator=g) for i in range(300)]}
    path = str(tmp_path / "c")
    shardsafe.save(state, path)
    return path, state


def _offset_of(path: str, key: tuple) -> tuple[int, int]:
    index = read_index(LocalStorage(), path)
    entry = next(t for t in index.tensors if t.key == key)
    return entry.chunks[0].offset, entry.nbytes


def test_parallel_in_place_load_is_exact(saved):
    path, state = saved
    target = {"big": torch.zeros(5 << 20), "mid": torch.zeros(3000, 7),
              "small": [torch.zeros(i + 1) for i in range(300)]}
    big_ptr = target["big"].data_ptr()
    shardsafe.load(path, target)
    assert target["big"].data_ptr() == big_ptr  # read into the target's own memory
    assert torch.equal(target["big"], state["big"]) and torch.equal(target["mid"], state["mid"])
    assert all(torch.equal(a, b) for a, b in zip(target["small"], state["small"]))


@pytest.mark.parametrize("where,key", [
    ("big-block0", ("big",)), ("big-block1", ("big",)), ("mid", ("mid",)), ("small", ("small", 150)),
])
def test_flipped_byte_is_detected_in_every_read_path(saved, where, key):
    path, _ = saved
    off, n = _offset_of(path, key)
    pos = {"big-block0": off + 12345, "big-block1": off + (16 << 20) + 99}.get(where, off + n // 2)
    flip_byte(os.path.join(path, DATA), pos, 0x40)
    target = {"big": torch.zeros(5 << 20), "mid": torch.zeros(3000, 7),
              "small": [torch.zeros(i + 1) for i in range(300)]}
    with pytest.raises(shardsafe.CorruptCheckpointError) as e:
        shardsafe.load(path, target)
    assert e.value.file == DATA and e.value.key == ".".join(map(str, key))
    with pytest.raises(shardsafe.CorruptCheckpointError):
        shardsafe.load(path)


def test_partial_piece_reads_only_covering_blocks(saved):
    path, state = saved
    storage = LocalStorage()
    index = read_index(storage, path)
    entry = next(t for t in index.tensors if t.key == ("big",))
    # a region in the second checksum block: flip a byte in the first, which must not be read
    flip_byte(os.path.join(path, DATA), entry.chunks[0].offset + 100, 0x40)
    lo = (16 << 20) // 4 + 10
    dest = np.zeros(1000 * 4, dtype=np.uint8)
    ChunkReader(storage, path, index).run([ReadJob(entry, dest, (lo,), (1000,))])
    assert np.array_equal(dest.view(np.float32), state["big"][lo : lo + 1000].numpy())
    with pytest.raises(shardsafe.CorruptCheckpointError):
        ChunkReader(storage, path, index).run([ReadJob(entry, dest, (5,), (10,))])


def test_rows_on_block_bounds_are_read_in_place(saved):
    import tracemalloc

    path, state = saved
    storage = LocalStorage()
    index = read_index(storage, path)
    entry = next(t for t in index.tensors if t.key == ("big",))
    block = (16 << 20) // 4  # elements per checksum block
    flip_byte(os.path.join(path, DATA), entry.chunks[0].offset + 100, 0x40)  # in the first block
    dest = np.zeros((entry.shape[0] - block) * 4, dtype=np.uint8)  # the second block, to the end
    tracemalloc.start()
    try:
        ChunkReader(storage, path, index).run([ReadJob(entry, dest, (block,), (entry.shape[0] - block,))])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(dest.view(np.float32), state["big"][block:].numpy())
    assert peak < 1 << 20  # no temporary of the 20 MiB chunk (or of the piece)
    first = np.zeros(block * 4, dtype=np.uint8)
    with pytest.raises(shardsafe.CorruptCheckpointError):
        ChunkReader(storage, path, index).run([ReadJob(entry, first, (0,), (block,))])


def test_byte_span_of_a_2d_region():
    from shardsafe.format.index.rows import ChunkEntry

    c = ChunkEntry("f", 0, 4 * 10 * 6, (0, 0), (10, 6), (0,))
    p = pieces_for([c], (2, 1), (3, 2))[0]
    assert _byte_span(p, c.shape, 4) == ((2 * 6 + 1) * 4, (4 * 6 + 2 + 1) * 4)


def test_small_chunks_of_a_load_are_read_together(tmp_path, monkeypatch):
    """Neighbouring small chunks of one file are one read (``plan.load_plan.coalesce``)."""
    state = {f"t{i}": torch.full((100,), float(i)) for i in range(50)}
    path = str(tmp_path / "small")
    shardsafe.save(state, path)
    reads: list[int] = []
    read_into = LocalStorage.read_into

    def spy(self, p, offset, out):  # noqa: ANN001, ANN202
        if os.path.basename(p) != INDEX_NAME:  # the data (a load in place reads the index in parts too)
            reads.append(len(out))
        return read_into(self, p, offset, out)

    monkeypatch.setattr(LocalStorage, "read_into", spy)
    # contiguous targets (read by table row and address) and strided ones (read jobs)
    for target in ({k: torch.zeros(100) for k in state}, {k: torch.zeros(100, 2)[:, 0] for k in state}):
        reads.clear()
        shardsafe.load(path, target)
        assert len(reads) == 1 and reads[0] >= 50 * 400
        assert all(torch.equal(target[k], state[k]) for k in state)


def test_mmap_load_is_zero_copy_verified_and_copy_on_write(saved):
    path, state = saved
    got = shardsafe.load(path, mmap=True)
    assert torch.equal(got["big"], state["big"]) and torch.equal(got["mid"], state["mid"])
    assert all(torch.equal(a, b) for a, b in zip(got["small"], state["small"]))
    got["big"].zero_()  # private mapping: the checkpoint is untouched
    assert torch.equal(shardsafe.load(path)["big"], state["big"])
    with pytest.raises(ValueError, match="mmap"):
        shardsafe.load(path, {"big": torch.zeros(1)}, mmap=True)


def test_mmap_load_verifies_before_returning(saved):
    path, _ = saved
    off, n = _offset_of(path, ("small", 7))
    flip_byte(os.path.join(path, DATA), off + n - 1, 0x40)
    with pytest.raises(shardsafe.CorruptCheckpointError) as e:
        shardsafe.load(path, mmap=True)
    assert e.value.key == "small.7"


def test_mmap_load_of_numpy_bfloat16_and_empty(tmp_path):
    state = {"np": np.arange(10, dtype=np.int16), "bf": torch.randn(9).to(torch.bfloat16),
             "e": torch.zeros(0, 3), "s": torch.tensor(2.5)}
    shardsafe.save(state, str(tmp_path / "c"))
    got = shardsafe.load(str(tmp_path / "c"), mmap=True)
    np.testing.assert_array_equal(got["np"], state["np"])
    assert torch.equal(got["bf"], state["bf"]) and got["e"].shape == (0, 3)
    assert got["s"].shape == () and got["s"].item() == 2.5
