"""``load(path, mmap=True)``: tensors that are zero-copy views of memory-mapped data files.

Checksums are verified up front, all blocks in parallel on the I/O pool, before any
tensor is returned: a corrupt checkpoint never yields a tensor, and nothing needs to
hook tensor access later. The saving is memory (the page cache is the only copy; no
anonymous memory is allocated) rather than I/O: every byte is read once to verify it.

The mappings are private copy-on-write (``MAP_PRIVATE``): writing to a returned tensor
changes only this process's copy, never the checkpoint. A file changed by someone else
after verification may still show through pages not yet copied; checkpoints are
immutable once committed, so that would be tampering, not a crash.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from .. import tensors
from ..errors import CorruptCheckpointError
from ..format.checksum import blocks
from ..format.dtypes import lookup
from ..format.index import Index
from ..format.tree import KeyPath, Node, build, render_path
from ..storage.files import open_regular
from ..storage.local import LocalStorage
from .locations import data_file
from .io_pool import io_pool, wait_all
from .reader import verify


def _map(path: str, name: str, size: int) -> mmap.mmap:
    # no symlink, FIFO or device (nor a symlinked step directory for a reference)
    fd, actual = open_regular(data_file(LocalStorage(), path, name))
    try:
        if size == 0:
            raise CorruptCheckpointError("empty data file cannot hold a safetensors header", file=name)
        if actual != size:  # mapping past the end would fault (SIGBUS) on access
            raise CorruptCheckpointError(f"data file has {actual} bytes, index says {size}", file=name)
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


def _verify_all(index: Index, maps: dict[str, mmap.mmap]) -> None:
    jobs = []
    b = index.block_size
    for t in index.tensors:
        key = render_path(t.key)
        for c in t.chunks:
            view = memoryview(maps[c.file])[c.offset : c.offset + c.nbytes]
            for j, block in enumerate(blocks(view, b)):  # every block in parallel
                jobs.append(io_pool().submit(verify, c, block, b, key, j))
    wait_all(jobs)


def _view(maps: dict[str, mmap.mmap], index: Index, node: Node) -> Any:
    e = index.tensors[node["id"]]
    if len(e.chunks) != 1:
        raise CorruptCheckpointError("mmap=True needs each tensor in one chunk (saved unsharded)",
                                     key=render_path(e.key))
    c = e.chunks[0]
    d = lookup(e.dtype)
    count = c.nbytes // d.itemsize
    if e.kind == "numpy" or not tensors.HAVE_TORCH:
        if d.numpy is None:
            raise TypeError(f"dtype {e.dtype} needs torch to be loaded (numpy cannot represent it)")
        return np.frombuffer(maps[c.file], dtype=d.numpy, count=count, offset=c.offset).reshape(e.shape)
    torch = tensors.torch
    dtype = getattr(torch, d.name)
    if count == 0:
        return torch.empty(e.shape, dtype=dtype)
    return torch.frombuffer(maps[c.file], dtype=dtype, count=count, offset=c.offset).view(e.shape)


def load_mapped(path: str, index: Index) -> Any:
    """Builds the checkpoint's structure with tensors mapped from its data files.

    Raises:
        CorruptCheckpointError: a checksum fails (nothing is returned then).
    """
    maps = {f.name: _map(path, f.name, f.size) for f in index.files}
    _verify_all(index, maps)

    def leaf(_: KeyPath, node: Node) -> Any:
        return _view(maps, index, node)

    return build(index.tree, leaf)
