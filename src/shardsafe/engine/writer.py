"""Write one data file at disk speed: parallel ranged writes plus checksums, per unit.

``FileWrite`` receives "unit k is ready" notifications (from staging threads, in any
order) and turns each into I/O-pool jobs: a write of the unit, and the checksums of
the blocks that end in it once every unit before it is ready too. Checksums thus run
off the training thread, concurrently with the writes (CRC32C releases the GIL).

Two sources of bytes:
- *staged*: a HostBuffer holding the file image (async saves): units are written
  straight from it; blocks are checksummed from it.
- *streamed* (sync saves): nothing is staged in full. Each write job copies its unit
  into one of a few bounce buffers (aligned, for direct I/O) and checksums the pieces of
  blocks in that copy before writing it: the checksums describe the bytes that reach the
  file even if another thread changes the state meanwhile (pieces of a block that spans
  units are joined with ``crc32c_combine``). Without bounce buffers, source slices are
  gathered straight into ``pwritev`` and checksummed from the sources.
- *slotted* (async saves under ``max_staging_bytes``): the stager copies each unit into
  a buffer of a bounded pool and hands it over with ``unit_ready(k, buf)``; the write
  job checksums and writes it as in streamed mode, then gives the buffer back.

Storages without ranged writes (object stores: ``Storage.open_writer`` returns None)
get the whole staged file in one ``Storage.write`` at the end.

Mirrors (``engine.copies.MirrorFile``) write every unit again into another file (a
rank's own copy of the save) from the same bytes, in the same job, before its buffer
is given back, and get the block checksums at ``finish``. A failed write of this file
does not stop its mirrors (it is kept and raised by ``finish`` once they are done);
a mirror's failure is its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

import numpy as np

from ..format.checksum import crc32c
from ..format.crc_combine import crc32c_combine
from ..storage.base import RangeWriter, Storage
from ..storage.files import with_path
from .io_pool import io_pool, wait_all
from .buffers import BouncePool, HostBuffer, HostSlice, round_up
from .staging import Sources, copy_unit
from .units import HEADER, BlockSums, FileUnits

log = logging.getLogger("shardsafe")


class UnitMirror(Protocol):
    """Another file written from the same units (see ``engine.copies.MirrorFile``)."""

    def start(self) -> None: ...

    def write(self, offset: int, data: memoryview) -> None: ...

    def write_gather(self, offset: int, views: Sequence[memoryview]) -> None: ...

    def finish(self, sums: Sequence[list[int]] | None, error: BaseException | None = None) -> None: ...


class FileWrite:
    """Checksums and writes one data file as its units become ready.

    Args:
        units: The file's units and checksum blocks.
        storage: Backend; ``path`` is the file's path in it.
        staged: The file image (staged mode), or None for streamed mode.
        sources: The items' host bytes (streamed mode).
        bounce: Bounce buffers for streamed direct writes.
        writer: The file, already opened with ``storage.open_writer`` (default: opened by
            ``start``).
        slots: The pool the buffers of ``unit_ready(k, buf)`` come from (slotted mode).
        mirrors: Other files written from the same units (see the module docstring).
    """

    def __init__(self, units: FileUnits, storage: Storage, path: str, *,
                 staged: HostBuffer | HostSlice | None = None, sources: Sources | None = None,
                 bounce: BouncePool | None = None, writer: RangeWriter | None = None,
                 slots: BouncePool | None = None, mirrors: Sequence[UnitMirror] = ()) -> None:
        if sum(x is not None for x in (staged, sources, slots)) != 1:
            raise ValueError("give exactly one of staged=, sources= and slots=")
        self.units, self.storage, self.path = units, storage, path
        self.mirrors = list(mirrors)
        self._write_error: BaseException | None = None  # this file's own write failed
        self.staged, self.sources, self.bounce = staged, sources, bounce or slots
        self._slotted = slots is not None
        self._unit_bufs: dict[int, HostBuffer] = {}  # slotted: staged units not yet written
        self._job_error: BaseException | None = None
        self._cancelled = False
        self._sums = np.zeros(units.nblocks_total, dtype=np.uint32)
        self._lock = threading.Lock()
        self._ready = [False] * units.nunits
        self._prefix = 0  # units [0, prefix) are all ready
        self._pending: list[tuple[str, int]] = []  # jobs noted before start()
        self._futures: list[Future] = []
        self._writer = writer
        self._started = False
        self._all_ready = threading.Event()
        self._submitting = 0  # unit_ready calls still submitting their jobs
        self._failed: BaseException | None = None
        # streamed with bounce buffers: block pieces checksummed from the bytes written
        self._from_copies = self._slotted or (sources is not None and bounce is not None)
        # blocks that span units: their pieces' checksums, joined in finish()
        self._pieces: dict[int, list[tuple[int, int, int]]] = {}

    # ------------------------------------------------------------------ dispatch
    def start(self) -> None:
        """Opens the file; jobs for units already ready are submitted now, later ones on arrival."""
        if self._writer is None:
            self._writer = self.storage.open_writer(self.path, self.units.size)
        if self._writer is None and self.staged is None:
            raise ValueError(f"{type(self.storage).__name__} has no ranged writes: stage the whole file"
                             + (" (max_staging_bytes needs a local path)" if self._slotted else ""))
        for m in self.mirrors:
            m.start()
        with self._lock:
            self._started = True
            pending, self._pending = self._pending, []
        for job in pending:
            self._submit(job)

    def unit_ready(self, k: int, buf: HostBuffer | None = None) -> None:
        """Notes that unit ``k`` holds its final bytes (thread-safe, any order).

        Slotted mode: ``buf`` holds the unit (from ``slots``); this FileWrite releases it
        once written, or at once if the write was cancelled.
        """
        jobs: list[tuple[str, int]] = [("write", k)]
        with self._lock:
            if buf is not None:
                if self._cancelled:
                    self.bounce.release(buf)
                    return
                self._unit_bufs[k] = buf
            self._ready[k] = True
            while self._prefix < len(self._ready) and self._ready[self._prefix]:
                jobs.append(("sums", self._prefix))
                self._prefix += 1
            if not self._started:
                self._pending.extend(jobs)
                jobs = []
            self._submitting += 1
        try:
            for job in jobs:
                self._submit(job)
        finally:
            # "all ready" only once every job of every unit is submitted: finish() then
            # waits for all of them (a job still being submitted by another thread would be
            # missed, its checksums lost and its write racing the close)
            with self._lock:
                self._submitting -= 1
                if self._prefix == len(self._ready) and self._submitting == 0:
                    self._all_ready.set()

    def error(self) -> BaseException | None:
        """The first failure so far (of staging or of a finished job), else None."""
        own = self._write_error if not self.mirrors else None  # with mirrors, staging goes on for them
        return self._failed or self._job_error or own

    def _note_error(self, fut: Future) -> None:
        if self._job_error is None and not fut.cancelled():
            self._job_error = fut.exception()

    def fail(self, exc: BaseException) -> None:
        """Staging failed: ``finish`` raises ``exc`` instead of waiting for more units."""
        self._failed = exc
        self._all_ready.set()

    def all_ready(self) -> None:
        """Marks every unit ready (streamed mode: the sources are complete from the start)."""
        for k in range(self.units.nunits):
            self.unit_ready(k)

    def _submit(self, job: tuple[str, int]) -> None:
        kind, k = job
        if kind == "write" and self._writer is None and not self.mirrors:
            return  # no ranged writes: the whole image is written in finish()
        if kind == "sums" and (self._from_copies or not len(self.units.blocks_ending_in(k))):
            return  # (streamed: checksummed in the write job, from the bounce copy)
        fn = self._write_unit if kind == "write" else self._checksum_unit
        fut = io_pool().submit(fn, k)
        fut.add_done_callback(self._note_error)
        with self._lock:
            self._futures.append(fut)

    # ------------------------------------------------------------------ jobs
    def _checksum_unit(self, k: int) -> None:
        """Checksums the blocks that end in unit ``k``, from the staged image or the sources."""
        u, sums = self.units, self._sums
        ids = u.blocks_ending_in(k).tolist()
        starts, stops = u.block_start[ids].tolist(), u.block_stop[ids].tolist()
        if self.staged is not None:
            view = self.staged.view()
            for b, lo, hi in zip(ids, starts, stops):
                sums[b] = crc32c(view[lo:hi])
            return
        items = u.block_item[ids].tolist()
        for b, i, lo, hi in zip(ids, items, starts, stops):
            off = int(u.offsets[i])
            sums[b] = crc32c(memoryview(self.sources[i])[lo - off : hi - off])

    def _write_own(self, offset: int, data: memoryview) -> None:
        """Writes to this file; a failure is kept for ``finish`` (the mirrors go on)."""
        if self._writer is None or self._write_error is not None:
            return
        try:
            self._writer.write_at(offset, data)
        except Exception as e:  # noqa: BLE001 - raised by finish(), after the mirrors
            self._write_error = e

    def _write_unit(self, k: int) -> None:
        start, stop = self.units.span(k)
        if self.staged is not None:
            # The buffer is padded to 4096, so the file's last unit also goes out direct;
            # the writer truncates the padding away on close.
            end = round_up(stop) if k == self.units.nunits - 1 else stop
            view = self.staged.view(start, end)
            for m in self.mirrors:
                m.write(start, view)
            self._write_own(start, view)
        elif self._from_copies:
            if self._slotted:
                with self._lock:
                    buf = self._unit_bufs.pop(k, None)
                if buf is None:  # cancelled meanwhile; cancel() gave the buffer back
                    return
            else:
                buf = self.bounce.acquire()
            try:
                if not self._slotted:
                    copy_unit(self.units, k, self.sources, buf.array, base=start)
                self._sum_copy(k, start, buf.view(0, stop - start))
                view = buf.view(0, round_up(stop - start))
                for m in self.mirrors:
                    m.write(start, view)
                self._write_own(start, view)
            finally:
                self.bounce.release(buf)
        else:
            self._gather_write(k)

    def _sum_copy(self, k: int, start: int, data: memoryview) -> None:
        """Checksums the blocks (or pieces of blocks) that unit ``k`` (copied into ``data``) holds."""
        u = self.units
        stop = start + len(data)
        ids = u.blocks_touching(start, stop)
        b0, b1 = u.block_start[ids], u.block_stop[ids]
        lo, hi = np.maximum(b0, start), np.minimum(b1, stop)
        whole = (lo == b0) & (hi == b1)
        sums = self._sums
        found = []
        for b, s, e, w in zip(ids.tolist(), (lo - start).tolist(), (hi - start).tolist(), whole.tolist()):
            if w:
                sums[b] = crc32c(data[s:e])
            else:
                found.append((b, (s + start, crc32c(data[s:e]), e - s)))
        if found:
            with self._lock:
                for b, piece in found:
                    self._pieces.setdefault(b, []).append(piece)

    def _join_pieces(self) -> None:
        """Joins the checksums of the pieces of each block that spans units (in file order)."""
        u = self.units
        for b, pieces in self._pieces.items():
            start, stop = int(u.block_start[b]), int(u.block_stop[b])
            crc, pos = crc32c(b""), start
            for s, c, n in sorted(pieces):
                if s != pos:
                    raise RuntimeError(f"{self.path}: block {b} was not fully written (gap at byte {pos})")
                crc = c if pos == start else crc32c_combine(crc, c, n)
                pos += n
            if pos != stop:
                raise RuntimeError(f"{self.path}: block {b} ends at {pos}, not {stop}")
            self._sums[b] = crc

    def _gather_write(self, k: int) -> None:
        """Writes unit ``k`` straight from the source slices (buffered files: no bounce copy)."""
        header = memoryview(self.units.plan.layout.header)
        parts = self.units.parts(k)
        views = [(header if i == HEADER else memoryview(self.sources[i]))[src : src + n]
                 for i, src, n in zip(parts.item, parts.src, parts.length)]
        if not views:
            return
        for m in self.mirrors:
            m.write_gather(parts.dst[0], views)
        if self._writer is not None and self._write_error is None:
            try:
                self._writer.write_gather(parts.dst[0], views)
            except Exception as e:  # noqa: BLE001 - raised by finish(), after the mirrors
                self._write_error = e

    # ------------------------------------------------------------------ completion
    def finish(self, timeout: float | None = None) -> BlockSums:
        """Waits for every unit and job, makes the file durable, returns the block checksums.

        On error the file is closed unsynced and the error re-raised (after every job of
        this file has stopped, so the caller may free the buffers).
        """
        if not self._all_ready.wait(timeout):
            raise TimeoutError(f"{self.path}: staging did not finish")
        try:
            if self._failed is not None:
                raise self._failed
            with self._lock:
                futures = list(self._futures)
            wait_all(futures)
            if self._from_copies:
                self._join_pieces()
            self._finish_mirrors(None)
            if self._write_error is not None:
                raise self._write_error
            if self._writer is None:
                self.storage.write(self.path, [self.staged.view(0, self.units.size)])
            else:
                self._writer.close(sync=True)
        except OSError as e:  # e.g. disk full: say which file
            self._finish_mirrors(e)
            if self._writer is not None:
                self._writer.abort()
            raise with_path(e, self.path) from None
        except BaseException as e:
            self._finish_mirrors(e)
            if self._writer is not None:
                self._writer.abort()
            raise
        return self.sums

    @property
    def sums(self) -> BlockSums:
        """The block checksums of the file's items (complete once ``finish`` returned)."""
        return BlockSums(self._sums, self.units.block_first)

    def _finish_mirrors(self, error: BaseException | None) -> None:
        """Hands the mirrors the checksums (or the error that leaves them without); once."""
        mirrors, self.mirrors = self.mirrors, []
        for m in mirrors:
            m.finish(None if error is not None else self.sums, error)

    def cancel(self) -> None:
        """Waits for submitted jobs and closes the file without syncing (save failed elsewhere)."""
        with self._lock:
            futures = list(self._futures)
        for f in futures:
            f.exception()
        with self._lock:  # slotted: units staged but never written give their buffers back
            self._cancelled = True
            held, self._unit_bufs = list(self._unit_bufs.values()), {}
        for buf in held:
            self.bounce.release(buf)
        self._finish_mirrors(RuntimeError(f"the write of {self.path} was cancelled"))
        if self._writer is not None:
            self._writer.abort()
