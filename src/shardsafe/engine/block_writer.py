"""Write one block file: compress every checksum block on the I/O pool, then write it.

A block file (docs/FORMAT.md section 12) holds this rank's compressed chunks. Each
16 MiB checksum block is coded on its own (``format.blockfile.code_block``), so all I/O
threads compress at once; a block file's size is only known once every block is coded,
so it is written in one ``Storage.write`` at the end (one upload on object stores). Until
then the stored bytes are held in memory: at most the raw size of the file's items,
usually much less.

Two sources of bytes, as for ``engine.writer.FileWrite``:
- *staged* (async saves): the staging image laid out by the plan; coding starts once
  every unit is staged (``unit_ready``), on the background thread's time, so the
  training stall is the copy alone;
- *sources* (sync saves): the items' host bytes. Each block is first copied into a
  per-thread buffer and checksummed and coded from that copy, so the checksums describe
  the stored bytes even if another thread changes the state meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from ..format.blockfile import MAGIC, RAW, CodedBlock, code_block
from ..format.checksum import crc32c
from ..format.codec import CODECS
from ..plan.layout import FilePlan
from ..storage.base import Storage
from ..storage.files import with_path
from .entries import CodedFile
from .io_pool import io_pool, wait_all

_scratch = threading.local()


def _copy_of(src: np.ndarray) -> memoryview:
    """``src`` copied into this thread's reusable buffer."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < src.size:
        buf = _scratch.buf = np.empty(src.size, dtype=np.uint8)
    buf[: src.size] = src
    return memoryview(buf[: src.size])


def _code(src: np.ndarray, dtype: str, compression: str, copy: bool) -> CodedBlock:
    """Codes one block; with ``copy``, from a private copy, and owns every byte it returns."""
    if src.size == 0:
        crc = crc32c(b"")
        return CodedBlock(RAW, b"", crc, crc)
    raw = _copy_of(src) if copy else memoryview(src)
    b = code_block(raw, dtype, compression)  # type: ignore[arg-type]
    if copy or (b.codec != RAW and isinstance(b.data, memoryview)):
        return CodedBlock(b.codec, bytes(b.data), b.raw_crc, b.stored_crc)
    return b


class BlockFileWrite:
    """Codes and writes the block file of ``plan`` (the same protocol as ``FileWrite``).

    Args:
        plan: The file's items; its layout places them in ``staged``.
        storage: Backend; ``path`` is the file's path in it.
        compression: ``"zstd"`` or ``"auto"`` (see ``format.codec``).
        block_size: Raw bytes per coded block (the checkpoint's checksum block).
        staged: The staging image (async saves), complete once ``nunits`` units are ready.
        sources: Per-item flat uint8 host views (sync saves); coding starts at ``all_ready``.
        nunits: Units of the staging image (staged mode).
    """

    def __init__(self, plan: FilePlan, storage: Storage, path: str, compression: str,
                 block_size: int, *, staged: np.ndarray | None = None,
                 sources: Sequence[np.ndarray] | None = None, nunits: int = 0) -> None:
        if (staged is None) == (sources is None):
            raise ValueError("give exactly one of staged= and sources=")
        self.plan, self.storage, self.path = plan, storage, path
        self.compression, self.block_size = compression, block_size
        if staged is not None:
            offs = plan.layout.offsets
            sources = [staged[o : o + it.nbytes] for o, it in zip(offs, plan.items)]
        self._sources = list(sources)  # type: ignore[arg-type]
        self._copy = staged is None
        self._left = nunits
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._futures: list[list[Future[CodedBlock]]] = []

    def start(self) -> None:
        """Nothing to open before the file's size is known (kept for ``FileWrite``'s protocol)."""

    def unit_ready(self, k: int) -> None:
        """Notes that a unit of the staging image is in place; the last one starts coding."""
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self.all_ready()

    def all_ready(self) -> None:
        """Every source byte is final: submits the coding of every block to the I/O pool."""
        pool, b = io_pool(), self.block_size
        futures = [[pool.submit(_code, src[j : j + b], it.dtype, self.compression, self._copy)
                    for j in range(0, max(len(src), 1), b)]
                   for it, src in zip(self.plan.items, self._sources)]
        with self._lock:
            self._futures = futures
        self._ready.set()

    def fail(self, exc: BaseException) -> None:
        """Staging failed: ``finish`` raises ``exc``."""
        self._failed = exc
        self._ready.set()

    def finish(self, timeout: float | None = None) -> CodedFile:
        """Waits for every block, writes the file durably, returns what it holds."""
        if not self._ready.wait(timeout):
            raise TimeoutError(f"{self.path}: staging did not finish")
        if self._failed is not None:
            raise self._failed
        wait_all([f for fs in self._futures for f in fs])
        coded = [[f.result() for f in fs] for fs in self._futures]
        out = CodedFile(len(MAGIC), [], [], [], [], [])
        buffers: list[bytes | memoryview] = [MAGIC]
        for blocks in coded:
            out.offsets.append(out.size)
            out.sums.append([c.raw_crc for c in blocks])
            out.codec.append([CODECS.index(c.codec) for c in blocks])
            out.stored.append([0 if c.codec == RAW else len(c.data) for c in blocks])
            out.stored_sums.append([0 if c.codec == RAW else c.stored_crc for c in blocks])
            for c in blocks:
                buffers.append(c.data)
                out.size += len(c.data)
        try:
            self.storage.write(self.path, [memoryview(x) for x in buffers])
        except OSError as e:  # e.g. disk full: say which file
            raise with_path(e, self.path) from None
        return out

    def cancel(self) -> None:
        """Waits for the coding jobs already submitted (the save failed elsewhere)."""
        with self._lock:
            futures = [f for fs in self._futures for f in fs]
        for f in futures:
            f.cancel()
        for f in futures:
            if not f.cancelled():
                f.exception()
