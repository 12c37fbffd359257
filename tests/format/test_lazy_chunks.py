"""A v2 index's tensors keep their chunks as columns: ``LazyChunks`` acts like the v1 tuple,
and ``TensorEntry.overlapping`` picks (only) the chunks a region needs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardsafe.harness.synthetic_job import build_index
from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.versions import decode_index, encode_index
from shardsafe.format.index.v2 import encode
from shardsafe.format.index.objects import LazyChunks
from shardsafe.plan.load_plan import pieces_for


def _meets(c: ChunkEntry, offsets, shape) -> bool:
    return all(max(o, a) < min(o + s, a + n) for o, s, a, n in zip(c.offsets, c.shape, offsets, shape))


def _grid_index() -> Index:
    """A 6x4 tensor stored as a 3x2 grid of chunks (general form: no split rule fits)."""
    chunks = tuple(ChunkEntry("data-r00000-000.safetensors", 64 + 16 * k, 16, (2 * i, 2 * j), (2, 2), (k,))
                   for k, (i, j) in enumerate(itertools.product(range(3), range(2))))
    return Index(tree={"t": "dict", "k": ["g"], "v": [{"t": "tensor", "id": 0}]},
                 tensors=(TensorEntry(("g",), "torch", "float32", (6, 4), chunks),),
                 files=(FileEntry("data-r00000-000.safetensors", 64 + 96, 64),), block_size=4096)


def test_v2_decode_keeps_chunks_lazy_and_equal_to_v1() -> None:
    v2 = decode_index(encode(build_index(6, 10)))
    assert v2.format_version == 2 and v2.table is not None
    assert all(isinstance(t.chunks, LazyChunks) for t in v2.tensors)
    assert len(v2.tensors[0].chunks) == 6 and v2.tensors[0].chunks._all is None  # noqa: SLF001
    v1 = decode_index(encode_index(v2, version=1))
    assert v1.tensors == v2.tensors and v2.tensors == v1.tensors  # LazyChunks == tuple, both ways
    assert [t.nbytes for t in v1.tensors] == [t.nbytes for t in v2.tensors]


@pytest.mark.parametrize("build", [lambda: encode(build_index(5, 12)),
                                   lambda: encode_index(_grid_index(), version=2)])
def test_overlapping_is_exactly_the_chunks_that_meet_the_region(build) -> None:
    v2 = decode_index(build())
    for e in v2.tensors:
        every = tuple(e.chunks)
        for lo in range(0, e.shape[0] + 1, 1):
            for n in (0, 1, 2, 3, e.shape[0]):
                n = min(n, e.shape[0] - lo)
                offsets, shape = (lo,) + (0,) * (len(e.shape) - 1), (n,) + e.shape[1:]
                fresh = decode_index(build()).tensors[v2.tensors.index(e)]
                got = fresh.overlapping(offsets, shape)
                assert fresh.chunks._all is None  # noqa: SLF001  nothing else was built
                assert list(got) == [c for c in every if _meets(c, offsets, shape)]
                assert pieces_for(got, offsets, shape) == pieces_for(every, offsets, shape)


def test_overlapping_of_a_grid_in_the_second_dimension() -> None:
    e = decode_index(encode_index(_grid_index(), version=2)).tensors[0]
    got = e.overlapping((1, 2), (3, 2))
    assert [c.offsets for c in got] == [(0, 2), (2, 2)]
    assert np.array_equal([c.checksums[0] for c in got], [1, 3])
