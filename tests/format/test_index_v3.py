"""Index format version 3: what saves write decodes to what they saved, and every forged
tensor column is refused with a CorruptCheckpointError naming the problem."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from v3_forge import seal_v3, split_v3

from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.index.chunk_table import Split
from shardsafe.format.index.container import check_metadata
from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.versions import decode_index, encode_index

F0, F1 = "d0", "d1"


def _index() -> Index:
    """w: float32 [4, 2] split over two files; g: numpy int64 [2, 2] as 2 chunks; s: a scalar;
    e: an empty tensor; b: bfloat16 [3]."""
    tensors = (
        TensorEntry(("w",), "torch", "float32", (4, 2), (
            ChunkEntry(F0, 4096, 16, (0, 0), (2, 2), (1,)), ChunkEntry(F1, 4096, 16, (2, 0), (2, 2), (2,)))),
        TensorEntry(("g", 0), "numpy", "int64", (2, 2), (
            ChunkEntry(F0, 4112, 16, (0, 0), (1, 2), (3,)), ChunkEntry(F0, 4128, 16, (1, 0), (1, 2), (4,)))),
        TensorEntry(("s",), "torch", "float16", (), (ChunkEntry(F1, 4112, 2, (), (), (5,)),)),
        TensorEntry(("e",), "torch", "float32", (0, 3), (ChunkEntry(F1, 4114, 0, (0, 0), (0, 3), (0,)),)),
        TensorEntry(("b",), "torch", "bfloat16", (3,), (ChunkEntry(F1, 4114, 6, (0,), (3,), (6,)),)),
    )
    tree = {"t": "dict", "k": ["w", "g", "s", "e", "b", "n"], "v": [
        {"t": "tensor", "id": 0}, {"t": "list", "v": [{"t": "tensor", "id": 1}]}, {"t": "tensor", "id": 2},
        {"t": "tensor", "id": 3}, {"t": "tensor", "id": 4}, {"t": "alias", "id": 0}]}
    return Index(tree=tree, tensors=tensors, files=(FileEntry(F0, 4144, 4096, 0), FileEntry(F1, 4120, 4096, 1)),
                 block_size=4096, world_size=2, metadata={"m": 1})


@pytest.mark.parametrize("metadata, error", [
    ({"loss": float("nan")}, ValueError), ({"x": object()}, TypeError), ({"s": "\ud800"}, ValueError),
    ({"deep": [{"x": float("inf")}]}, ValueError)])
def test_metadata_the_index_cannot_hold_is_refused(metadata, error) -> None:
    with pytest.raises(error):
        check_metadata(metadata)
    with pytest.raises(error):  # the check refuses exactly what the encoder would
        encode_index(dataclasses.replace(_index(), metadata=metadata), version=3)


def test_metadata_the_check_accepts_round_trips() -> None:
    metadata = {"a": [1, 2.5, None, True, "ü"], "b": {"c": {}}, "shardsafe.manager": {"step": 3}}
    check_metadata(metadata)
    assert decode_index(encode_index(dataclasses.replace(_index(), metadata=metadata), version=3)).metadata == metadata


def test_round_trip_and_split_rules() -> None:
    index = _index()
    back = decode_index(encode_index(index, version=3))
    assert back.format_version == 3 and back.tensors == index.tensors and back.tree == index.tree
    assert back.table.splits[:3] == (Split(0, 2, 0, 1), Split(0, 1, 0, 0), None)  # a scalar is general
    assert [i.key for i in back.infos] == [("w",), ("g", 0), ("s",), ("e",), ("b",)]


def _forged(edit) -> bytes:  # noqa: ANN001
    js, cols = split_v3(encode_index(_index(), version=3))
    edit(js, cols)
    return seal_v3(js, cols)


def _set(col: str, i: int, value: int):  # noqa: ANN202
    def edit(js, cols):  # noqa: ANN001, ANN202
        cols[col] = cols[col].copy()
        cols[col][i] = value
    return edit


def _drop(col: str):  # noqa: ANN202
    def edit(js, cols):  # noqa: ANN001, ANN202
        cols[col] = cols[col][:-1]
    return edit


def _json(key: str, value: object):  # noqa: ANN202
    def edit(js, cols):  # noqa: ANN001, ANN202
        js[key] = value
    return edit


def _tree_drops_tensor(js, cols) -> None:  # noqa: ANN001
    js["tree"]["v"][2] = {"t": "int", "v": 1}


FORGED = [
    ("kind out of range", _set("kind", 0, 3), "kind or dtype"),
    ("dtype out of range", _set("dtype", 1, 9), "kind or dtype"),
    ("numpy bfloat16", _set("kind", 4, 1), "numpy cannot hold dtype bfloat16"),
    ("ndim above 64", _set("ndim", 0, 65), "dimensions"),
    ("shape count", _drop("shape"), "shape column"),
    ("ndim vs shape", _set("ndim", 2, 1), "shape column"),
    ("absurd shape", _set("shape", 0, 2**62), "absurd shape|outside|chunks hold"),
    ("chunks beyond 2^40", _set("chunks", 2, 2**41), "2\\^40"),
    ("chunk count vs offsets", _set("chunks", 2, 2), "column offset"),
    ("split beyond ndim", _set("split", 2, 1), "dimension it does not have"),
    ("split columns short", _drop("split_step"), "one value per split tensor"),
    ("split step zero", _set("split_step", 0, 0), "does not fit"),
    ("split file beyond", _set("split_file0", 0, 5), "files beyond"),
    ("per-tensor lengths", _drop("chunks"), "differ in length"),
    ("unknown dtype name", _json("dtypes", ["float32", "int64", "float16", "nope", "bfloat16"]), "dtypes"),
    ("duplicate dtype names", _json("dtypes", ["float32", "float32", "float16", "float32", "bfloat16"]), "distinct"),
    ("dtypes not a list", _json("dtypes", "float32"), "dtypes"),
    ("tree misses a tensor", _tree_drops_tensor, "every tensor entry exactly once"),
]


@pytest.mark.parametrize("name,edit,message", FORGED, ids=[f[0] for f in FORGED])
def test_forged_tensor_columns_are_refused(name, edit, message) -> None:  # noqa: ANN001
    with pytest.raises(CorruptCheckpointError, match=message):
        decode_index(_forged(edit))


def test_an_index_of_another_version_is_refused() -> None:
    data = bytearray(encode_index(_index(), version=3))
    data[8] = 4
    with pytest.raises(CorruptCheckpointError, match="format_version 4"):
        decode_index(bytes(data))


def test_many_tensors_of_one_shape_and_of_many_ranks() -> None:
    shapes = [(16,)] * 50 + [(2, 3), (), (1, 1, 1, 1)] * 10
    at = 4096
    tensors = []
    for t, shape in enumerate(shapes):
        n = int(np.prod(shape)) * 4
        tensors.append(TensorEntry((f"t{t}",), "torch", "float32", shape,
                                   (ChunkEntry(F0, at, n, (0,) * len(shape), shape, (t,)),)))
        at += n
    index = Index(tree={"t": "dict", "k": [f"t{t}" for t in range(len(shapes))],
                        "v": [{"t": "tensor", "id": t} for t in range(len(shapes))]},
                  tensors=tuple(tensors), files=(FileEntry(F0, at, 4096, 0),), block_size=4096)
    back = decode_index(encode_index(index, version=3))
    assert back.tensors == index.tensors and [i.shape for i in back.infos] == shapes
