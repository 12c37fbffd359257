"""The placer of ``load(path, mmap=True)``: zero-copy views of memory-mapped data files.

Checksums are verified up front, all blocks in parallel on the I/O pool, before any
tensor is returned: a corrupt checkpoint never yields a tensor, and nothing needs to
hook tensor access later. The saving is memory (the page cache is the only copy; no
anonymous memory is allocated) rather than I/O: every byte is read once to verify it.

Compressed chunks (docs/FORMAT.md section 12) cannot be mapped: they are decoded from
the mapping into new memory, each block checked before and after decoding.

The mappings are private copy-on-write (``MAP_PRIVATE``): writing to a returned tensor
changes only this process's copy, never the checkpoint. A file changed by someone else
after verification may still show through pages not yet copied; checkpoints are
immutable once committed, so that would be tampering, not a crash.
"""

from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ....values import torch as torch_values
from ....errors import CorruptCheckpointError
from ....format.blockfile import stored_span
from ....format.checksum import blocks
from ....format.dtypes import lookup
from ....format.index.objects import Index
from ....format.index.rows import ChunkEntry
from ....format.tree import KeyPath, Node, build, render_path
from ....storage.files import open_regular
from ....storage.local import LocalStorage
from ...commit.locations import data_file
from ...io_pool import io_pool, wait_all
from ..request import LoadRequest
from ..transforms import decode, verify
from . import Placement, tensor_bytes

if TYPE_CHECKING:
    from ..index_exchange import IndexRead


def _map(path: str, name: str, size: int) -> mmap.mmap:
    # no symlink, FIFO or device (nor a symlinked step directory for a reference)
    fd, actual = open_regular(data_file(LocalStorage(), path, name))
    try:
        if size == 0:
            raise CorruptCheckpointError("empty data file cannot hold a header", file=name)
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
            if c.stored is not None:  # checked while it is decoded (_decoded)
                continue
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
    buf: Any = maps[c.file]
    offset = c.offset
    if c.stored is not None:
        buf, offset = _decoded(maps[c.file], c, index.block_size, render_path(e.key)), 0
    if e.kind == "numpy" or not torch_values.HAVE_TORCH:
        if d.numpy is None:
            raise TypeError(f"dtype {e.dtype} needs torch to be loaded (numpy cannot represent it)")
        return np.frombuffer(buf, dtype=d.numpy, count=count, offset=offset).reshape(e.shape)
    torch = torch_values.torch
    dtype = getattr(torch, d.name)
    if count == 0:
        return torch.empty(e.shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=count, offset=offset).view(e.shape)


def _decoded(mapped: mmap.mmap, c: ChunkEntry, block_size: int, key: str) -> np.ndarray:
    """A compressed chunk decoded from its mapped file into new memory, block by block in
    parallel, each block checked before and after decoding."""
    out = np.empty(c.nbytes, dtype=np.uint8)
    view, dest = memoryview(mapped), memoryview(out)
    jobs = []
    for j in range(len(c.checksums)):
        offset, size = stored_span(c, j)
        jobs.append(io_pool().submit(decode, c, j, view[offset : offset + size],
                                     dest[j * block_size : (j + 1) * block_size], key))
    wait_all(jobs)
    return out


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


class Mapped:
    """``load(path, mmap=True)`` (see the module docstring): its bytes are verified where
    they lie, in ``place``; nothing is read through the reader."""

    def __init__(self, request: LoadRequest) -> None:
        self.request = request
        self._value: Any = None

    def place(self, read: IndexRead) -> Placement:
        if not isinstance(read.storage, LocalStorage):
            raise ValueError("mmap=True applies to load(path) of a local checkpoint, without a state")
        self._value = load_mapped(read.spath, read.index)
        return Placement(read.index, nbytes=tensor_bytes(read.index))

    def finish(self) -> Any:
        return self._value


__all__ = ["Mapped", "load_mapped"]
