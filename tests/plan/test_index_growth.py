"""Index size of a sharded checkpoint grows linearly with its chunks."""

from __future__ import annotations

import time

import pytest

from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.versions import decode_index, encode_index
from shardsafe.plan.layout import data_file_name


def fsdp_index(ranks: int, tensors: int) -> Index:
    """An FSDP-style index: every tensor cut into one (4, 1024) float32 chunk per rank."""
    files = tuple(FileEntry(data_file_name(r), 1 << 34, 1 << 20, r) for r in range(ranks))
    entries = []
    for i in range(tensors):
        chunks = tuple(ChunkEntry(files[r].name, (1 << 20) + i * (16 << 10), 16 << 10,
                                      (4 * r, 0), (4, 1024), (0x12345678,)) for r in range(ranks))
        entries.append(TensorEntry(("model", f"layers.{i}.weight"), "torch", "float32",
                                       (4 * ranks, 1024), chunks))
    keys = [f"layers.{i}.weight" for i in range(tensors)]
    tree = {"t": "dict", "k": ["model"],
            "v": [{"t": "dict", "k": keys, "v": [{"t": "tensor", "id": i} for i in range(tensors)]}]}
    return Index(tree=tree, tensors=tuple(entries), files=files, block_size=16 << 20,
                     world_size=ranks)


def test_bytes_per_chunk_stay_constant() -> None:
    sizes = {r: len(encode_index(fsdp_index(r, 50))) for r in (8, 32, 128)}
    # the marginal cost of a chunk is the same at every scale (a fixed part aside)
    small = (sizes[32] - sizes[8]) / (24 * 50)
    large = (sizes[128] - sizes[32]) / (96 * 50)
    assert abs(large - small) <= 0.10 * small, (small, large)
    assert large < 160  # about 130 bytes of JSON per chunk


@pytest.mark.stress
def test_index_of_1024_ranks_by_1000_tensors() -> None:
    t0 = time.perf_counter()
    data = encode_index(fsdp_index(1024, 1000))
    t1 = time.perf_counter()
    decode_index(data)
    t2 = time.perf_counter()
    print(f"\n1,024,000 chunks: index {len(data) / 1e6:.1f} MB, encode {t1 - t0:.1f} s, "
          f"decode {t2 - t1:.1f} s")
    assert len(data) < 160e6
