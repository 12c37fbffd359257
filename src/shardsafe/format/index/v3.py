"""Index format version 3: version 2 with the tensor table as columns too.

The container (``container``) and the chunk columns are version 2's; what changes is the
tensor table. Version 2 writes a JSON object per tensor (key path, kind, dtype,
shape, chunk count, split rule): with 100,000 small tensors, encoding and decoding those
objects is most of the cost of a save's index and of a load. Version 3 stores them as
columns (docs/FORMAT.md section 14 is the byte-by-byte spec):

    kind    per tensor: 0 torch, 1 numpy, 2 jax
    dtype   per tensor: position in the JSON member ``dtypes`` (the element type names)
    ndim    per tensor: number of dimensions
    shape   the dimensions of every tensor, tensor after tensor
    chunks  per tensor: number of chunks
    split   per tensor: 0 for a general tensor, else 1 + the dimension it is cut along
    split_step, split_file0, split_stride   per split tensor: the rest of its rule

and a tensor's key path is where the tree places it (its ``{"t": "tensor", "id": i}``
node), so no key is stored twice. Decoding checks everything version 2 checks, with numpy
over the columns instead of a Python function per tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import tree
from ..dtypes import DTYPES, lookup
from .chunk_table import ChunkTable, Split, check_tensor_rows
from .container import (CODED_COLUMNS, COLUMNS, block_coding, header_members, narrowest, open_container,
                        read_columns, seal, stored_columns)
from .model import ColumnarIndex, TensorInfo
from .rules import (MAX_EXTENT_BYTES, MAX_NDIM, TENSOR_KINDS, bad, check_int, decode_files, dumps, header_fields,
                    tree_keys)

VERSION = 3
TENSOR_COLUMNS = ("kind", "dtype", "ndim", "shape", "chunks", "split", "split_step", "split_file0",
                  "split_stride")
I64 = np.int64


# ----------------------------------------------------------------------------- encoding


def tensor_columns(infos: Sequence[TensorInfo], ct: ChunkTable) -> tuple[list[str], dict[str, np.ndarray]]:
    """The dtype names (in first-use order) and the tensor columns of ``infos``."""
    n = len(infos)
    dtypes = list(dict.fromkeys(i.dtype for i in infos))
    dtype_id = {d: k for k, d in enumerate(dtypes)}
    kind_id = {k: i for i, k in enumerate(TENSOR_KINDS)}
    shapes = [i.shape for i in infos]
    splits = [(t, s) for t, s in enumerate(ct.splits) if s is not None]
    cols = {
        "kind": np.fromiter((kind_id[i.kind] for i in infos), dtype=I64, count=n),
        "dtype": np.fromiter((dtype_id[i.dtype] for i in infos), dtype=I64, count=n),
        "ndim": np.fromiter(map(len, shapes), dtype=I64, count=n),
        "shape": np.array([d for s in shapes for d in s], dtype=I64),
        "chunks": np.diff(ct.tensor_start),
        "split": np.zeros(n, dtype=I64),
        "split_step": np.array([s.step for _, s in splits], dtype=I64),
        "split_file0": np.array([s.file0 for _, s in splits], dtype=I64),
        "split_stride": np.array([s.file_stride for _, s in splits], dtype=I64),
    }
    if splits:
        cols["split"][[t for t, _ in splits]] = [s.dim + 1 for _, s in splits]
    return dtypes, cols


def encode(index: ColumnarIndex) -> bytes:
    """The bytes of a version 3 index."""
    ct = index.chunks
    dtypes, cols = tensor_columns(index.tensors, ct)
    cols.update(stored_columns(ct))
    names = TENSOR_COLUMNS + COLUMNS + (CODED_COLUMNS if ct.coding is not None else ())
    kinds = {n: ("<u4" if n.endswith("crc32c") else narrowest(cols[n])) for n in names}
    body: dict[str, Any] = {**header_members(index), "dtypes": dtypes,
                            "columns": {n: [kinds[n], len(cols[n])] for n in names}}
    if ct.coding is not None:
        body["codecs"] = list(ct.coding.codecs)
    body["tree"] = index.tree
    return seal(dumps(body).encode("utf-8"), [cols[n] for n in names], [kinds[n] for n in names], VERSION)


# ----------------------------------------------------------------------------- decoding


def _dtypes(raw: Any) -> list[Any]:
    """The ``dtypes`` member: distinct element type names of section 8."""
    if (not isinstance(raw, list) or len(raw) > len(DTYPES) or not all(isinstance(d, str) for d in raw)
            or len(set(raw)) != len(raw)):
        raise bad("dtypes must be a list of distinct dtype names")
    try:
        return [lookup(d) for d in raw]
    except ValueError as e:
        raise bad(f"dtypes: {e}") from None


def _shapes(ndim: np.ndarray, dims: np.ndarray) -> list[tuple[int, ...]]:
    """Each tensor's shape from the ``ndim`` and ``shape`` columns."""
    n = len(ndim)
    if n and (ndim == ndim[0]).all():  # tensors of one rank (the common case): one reshape
        return list(map(tuple, dims.reshape(n, int(ndim[0])).tolist()))
    flat, ends = dims.tolist(), np.cumsum(ndim).tolist()
    return [tuple(flat[e - k : e]) for e, k in zip(ends, ndim.tolist())]


