"""Checksum sub-blocks: joining their CRC32Cs, which bytes a partial read reads, and the
index columns that record them (docs/FORMAT.md section 15.7), including forged ones."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.checksum import crc32c
from shardsafe.format.index.chunk_table import ChunkTable
from shardsafe.format.index.model import ColumnarIndex, TensorInfo
from shardsafe.format.index.rows import FileEntry
from shardsafe.format.index.chunk_table import Split
from shardsafe.format.index.v4_global import GlobalPart
from shardsafe.format.index.versions import decode, encode_columnar
from shardsafe.format.sub_blocks import SubBlocks, join_sub_crcs, num_sub_blocks, partial_read

SUB, BLOCK = 4096, 16384


@pytest.mark.parametrize("n", [1, 4095, 4096, 4097, 3 * 4096, 4 * 4096])
def test_sub_block_crcs_join_to_the_block_crc(n):
    data = os.urandom(n)
    parts = [crc32c(data[i : i + SUB]) for i in range(0, n, SUB)]
    assert join_sub_crcs(parts, SUB, n - (len(parts) - 1) * SUB) == crc32c(data)


def test_partial_read_spans():
    subs = (1,) * 10  # a chunk of 10 sub-blocks of 4096 bytes (40,000 bytes: the last one shorter)
    r = partial_read(40000, subs, False, 5000, 9000, BLOCK)
    assert (r.start, r.stop, r.sub_size) == (4096, 12288, SUB)
    assert partial_read(40000, subs, False, 39000, 40000, BLOCK).stop == 40000
    assert (partial_read(40000, (), False, 5000, 9000, BLOCK).start, partial_read(40000, (), False, 5000, 9000,
            BLOCK).stop) == (0, BLOCK)
    assert partial_read(40000, subs, True, 5000, 9000, BLOCK).sub_size == BLOCK  # compressed: whole blocks
    assert num_sub_blocks(np.array([0, 4096, 4097, 40000]), SUB).tolist() == [0, 0, 2, 10]


def _index(sub: SubBlocks | None, nbytes: int = 40000, ranks: int = 2) -> ColumnarIndex:
    """``w``: float32 split along dimension 0 over ``ranks`` files, ``nbytes`` per chunk;
    ``s``: one chunk of ``nbytes`` bytes in file 0 (stored in the global part)."""
    rows = nbytes // 4
    files = tuple(FileEntry(f"data-r{r:05d}-000.safetensors", 4096 + 2 * nbytes, 4096, r) for r in range(ranks))
    per = -(-nbytes // BLOCK)
    sums = np.arange(1, per * (ranks + 1) + 1, dtype=np.uint32)
    table = ChunkTable.build([(rows * ranks,), (rows,)], [4, 4], [Split(0, rows, 0, 1), Split(0, rows, 0, 0)],
                             [ranks, 1], np.array([4096] * ranks + [4096 + nbytes], dtype=np.int64),
                             np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), sums, BLOCK,
                             np.array([f.size for f in files]), np.array([f.data_start for f in files]))
    if sub is not None:
        table = replace(table, sub=sub)
    infos = (TensorInfo(("w",), "torch", "float32", (rows * ranks,)), TensorInfo(("s",), "torch", "float32", (rows,)))
    tree = {"t": "dict", "k": ["w", "s"], "v": [{"t": "tensor", "id": 0}, {"t": "tensor", "id": 1}]}
    return ColumnarIndex(tree=tree, tensors=infos, files=files, chunks=table)


def _subs(nchunks: int, nbytes: int = 40000) -> SubBlocks:
    n = int(num_sub_blocks(np.array([nbytes]), SUB)[0]) * nchunks
    return SubBlocks.of(SUB, np.arange(100, 100 + n, dtype=np.uint32), np.full(nchunks, nbytes))


def test_sub_blocks_round_trip_whole_and_in_parts():
    sub = _subs(3)
    data = encode_columnar(_index(sub), 4)
    got, _ = decode(data)
    assert got.chunks.sub == sub
    g = GlobalPart.decode(data)
    entries = g.header.entries(memoryview(data)[g.header.directory : g.header.parts_start], 0)
    part = g.narrow({1: (memoryview(data)[entries[1][0] : entries[1][0] + entries[1][1]], entries[1])})
    rows = part.chunks  # w's chunk in part 1, and s (from the global part)
    assert rows.sub is not None and rows.sub.checksums.tolist() == sub.rows(np.array([1, 2])).tolist()


def test_an_index_without_sub_blocks_is_unchanged():
    data = encode_columnar(_index(None), 4)
    assert b"sub" not in data
    assert decode(data)[0].chunks.sub is None


@pytest.mark.parametrize("forge,message", [
    (lambda s: SubBlocks(SUB, s.checksums[:-1], s.start - [0, 0, 0, 1]), "whole_sub_crc32c"),  # one short
    (lambda s: SubBlocks(SUB, np.append(s.checksums, 7), s.start + [0, 0, 0, 1]), "whole_sub_crc32c"),  # one more
    (lambda s: SubBlocks(3000, s.checksums, s.start), "power of two"),
    (lambda s: SubBlocks(2 * BLOCK, s.checksums, s.start), "divide block_size"),
])
def test_forged_sub_block_columns_are_refused(forge, message):
    data = encode_columnar(_index(forge(_subs(3))), 4)
    with pytest.raises(CorruptCheckpointError, match=message):
        decode(data)


def test_sub_block_count_is_checked_in_a_part_read_alone():
    sub = _subs(3)
    short = SubBlocks(SUB, sub.checksums[:-1], sub.start - [0, 0, 1, 1])  # part 1's chunk one short
    data = encode_columnar(_index(short), 4)
    g = GlobalPart.decode(data)
    entries = g.header.entries(memoryview(data)[g.header.directory : g.header.parts_start], 0)
    with pytest.raises(CorruptCheckpointError, match="sub_crc32c"):
        g.narrow({1: (memoryview(data)[entries[1][0] : entries[1][0] + entries[1][1]], entries[1])})
