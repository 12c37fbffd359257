"""Property: any valid v1 index (grid-sharded tensors over several files) survives v1 -> v2 -> v1,
whichever tensors become split rules and whichever stay general."""

from __future__ import annotations

import dataclasses
import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.versions import decode_index, encode_index

ITEM = {"float32": 4, "int8": 1, "float64": 8}


@st.composite
def indexes(draw: st.DrawFn) -> Index:
    nfiles = draw(st.integers(1, 4))
    used = [4096] * nfiles
    tensors = []
    for t in range(draw(st.integers(0, 5))):
        dtype = draw(st.sampled_from(sorted(ITEM)))
        ndim = draw(st.integers(0, 3))
        shape = tuple(draw(st.integers(0 if ndim else 1, 5)) for _ in range(ndim))
        # cut each dimension at sorted random points: a grid of boxes that tiles the tensor
        cuts = [sorted(set([0, s] + draw(st.lists(st.integers(0, s), max_size=2)))) for s in shape]
        boxes = list(itertools.product(*[list(zip(c, c[1:])) or [(0, 0)] for c in cuts]))
        if draw(st.booleans()):
            boxes.reverse()
        chunks = []
        for box in boxes:
            f = draw(st.integers(0, nfiles - 1))
            ext = tuple(b - a for a, b in box)
            nbytes = math.prod(ext) * ITEM[dtype]
            chunks.append(ChunkEntry(f"d{f}", used[f], nbytes, tuple(a for a, _ in box), ext,
                                     (draw(st.integers(0, 2**32 - 1)),)))
            used[f] += nbytes
        tensors.append(TensorEntry((f"t{t}",), "torch", dtype, shape, tuple(chunks)))
    files = tuple(FileEntry(f"d{f}", used[f], 4096, f) for f in range(nfiles))
    tree = {"t": "dict", "k": [t.key[0] for t in tensors],
            "v": [{"t": "tensor", "id": i} for i in range(len(tensors))]}
    return Index(tree=tree, tensors=tuple(tensors), files=files, block_size=4096, world_size=nfiles)


@settings(max_examples=60, deadline=None)
@given(indexes())
def test_v1_v2_v1_round_trip(index: Index) -> None:
    assert decode_index(encode_index(index)) == index  # a valid v1 index to start from
    v2 = encode_index(index, version=2)
    assert dataclasses.replace(decode_index(v2), format_version=1) == index


@settings(max_examples=60, deadline=None)
@given(indexes())
def test_v3_holds_what_v2_holds(index: Index) -> None:
    v2, v3 = encode_index(index, version=2), encode_index(index, version=3)
    a, b = decode_index(v2), decode_index(v3)
    assert dataclasses.replace(b, format_version=1) == index
    assert a.table == b.table and tuple(a.infos) == tuple(b.infos)
    assert encode_index(b, version=3) == v3 and encode_index(b, version=2) == v2
