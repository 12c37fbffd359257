"""The vectorised load planner over a v2 chunk table agrees with ``pieces_for`` over v1 chunks."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from shardsafe.harness.synthetic_job import build_index
from shardsafe.format.index.rows import ChunkEntry
from shardsafe.format.index.versions import decode_index, encode_index
from shardsafe.format.index.objects import chunk_entries
from shardsafe.format.index.v2 import decode, encode
from shardsafe.plan.load_plan import pieces_for
from shardsafe.plan.table_reads import even_shard_reads, row_split_tensors


def _expected(index, t: int, rank: int, world: int) -> list[tuple[int, int, int, int]]:
    """(file id, byte offset, nbytes, dest byte offset) of rank's shard of tensor t, via pieces_for."""
    info = index.tensors[t]
    chunks = chunk_entries(index, t)
    names = {f.name: i for i, f in enumerate(index.files)}
    rows = info.shape[0]
    q = -(-rows // world)
    lo, hi = min(rank * q, rows), min(rank * q + q, rows)
    if hi <= lo:
        return []
    row_bytes = chunks[0].nbytes // chunks[0].shape[0]
    out = []
    for p in pieces_for(chunks, (lo,) + (0,) * (len(info.shape) - 1), (hi - lo,) + info.shape[1:]):
        (a, b), (d, _) = p.src[0], p.dst[0]
        assert all(s == (0, n) for s, n in zip(p.src[1:], info.shape[1:]))  # whole rows
        out.append((names[p.chunk.file], p.chunk.offset + a * row_bytes, (b - a) * row_bytes, d * row_bytes))
    return out


@pytest.mark.parametrize("saved,loading", [(8, 8), (8, 3), (5, 12), (16, 1), (7, 7)])
def test_reads_match_pieces_for(saved: int, loading: int) -> None:
    index = decode(encode(build_index(saved, 12)))
    ts = row_split_tensors(index.chunks)
    assert ts == list(range(12))
    for rank in range(loading):
        reads = even_shard_reads(index.chunks, ts, rank, loading)
        got = sorted(zip(reads.tensor.tolist(), reads.file.tolist(), reads.offset.tolist(),
                         reads.nbytes.tolist(), reads.dest.tolist()))
        want = sorted((t, *r) for t in ts for r in _expected(index, t, rank, loading))
        assert got == want
        # each read lies inside its chunk, at chunk_start bytes from the chunk's start
        assert np.array_equal(reads.offset - reads.chunk_start, index.chunks.offset[reads.row])
        assert (reads.chunk_start + reads.nbytes <= index.chunks.nbytes[reads.row]).all()


def test_the_shards_cover_every_byte_once() -> None:
    index = build_index(6, 10)
    ts = row_split_tensors(index.chunks)
    total = sum(int(even_shard_reads(index.chunks, ts, r, 4).nbytes.sum()) for r in range(4))
    assert total == sum(math.prod(i.shape) * (2 if i.dtype == "bfloat16" else 4) for i in index.tensors)


def test_general_tensors_are_refused() -> None:
    v1 = decode_index(encode(build_index(4, 3)))
    t0 = v1.tensors[0]
    # chunks listed out of order: no split rule reproduces them, so they stay general
    v1 = dataclasses.replace(v1, tensors=(dataclasses.replace(t0, chunks=t0.chunks[::-1]),) + v1.tensors[1:])
    table = decode(encode_index(v1, version=2)).chunks
    assert table.splits[0] is None and row_split_tensors(table) == [1, 2]
    with pytest.raises(ValueError, match="split along dimension 0"):
        even_shard_reads(table, [0, 1], 0, 2)