def _check_extents(ndim: np.ndarray, dims: np.ndarray, itemsize: np.ndarray,
                   shapes: list[tuple[int, ...]]) -> None:
    """prod(max(dim, 1)) * itemsize <= 2^62 for every tensor (in logarithms, exactly
    in Python integers for the few close to the bound)."""
    logs = np.concatenate([[0.0], np.cumsum(np.log2(np.maximum(dims, 1).astype(np.float64)))])
    ends = np.cumsum(ndim)
    total = logs[ends] - logs[ends - ndim] + np.log2(itemsize.astype(np.float64))
    for t in np.flatnonzero(total > 61.5).tolist():
        if math.prod(max(d, 1) for d in shapes[t]) * int(itemsize[t]) > MAX_EXTENT_BYTES:
            raise bad(f"tensor {t}: absurd shape {list(shapes[t])}")


def tensor_table(raw: Any, cols: dict[str, np.ndarray]) -> tuple[
        list[str], list[str], list[tuple[int, ...]], list[int], list[int], list[Split | None]]:
    """The tensor columns, checked, as lists: kinds, dtype names, shapes, chunk counts,
    itemsizes and split rules (whose fit to their shape and to the files
    ``chunk_table.check_tensor_rows`` checks, with key paths for its messages)."""
    n = len(cols["kind"])
    if any(len(cols[c]) != n for c in ("dtype", "ndim", "chunks", "split")):
        raise bad("the per-tensor columns kind, dtype, ndim, chunks and split differ in length")
    dts = _dtypes(raw.get("dtypes"))
    kind, dtype, ndim, dims = cols["kind"], cols["dtype"], cols["ndim"], cols["shape"]
    if n and (int(kind.max()) >= len(TENSOR_KINDS) or int(dtype.max()) >= len(dts)):
        raise bad("a tensor's kind or dtype is out of range")
    has_numpy = np.array([d.numpy is not None for d in dts] + [True], dtype=bool)
    if ((kind == 1) & ~has_numpy[dtype]).any():
        raise bad(f"numpy cannot hold dtype {dts[int(dtype[np.argmax((kind == 1) & ~has_numpy[dtype])])].name}")
    if n and int(ndim.max()) > MAX_NDIM:
        raise bad(f"a tensor has more than {MAX_NDIM} dimensions")
    if int(ndim.sum()) != len(dims):
        raise bad(f"the shape column holds {len(dims)} values, the tensors' ndim need {int(ndim.sum())}")
    if n and int(cols["chunks"].max()) > 1 << 40:
        raise bad("a tensor has more than 2^40 chunks")
    split = cols["split"]
    cut = np.flatnonzero(split)
    if n and (split > ndim).any():
        raise bad("a tensor is split along a dimension it does not have")
    if any(len(cols[c]) != len(cut) for c in ("split_step", "split_file0", "split_stride")):
        raise bad(f"the split columns must hold one value per split tensor ({len(cut)})")
    itemsize = np.array([d.itemsize for d in dts] + [1], dtype=I64)[dtype]
    shapes = _shapes(ndim, dims)
    _check_extents(ndim, dims, itemsize, shapes)
    splits: list[Split | None] = [None] * n
    rules: dict[tuple[int, ...], Split] = {}
    for t, rule in zip(cut.tolist(), zip((split[cut] - 1).tolist(), cols["split_step"].tolist(),
                                         cols["split_file0"].tolist(), cols["split_stride"].tolist())):
        s = rules.get(rule)
        if s is None:
            s = rules[rule] = Split(*rule)
        splits[t] = s
    kinds = [TENSOR_KINDS[k] for k in kind.tolist()]
    names = [d.name for d in dts]
    return (kinds, [names[d] for d in dtype.tolist()], shapes, cols["chunks"].tolist(), itemsize.tolist(),
            splits)


def decode(data: bytes) -> ColumnarIndex:
    """Parses and validates version 3 index bytes; raises CorruptCheckpointError naming the problem."""
    raw, section = open_container(data, VERSION)
    block_size = check_int(raw.get("block_size"), "block_size", 4096, 1 << 40)
    files = decode_files(raw.get("files"))
    cols = read_columns(raw.get("columns"), section, TENSOR_COLUMNS + COLUMNS, CODED_COLUMNS, {})
    kinds, dtypes, shapes, counts, itemsizes, splits = tensor_table(raw, cols)
    keys = tree_keys(raw.get("tree"), len(kinds))

    def name(t: int) -> str:
        return tree.render_path(keys[t])

    check_tensor_rows(shapes, splits, counts, len(files), name)
    general = np.array([s is None for s in splits], dtype=bool)
    counts_a = np.asarray(counts, dtype=I64)
    ndims = cols["ndim"]
    want = {"offset": int(counts_a.sum()), "file": int(counts_a[general].sum()),
            "pos": int((counts_a * ndims)[general].sum())}
    want["extent"] = want["pos"]
    for c, n in want.items():
        if len(cols[c]) != n:
            raise bad(f"column {c} holds {len(cols[c])} values, the tensor columns need {n}")
    coding = block_coding(raw, cols)
    table = ChunkTable.build(
        shapes, itemsizes, splits, counts, cols["offset"], cols["file"], cols["pos"], cols["extent"],
        cols["crc32c"], block_size, np.array([f.size for f in files], dtype=I64),
        np.array([f.data_start for f in files], dtype=I64), name, coding)
    infos = tuple(map(TensorInfo, keys, kinds, dtypes, shapes))
    return ColumnarIndex(tree=raw["tree"], tensors=infos, files=files, chunks=table, **header_fields(raw))

