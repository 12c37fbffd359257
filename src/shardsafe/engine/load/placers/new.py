"""The placer of ``load(path)``: a new nested structure whose tensors are allocated, then read.

Works on the columns every decoded index has (whatever its version): a tensor stored as
one raw chunk (every tensor of a single-process save) is allocated and described to the
reader by its table row and the address of its memory, with no per-tensor index object;
anything else (sharded or compressed tensors) is described by its ``TensorEntry`` for
the reader's general path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ....values import torch as torch_values
from ...buffers import new_tensor
from ....format import INDEX_NAME, tree
from ....format.blockfile import RAW
from ....format.index.chunk_table import ChunkTable
from ....format.index.objects import Index
from ....storage.local import LocalStorage
from ....storage.memory import HUGE
from ...commit.locations import data_file
from ..match import TensorTarget
from ..request import LoadRequest
from . import Placement, tensor_bytes

if TYPE_CHECKING:
    from ..index_exchange import IndexRead


@dataclass(slots=True)
class Allocated:
    """What a new state's tensors need read.

    Attributes:
        tensors, rows, addrs: Tensors read whole from one raw chunk: tensor id, chunk row
            of the table, and the address of the tensor's (contiguous) memory.
        others: Tensors read through the reader's general path (``ReadJob``).
    """

    tensors: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    addrs: list[int] = field(default_factory=list)
    others: list[TensorTarget] = field(default_factory=list)


def whole_raw(table: ChunkTable) -> np.ndarray:
    """Per tensor: stored as one chunk, of the tensor's whole size, with every block raw.
    Such a tensor is one contiguous byte range of its file. (In a whole table validation
    made a tensor's one chunk cover it; a partial one, what a rank reads of a version 4
    index, may hold one chunk of many.)"""
    one = np.diff(table.tensor_start) == 1
    first = np.minimum(table.tensor_start[:-1], max(table.num_chunks - 1, 0))
    if not table.whole and one.any():
        size = np.array([math.prod(s) for s in table.shapes], dtype=np.int64) * table.itemsizes
        one &= table.nbytes[first] == size
    cd = table.coding
    if cd is None or not one.any():
        return one
    coded_ids = [i for i, name in enumerate(cd.codecs) if name != RAW]
    coded_block = np.isin(cd.codec, coded_ids)
    per_chunk = np.add.reduceat(coded_block.astype(np.int64), table.block_start[:-1]) \
        if len(coded_block) else np.zeros(table.num_chunks, dtype=np.int64)
    return one & (per_chunk[first] == 0) if table.num_chunks else one


def build(index: Index, cold_files: frozenset[int] = frozenset()) -> tuple[Any, Allocated]:
    """The new structure of ``index`` and what its tensors need read; a tensor stored raw
    in one of ``cold_files`` (file ids a load reads with direct I/O) gets huge pages
    (``buffers.new_tensor``)."""
    infos, table = index.infos, index.table
    assert infos is not None and table is not None, "a decoded index has its tables as columns"
    out = Allocated()
    whole_a = whole_raw(table)
    first = np.minimum(table.tensor_start[:-1], max(table.num_chunks - 1, 0))
    nbytes = np.where(whole_a, table.nbytes[first] if table.num_chunks else 0, 0).tolist()
    whole = whole_a.tolist()
    starts = table.tensor_start.tolist()
    cold = np.isin(table.file[first], list(cold_files)).tolist() if cold_files and table.num_chunks \
        else [False] * len(whole)
    torch_types = torch_values.torch_dtypes() if torch_values.HAVE_TORCH else {}

    def leaf(_: tree.KeyPath, node: tree.Node) -> Any:
        t = node["id"]
        _key, kind, dtype, shape = infos[t]
        if whole[t]:
            td = torch_types.get(dtype) if kind == "torch" else None
            if td is not None and nbytes[t] < HUGE:  # small: an allocation of torch's own
                x = torch_values.torch.empty(shape, dtype=td)
                addr = x.data_ptr()
            else:
                x, dest = new_tensor(kind, dtype, shape, huge=cold[t])
                addr = dest.ctypes.data
            out.tensors.append(t)
            out.rows.append(starts[t])
            out.addrs.append(addr)
            return x
        x, dest = new_tensor(kind, dtype, shape)
        out.others.append(TensorTarget(index.tensors[t], x, dest))
        return x

    return tree.build(index.tree, leaf), out


class NewTensors:
    """``load(path)``: the checkpoint's structure with new tensors (see the module docstring)."""

    def __init__(self, request: LoadRequest) -> None:
        self.request = request
        self._value: Any = None

    def place(self, read: IndexRead) -> Placement:
        self._value, new = build(read.index, cold_files(read))
        return Placement(read.index, new.others, new, tensor_bytes(read.index))

    def finish(self) -> Any:
        return self._value


def cold_files(read: IndexRead) -> frozenset[int]:
    """Ids of the data files a load will read (in part) with direct I/O (of those its
    index lists: a version 4 head lists the files of the tensors stored whole)."""
    storage = read.storage
    if not isinstance(storage, LocalStorage):  # only a local file is read with direct I/O
        return frozenset()
    return frozenset(i for i, f in enumerate(read.index.files)
                     if storage.reads_direct(data_file(storage, read.spath, f.name)))


def any_cold(read: IndexRead) -> bool:
    """Whether a load will read some of the checkpoint's own files with direct I/O."""
    storage = read.storage
    if read.head is None or not isinstance(storage, LocalStorage):
        return bool(cold_files(read))
    return any(storage.reads_direct(storage.join(read.spath, n)) for n in storage.list(read.spath)
               if n != INDEX_NAME)


__all__ = ["Allocated", "NewTensors", "any_cold", "build", "cold_files", "whole_raw"]
