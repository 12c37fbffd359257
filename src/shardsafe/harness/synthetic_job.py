"""The checkpoint of a simulated FSDP job, built without processes: R ranks, T tensors
(2-D weights and 1-D norms, some with rows that do not divide evenly), each split along
dimension 0 over the ranks, one data file per rank. ``build_index`` gives its columnar index,
built with the real chunk table; ``bench.scale`` times the format and the planners on it
and the format and plan tests use it as a large realistic input.
"""

from __future__ import annotations

import numpy as np

from ..format.index.chunk_table import ChunkTable, Split, num_blocks
from ..format.index.model import ColumnarIndex, TensorInfo
from ..format.index.rows import FileEntry
from ..format.tree import Node
from ..plan.layout import data_file_name

BLOCK = 16 << 20  # the checksum block size of the simulated checkpoint
DATA_START = 4096  # where each data file's tensor bytes begin


def job_shapes(ranks: int, tensors: int) -> list[tuple[tuple[int, ...], str]]:
    """(global shape, dtype) of each tensor: 2-D weights and 1-D norms, some rows uneven."""
    out = []
    for t in range(tensors):
        rows = ranks * (1 + t % 3) - (3 if t % 10 == 7 else 0)
        dtype = "bfloat16" if t % 4 == 1 else "float32"
        out.append(((rows,), dtype) if t % 5 == 4 else ((rows, 256 + 64 * (t % 4)), dtype))
    return out


def job_tensors(ranks: int, tensors: int) -> tuple[tuple[TensorInfo, ...], Node]:
    """The tensors of the simulated job and its structure tree (``model.layers.<i>.w<j>``)."""
    infos = tuple(TensorInfo(("model", "layers", t // 10, f"w{t % 10}"), "torch", d, s)
                  for t, (s, d) in enumerate(job_shapes(ranks, tensors)))
    layers: dict[int, list[tuple[str, int]]] = {}
    for t, info in enumerate(infos):
        layers.setdefault(int(info.key[2]), []).append((str(info.key[3]), t))
    tree = {"t": "dict", "k": ["model"], "v": [{"t": "dict", "k": ["layers"], "v": [
        {"t": "dict", "k": list(layers), "v": [
            {"t": "dict", "k": [k for k, _ in ws], "v": [{"t": "tensor", "id": t} for _, t in ws]}
            for ws in layers.values()]}]}]}
    return infos, tree


def build_index(ranks: int, tensors: int, seed: int = 0) -> ColumnarIndex:
    """The columnar index of the simulated job (rank r writes part r of every tensor to file r)."""
    shapes = job_shapes(ranks, tensors)
    item = np.array([2 if d == "bfloat16" else 4 for _, d in shapes], dtype=np.int64)
    rows = np.array([s[0] for s, _ in shapes], dtype=np.int64)
    inner = np.array([int(np.prod(s[1:])) for s, _ in shapes], dtype=np.int64) * item
    step = -(-rows // ranks)
    parts = -(-rows // step)
    # bytes of part r of tensor t: [tensors, ranks] (0 where the uneven split left rank r nothing)
    r = np.arange(ranks, dtype=np.int64)
    nb = np.clip(rows[:, None] - r[None, :] * step[:, None], 0, step[:, None]) * inner[:, None]
    order = np.argsort(-item, kind="stable")  # the data-file layout: larger elements first
    off = np.empty_like(nb)
    off[order] = DATA_START + np.cumsum(nb[order], axis=0) - nb[order]
    sizes = DATA_START + nb.sum(axis=0)
    keep = r[None, :] < parts[:, None]  # tensor-major rows: part i of tensor t is row start_t + i
    offsets = off[keep]
    del off
    nbytes = nb[keep]
    del nb, keep
    rng = np.random.default_rng(seed)
    sums = rng.integers(0, 1 << 32, int(num_blocks(nbytes, BLOCK).sum()), dtype=np.uint32)
    files = tuple(FileEntry(data_file_name(i), int(sizes[i]), DATA_START, i) for i in range(ranks))
    infos, tree = job_tensors(ranks, tensors)
    table = ChunkTable.build(
        [s for s, _ in shapes], item.tolist(), [Split(0, int(st), 0, 1) for st in step],
        parts.tolist(), offsets, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
        sums, BLOCK, sizes, np.full(ranks, DATA_START, dtype=np.int64))
    return ColumnarIndex(tree=tree, tensors=infos, files=files, chunks=table, world_size=ranks,
                         created=1767225600.0, library="shardsafe bench.scale")
