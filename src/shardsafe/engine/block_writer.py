"""Write a rank's block files: compress every checksum block on the I/O pool, then write.

Block files (docs/FORMAT.md section 12) hold a rank's compressed chunks. Each 16 MiB
checksum block is coded on its own (``format.blockfile.code_block``), so all I/O threads
compress at once. A block file's size is only known once its blocks are coded, so each
file is written in one ``Storage.write`` (one upload on object stores) once complete.
Memory stays bounded: at most one block per I/O thread (plus one) is being coded ahead
of the writer, and
a file is closed, written and a new part (``data-r<rank>-001.blocks``, ...) begun once it
holds ``PART_BYTES`` stored bytes, so a save holds at most about ``PART_BYTES`` of
stored bytes at once, whatever the size of the state.

Mirrors (``engine.copies.MirrorBlocks``) receive every part as it is written (a rank's
own copy of the save holds the same block files); a failed write of a part does not stop
them.

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
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Protocol

import numpy as np

from .._scratch import ScratchBuffer
from ..format.blockfile import MAGIC, RAW, CodedBlock, code_block
from ..format.checksum import crc32c
from ..plan.flatten import TensorItem
from ..plan.layout import FilePlan
from ..storage.base import Storage
from ..storage.files import with_path
from .commit.entries import CodedFile
from .io_pool import io_pool, io_threads

PART_BYTES = 1 << 30  # a block file is written (and a new part begun) once it holds this much

_scratch = ScratchBuffer()


class BlockMirror(Protocol):
    """Another directory receiving the same block files (``engine.copies.MirrorBlocks``)."""

    def write_file(self, name: str, buffers: Sequence[memoryview]) -> None: ...

    def write_at(self, name: str, bound: int, offset: int, data: memoryview) -> None: ...

    def finish(self, coded: Sequence[CodedFile] | None, error: BaseException | None = None) -> None: ...


def _copy_of(src: np.ndarray) -> memoryview:
    """``src`` copied into this thread's reusable buffer."""
    buf = _scratch.get(src.size)
    buf[:] = src
    return memoryview(buf)


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


class _Part:
    """A block file being filled: its items' chunks and the stored bytes, in order."""

    def __init__(self, name: str) -> None:
        self.out = CodedFile.empty(name)
        self.buffers: list[bytes | memoryview] = [MAGIC]

    def add(self, item: TensorItem, blocks: list[CodedBlock]) -> None:
        self.out.begin_item(item)
        for c in blocks:
            self.out.add_block(c)
            self.buffers.append(c.data)


