"""Rank entries as binary columns, and the v2 index rank 0 builds from them (engine.commit.entries)."""

from __future__ import annotations

import numpy as np
import pytest

from shardsafe.engine.commit.entries import columnar_index, decode, encode, from_plans
from shardsafe.errors import CheckpointError
from shardsafe.format.index.versions import decode_index
from shardsafe.format.index.v2 import encode as encode_v2
from shardsafe.plan.flatten import TensorItem
from shardsafe.plan.layout import data_file_name, plan_file

TREE = {"t": "dict", "k": ["w", "g", "s"], "v": [{"t": "tensor", "id": 0}, {"t": "tensor", "id": 1},
                                                  {"t": "tensor", "id": 2}]}


def _items(rank: int, world: int) -> list[TensorItem]:
    """Rank's items: ``w`` (6x4) split by rows, ``g`` (4x4) a 2x2 grid, ``s`` a scalar on rank 0."""
    rows = 6 // world
    g = [(0, 0), (0, 2), (2, 0), (2, 2)][rank::world]
    out = [TensorItem(0, ("w",), np.zeros((rows, 4), np.float32), "numpy", "float32", (6, 4), (rank * rows, 0),
                      False)]
    out += [TensorItem(1, ("g",), np.zeros((2, 2), np.int16), "numpy", "int16", (4, 4), o, False) for o in g]
    if rank == 0:
        out.append(TensorItem(2, ("s",), np.zeros((), np.float64), "numpy", "float64", (), (), True))
    return out


def _parts(world: int, ranks: list[int] | None = None) -> tuple[list[TensorItem], list]:
    parts, everything = [], {}
    for r in range(world) if ranks is None else ranks:
        items = _items(r, world)
        plan = plan_file(data_file_name(r), items)
        sums = [[1000 * r + k] for k in range(len(items))]
        parts.append(decode(encode(from_plans([plan], [sums], r))))
        for it in items:
            everything.setdefault(it.id, it)
    return [everything[i] for i in sorted(everything)], parts


@pytest.mark.parametrize("world", [1, 2])
def test_rank_entries_become_the_same_index_as_chunk_objects(world: int) -> None:
    items, parts = _parts(world)
    ci = columnar_index(items, parts, 4096, tree=TREE, world_size=world, created=1.0)
    index = decode_index(encode_v2(ci))
    assert [len(t.chunks) for t in index.tensors] == [world, 4, 1]
    assert ci.chunks.splits[0] is not None and ci.chunks.splits[1] is None  # rows: a split rule
    for t in index.tensors:  # chunks in global-offset order
        assert [c.offsets for c in t.chunks] == sorted(c.offsets for c in t.chunks)
    w = index.tensors[0].chunks
    assert [c.file for c in w] == [data_file_name(r) for r in range(world)]
    assert [c.checksums for c in w] == [(1000 * r,) for r in range(world)]
    assert index.tensors[2].chunks[0].shape == () and [f.rank for f in index.files] == list(range(world))


def test_part_order_changes_file_ids_not_chunks() -> None:
    items, parts = _parts(2)
    _, backwards = _parts(2, [1, 0])
    a, b = (decode_index(encode_v2(columnar_index(items, p, 4096, tree=TREE, world_size=2)))
            for p in (parts, backwards))
    assert a.tensors == b.tensors and a.files == b.files[::-1]


def test_missing_chunks_are_refused_naming_the_tensor() -> None:
    items, parts = _parts(2)
    with pytest.raises(CheckpointError, match=r"chunks of 'w' hold 12 elements, its global shape \[6, 4\] needs 24"):
        columnar_index(items, parts[:1], 4096, tree=TREE, world_size=2)


def test_malformed_entries_are_a_checkpoint_error() -> None:
    data = encode(from_plans([plan_file(data_file_name(0), _items(0, 1))], [[[1], [2], [3], [4], [5], [6]]], 0))
    with pytest.raises(CheckpointError, match="malformed chunk entries"):
        decode(data[:-3])


def test_block_file_entries_carry_their_coding_into_the_index() -> None:
    """A rank's block file (compressed chunks) next to its safetensors file: the coding
    columns survive encode/decode, raw blocks get their stored size and checksum filled in,
    and the index decodes with each chunk's ``StoredBlocks``."""
    from shardsafe.engine.commit.entries import CodedFile, from_block_files, join
    from shardsafe.format.codec import CODECS
    from shardsafe.plan.layout import block_file_name

    items = [TensorItem(0, ("w",), np.zeros((1024, 8), np.float32), "numpy", "float32", (1024, 8), (0, 0), False),
             TensorItem(1, ("s",), np.zeros(3, np.int16), "numpy", "int16", (3,), (0,), False)]
    plain = from_plans([plan_file(data_file_name(0), items[1:])], [[[7]]], 0)
    zstd = CODECS.index("zstd")
    written = CodedFile(name=block_file_name(0), size=8 + 100, items=items[:1], offsets=[8], sums=[[0xABC]],
                        codec=[[zstd]], stored=[[100]], stored_sums=[[0xDEF]])
    coded = from_block_files([written], 0)
    part = decode(encode(join([plain, coded])))
    index = decode_index(encode_v2(columnar_index(items, [part], 16 << 20, tree={
        "t": "dict", "k": ["w", "s"], "v": [{"t": "tensor", "id": 0}, {"t": "tensor", "id": 1}]})))
    w, s = (t.chunks[0] for t in index.tensors)
    assert (w.file, w.offset, w.checksums) == (block_file_name(0), 8, (0xABC,))
    assert w.stored is not None and (w.stored.codecs, w.stored.sizes, w.stored.checksums) == (("zstd",), (100,), (0xDEF,))
    assert s.stored is None and s.checksums == (7,)
    raw_block = index.table.coding.codec.tolist().index(CODECS.index("raw"))
    assert index.table.coding.stored[raw_block] == 6 and index.table.coding.checksums[raw_block] == 7


def test_uncompressed_entries_send_no_coding_columns() -> None:
    import json
    import struct

    plain = from_plans([plan_file(data_file_name(0), _items(0, 2))], [[[1], [2], [3], [4]]], 0)
    data = encode(plain)
    (n,) = struct.unpack_from("<Q", data)
    assert json.loads(data[8 : 8 + n])["lengths"][-3:] == [0, 0, 0]
    back = decode(data)
    assert back.codec.tolist() == back.stored.tolist() == back.stored_sums.tolist() == [0, 0, 0, 0]
