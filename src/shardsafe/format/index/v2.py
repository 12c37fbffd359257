"""Index format version 2: the binary container (``container``) with the chunk table as
little-endian columns (docs/FORMAT.md section 11 is the byte-by-byte spec).

The JSON part holds what version 1 holds except the chunks: metadata, files, tensors (each
with its chunk count and, for an even split, the split rule), the tree, and each column's
element type and length. Decoding checks everything ``chunk_table`` and the rules of
FORMAT.md section 9 ask, with numpy, in time and memory linear in the index size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from itertools import chain, repeat
from operator import itemgetter, mul
from typing import Any

import numpy as np

from .. import tree
from ..dtypes import lookup
from .chunk_table import ChunkTable, Split, check_tensor_rows
from .container import (CODED_COLUMNS, COLUMNS, block_coding, header_members, narrowest, open_container,
                        read_columns, seal, stored_columns)
from .model import ColumnarIndex, TensorInfo
from .rules import (MAX_DIM, MAX_EXTENT_BYTES, MAX_NDIM, TENSOR_KINDS, bad, check_int, check_tree, decode_files, dumps,
                    header_fields, tensor_header, tensor_key)

VERSION = 2
# ----------------------------------------------------------------------------- encoding


def encode(index: ColumnarIndex) -> bytes:
    """The bytes of a version 2 index."""
    ct = index.chunks
    cols = stored_columns(ct)
    kinds = {n: ("<u4" if n.endswith("crc32c") else narrowest(a)) for n, a in cols.items()}
    names = COLUMNS + (CODED_COLUMNS if ct.coding is not None else ())
    body = header_members(index)
    rest: dict[str, Any] = {"columns": {n: [kinds[n], len(cols[n])] for n in names}}
    if ct.coding is not None:
        rest["codecs"] = list(ct.coding.codecs)
    rest["tree"] = index.tree
    head, tail = dumps(body), dumps(rest)
    # the JSON of {**body, "tensors": [...], **rest}, with the rows written as text
    js = "".join([head[:-1], ',"tensors":[', _tensor_rows(index.tensors, ct), "],", tail[1:]]).encode("utf-8")
    return seal(js, [cols[n] for n in names], [kinds[n] for n in names], VERSION)


def _tensor_rows(tensors: Sequence[TensorInfo], ct: ChunkTable) -> str:
    """The ``tensors`` rows as JSON text, as ``json.dumps`` writes them (one format per row:
    everything after the key is the same text for tensors of one kind, dtype, shape,
    chunk count and split, and is made once)."""
    esc = json.encoder.encode_basestring  # what json.dumps uses with ensure_ascii=False
    counts = np.diff(ct.tensor_start).tolist()
    tails: dict[tuple[Any, ...], str] = {}
    rows = []
    for info, count, split in zip(tensors, counts, ct.splits):
        key = info.key
        if len(key) == 1 and type(key[0]) is str:
            kt = "[" + esc(key[0]) + "]"
        elif all(type(k) is str or type(k) is int for k in key):
            kt = "[" + ",".join(esc(k) if type(k) is str else str(k) for k in key) + "]"
        else:
            kt = dumps(tree.encode_key_path(key))
        tk = (info.kind, info.dtype, info.shape, count, split)
        tail = tails.get(tk)
        if tail is None:
            row: dict[str, Any] = {"kind": info.kind, "dtype": info.dtype, "shape": list(info.shape),
                                   "chunks": int(count)}
            if split is not None:
                row["split"] = [split.dim, split.step, split.file0, split.file_stride]
            tail = tails[tk] = "," + dumps(row)[1:]
        rows.append('{"key":' + kt + tail)
    return ",".join(rows)


# ----------------------------------------------------------------------------- decoding


def _tensor(t: Any) -> tuple[TensorInfo, int, int, Split | None]:
    """One tensor row: (info, itemsize, chunk count, split)."""
    key = tensor_key(t)
    name = tree.render_path(key)
    kind, dt, shape_t = tensor_header(t, name)
    count = check_int(t.get("chunks"), f"chunk count of {name}", 0, 1 << 40)
    split = None
    if "split" in t:
        s = t["split"]
        if not isinstance(s, list) or len(s) != 4:
            raise bad(f"tensor {name}: split must be [dim, step, file0, file_stride]")
        split = Split(*(check_int(v, f"split of {name}") for v in s))
    return TensorInfo(key, kind, dt.name, shape_t), dt.itemsize, count, split


_ROW = itemgetter("key", "kind", "dtype", "shape", "chunks")


def _tensor_columns(rows: list[Any]) -> tuple[tuple[TensorInfo, ...], list[int], list[int],
                                              list[Split | None]] | None:
    """``_tensor`` of every row at once, checked column by column (set and min/max tests
    over all rows instead of a Python function per row). None when any row is unusual in
    any way, even a valid one: the caller then checks row by row, which names the problem.
    """
    if not rows:
        return (), [], [], []
    if set(map(type, rows)) != {dict}:
        return None
    try:
        keys, kinds, dtypes, shapes, counts = zip(*map(_ROW, rows))
        dts = {d: lookup(d) for d in set(dtypes)}
    except (KeyError, TypeError, ValueError):  # a member missing, an unhashable or unknown dtype
        return None
    if set(map(type, keys)) != {list} or not set(kinds) <= set(TENSOR_KINDS):
        return None
    if not set(map(type, chain.from_iterable(keys))) <= {str, int}:  # bool is not int here
        return None
    if any(k == "numpy" and dts[d].numpy is None for k, d in set(zip(kinds, dtypes))):
        return None
    if set(map(type, shapes)) != {list} or max(map(len, shapes)) > MAX_NDIM:
        return None
    dims = list(chain.from_iterable(shapes))
    if not set(map(type, dims)) <= {int} or (dims and (min(dims) < 1 or max(dims) > MAX_DIM)):
        return None  # (zero-size tensors: the extent bound needs max(dim, 1), row by row)
    if set(map(type, counts)) != {int} or min(counts) < 0 or max(counts) > 1 << 40:
        return None
    shape_t = list(map(tuple, shapes))
    itemsizes = [dts[d].itemsize for d in dtypes]
    if max(map(mul, map(math.prod, shape_t), itemsizes)) > MAX_EXTENT_BYTES:
        return None
    splits = _split_rules(list(map(dict.get, rows, repeat("split"))))
    if splits is None:
        return None
    infos = tuple(map(TensorInfo, map(tuple, keys), kinds, dtypes, shape_t))
    return infos, itemsizes, list(counts), splits


def _split_rules(raw: list[Any]) -> list[Split | None] | None:
    """The ``split`` members as ``Split`` objects (one shared object per distinct rule), or
    None when one is not a list of 4 integers."""
    rules: dict[tuple[int, ...], Split] = {}
    out: list[Split | None] = []
    for s in raw:
        if s is None:
            out.append(None)
            continue
        if type(s) is not list or len(s) != 4:
            return None
        key = tuple(s)
        sp = rules.get(key)
        if sp is None:
            if not all(type(v) is int and 0 <= v <= MAX_DIM for v in key):
                return None
            sp = rules[key] = Split(*key)
        out.append(sp)
    return out


def decode(data: bytes) -> ColumnarIndex:
    """Parses and validates version 2 index bytes; raises CorruptCheckpointError naming the problem."""
    raw, section = open_container(data, VERSION)
    block_size = check_int(raw.get("block_size"), "block_size", 4096, 1 << 40)
    files = decode_files(raw.get("files"))
    if not isinstance(raw.get("tensors"), list):
        raise bad("tensors must be a list")
    fast = _tensor_columns(raw["tensors"])
    if fast is not None:
        infos, itemsizes, counts, splits = fast
    else:  # something is unusual: the row-by-row check names it
        rows = [_tensor(t) for t in raw["tensors"]]
        infos = tuple(r[0] for r in rows)
        itemsizes, counts, splits = [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]

    def name(t: int) -> str:
        return tree.render_path(infos[t].key)

    check_tensor_rows([i.shape for i in infos], splits, counts, len(files), name)
    general = [(c, len(i.shape)) for i, c, s in zip(infos, counts, splits) if s is None]
    cols = read_columns(raw.get("columns"), section, COLUMNS, CODED_COLUMNS, {
        "offset": sum(counts), "file": sum(c for c, _ in general),
        "pos": sum(c * d for c, d in general), "extent": sum(c * d for c, d in general),
        "crc32c": None, "codec": None, "stored": None, "stored_crc32c": None})
    coding = block_coding(raw, cols)
    table = ChunkTable.build(
        [i.shape for i in infos], itemsizes, splits, counts, cols["offset"], cols["file"],
        cols["pos"], cols["extent"], cols["crc32c"], block_size,
        np.array([f.size for f in files], dtype=np.int64),
        np.array([f.data_start for f in files], dtype=np.int64), name, coding)
    check_tree(raw.get("tree"), [i.key for i in infos])
    return ColumnarIndex(tree=raw["tree"], tensors=infos, files=files, chunks=table,
                         **header_fields(raw))