class BlockFileWrite:
    """Codes and writes the block file(s) of ``plan`` (the protocol of ``FileWrite``).

    Args:
        plan: The items to compress; its layout places them in ``staged``.
        storage: Backend.
        path_of: The storage path of a file name (inside the save's working directory).
        name_of: The name of block file part ``k`` (``plan.name`` is part 0).
        compression: ``"zstd"`` or ``"auto"`` (see ``format.codec``).
        block_size: Raw bytes per coded block (the checkpoint's checksum block).
        staged: The staging image (async saves), complete once ``nunits`` units are ready.
        sources: Per-item flat uint8 host views (sync saves), complete at ``all_ready``.
        nunits: Units of the staging image (staged mode).
        mirrors: Other directories receiving the same files.
    """

    def __init__(self, plan: FilePlan, storage: Storage, path_of: Callable[[str], str],
                 name_of: Callable[[int], str], compression: str, block_size: int, *,
                 staged: np.ndarray | None = None, sources: Sequence[np.ndarray] | None = None,
                 nunits: int = 0, mirrors: Sequence[BlockMirror] = ()) -> None:
        if (staged is None) == (sources is None):
            raise ValueError("give exactly one of staged= and sources=")
        self.plan, self.storage, self.path_of, self.name_of = plan, storage, path_of, name_of
        self.mirrors = list(mirrors)
        self._parts: list[CodedFile] = []  # the parts written so far
        self._write_error: BaseException | None = None
        self.compression, self.block_size = compression, block_size
        if staged is not None:
            sources = [staged[o : o + it.nbytes] for o, it in zip(plan.layout.offsets, plan.items)]
        self._sources = list(sources)  # type: ignore[arg-type]
        self._copy = staged is None
        self._left = nunits
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._inflight: set[Future[CodedBlock]] = set()  # submitted, not yet taken by finish()
        self._cancelled = False

    def start(self) -> None:
        """Nothing to open before a file's size is known (kept for ``FileWrite``'s protocol)."""

    def unit_ready(self, k: int) -> None:
        """Notes that a unit of the staging image is in place."""
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self._ready.set()

    def all_ready(self) -> None:
        """Every source byte is final (sync saves: from the start)."""
        self._ready.set()

    def fail(self, exc: BaseException) -> None:
        """Staging failed: ``finish`` raises ``exc``."""
        self._failed = exc
        self._ready.set()

    def _blocks(self) -> Iterator[tuple[int, Future[CodedBlock]]]:
        """(item number, coding job) of every block in file order, at most one per I/O
        thread (plus one) ahead of the caller: enough to keep every thread coding."""
        pool, b = io_pool(), self.block_size
        jobs = ((i, src[j : j + b], it.dtype) for i, (it, src) in enumerate(zip(self.plan.items, self._sources))
                for j in range(0, max(len(src), 1), b))
        window = io_threads() + 1
        pending: deque[tuple[int, Future[CodedBlock]]] = deque()
        for i, view, dtype in jobs:
            with self._lock:
                if self._cancelled:
                    return
                fut = pool.submit(_code, view, dtype, self.compression, self._copy)
                self._inflight.add(fut)
            pending.append((i, fut))
            if len(pending) >= window:
                yield self._taken(pending.popleft())
        while pending:
            yield self._taken(pending.popleft())

    def _taken(self, job: tuple[int, Future[CodedBlock]]) -> tuple[int, Future[CodedBlock]]:
        with self._lock:
            self._inflight.discard(job[1])
        return job

    def finish(self, timeout: float | None = None) -> list[CodedFile]:
        """Codes every block, writes each part durably, returns what each part holds."""
        if not self._ready.wait(timeout):
            raise TimeoutError(f"{self.plan.name}: staging did not finish")
        done: list[CodedFile] = []
        try:
            if self._failed is not None:
                raise self._failed
            part, item, blocks = _Part(self.name_of(0)), 0, []
            for i, fut in self._blocks():
                if i != item:  # item `item` is complete
                    part.add(self.plan.items[item], blocks)
                    item, blocks = i, []
                    if part.out.size >= PART_BYTES:
                        done.append(self._write(part))
                        part = _Part(self.name_of(len(done)))
                blocks.append(fut.result())
            part.add(self.plan.items[item], blocks)
            done.append(self._write(part, last=True))
        except BaseException as e:
            self._finish_mirrors(None, e)
            raise
        finally:
            self._stop_coding()
        if self._write_error is not None:
            raise self._write_error
        return done

    def _finish_mirrors(self, done: Sequence[CodedFile] | None, error: BaseException | None) -> None:
        mirrors, self.mirrors = self.mirrors, []
        for m in mirrors:
            m.finish(done, error)

    def _write(self, part: _Part, *, last: bool = False) -> CodedFile:
        """Writes ``part`` to the mirrors, then to its own file; after the ``last`` part
        the mirrors are finished before its own write (a copy does not wait for an upload)."""
        path = self.path_of(part.out.name)
        buffers = [memoryview(x) for x in part.buffers]
        for m in self.mirrors:
            m.write_file(part.out.name, buffers)
        if last:
            self._finish_mirrors(self._parts + [part.out], None)
        self._parts.append(part.out)
        if self._write_error is None:
            try:
                self.storage.write(path, buffers)
            except OSError as e:  # e.g. disk full: say which file; raised once the mirrors are done
                self._write_error = with_path(e, path)
        if self._write_error is not None and not self.mirrors:
            raise self._write_error
        return part.out

    def cancel(self) -> None:
        """Stops coding: cancels queued jobs and waits for running ones; mirrors that were
        not handed their outcome yet fail."""
        self._finish_mirrors(None, RuntimeError(f"the write of {self.plan.name} was cancelled"))
        self._stop_coding()

    def _stop_coding(self) -> None:
        with self._lock:
            self._cancelled = True
            futures = list(self._inflight)
            self._inflight.clear()
        for f in futures:
            f.cancel()
        for f in futures:
            if not f.cancelled():
                f.exception()
