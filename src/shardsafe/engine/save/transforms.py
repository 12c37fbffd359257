"""Transforms: the middle stage of the save pipeline, between the feed and the sinks.

- ``Checksum`` (data files): the CRC32C of every checksum sub-block (``format.sub_blocks``)
  of the chunks larger than one, joined into the CRC32C of their checksum blocks, and of
  every other block, from the unit's copy of the bytes, so the checksums describe what
  reaches the file even if another thread changes the state meanwhile. A sub-block or
  block that spans units is checksummed piece by piece and the pieces are joined with
  ``crc32c_combine``. Cheap (CRC32C runs at memory
  speed and releases the GIL), so it runs in the thread that produced the unit, while
  the bytes are still warm.
- ``Compress`` (block files): each checksum block of the unit is coded on its own
  (``format.blockfile.code_block``) on the transform pool, at most ``window`` blocks at
  once (a memory budget bounds the blocks being coded too); the coded blocks go to its
  own ``Assembler`` (``engine.save.assembly``), which lays them out in file order and
  writes them through the stream's output.

A transform that is not ``coded`` leaves its unit to the pipeline, which writes it as
fed; a ``coded`` one hands its output on and gives the unit back itself. Either way,
``result()`` is what the stream's file holds once every unit was seen.

Skipping unchanged chunks (incremental saves) is decided at planning time
(``engine.save.incremental``): the chunks it skips never become units.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ... import knobs
from ...format.blockfile import RAW, CodedBlock, code_block
from ...format.checksum import crc32c
from ...format.crc_combine import crc32c_combine
from ...format.sub_blocks import SUB_BLOCK_SIZE, join_sub_crcs, num_sub_blocks
from ..commit.entries import BlockSums, CodedFile
from ..io_pool import SharedThreadPool
from .assembly import Assembler, Output
from .feeds import Unit
from .units import FileUnits

_pool = SharedThreadPool(knobs.copy_threads, "shardsafe-transform")


def transform_pool() -> ThreadPoolExecutor:
    """The process-wide pool that runs transforms (``SHARDSAFE_COPY_THREADS`` threads:
    the CPUs, at most 4), apart from the I/O pool so that coding never holds back writes."""
    return _pool.get()


class Transform(Protocol):
    """The middle stage of a stream: what happens to each unit between the feed and the
    sinks (called once per unit, in any order, from any thread)."""

    inline: bool
    """Cheap enough to run on the thread that produced the unit (else: the transform pool)."""
    coded: bool
    """Its output replaces the unit's bytes, and it hands that output on and gives the
    unit back itself; else the pipeline writes the unit itself, as fed."""

    def __call__(self, unit: Unit) -> None:
        """Transforms ``unit`` (a failure leaves it to the caller to give back)."""
        ...

    def result(self) -> Any:
        """What the stream's file holds, once every unit was seen (``BlockSums`` of a
        data file; the ``CodedFile`` parts of a block file)."""
        ...

    def cancel(self) -> None:
        """The save stopped: gives back every unit it still holds."""
        ...

    def close(self) -> None:
        """Frees its buffers (the run has ended)."""
        ...


class Checksum:
    """The block and sub-block checksums of one data file, filled unit by unit (any order, any thread)."""

    inline = True  # cheap: runs on the thread that produced the unit
    coded = False

    def __init__(self, units: FileUnits, sub_size: int = SUB_BLOCK_SIZE) -> None:
        self.units = units
        self.sub = sub_size
        self._sums = np.zeros(units.nblocks_total, dtype=np.uint32)
        nsub = num_sub_blocks(units.nbytes, sub_size)
        self._sub_item = np.concatenate([[0], np.cumsum(nsub)]).astype(np.int64)
        self._subs = np.zeros(int(self._sub_item[-1]), dtype=np.uint32)
        item = units.block_item
        index = np.arange(len(item), dtype=np.int64) - units.block_first[:-1][item]
        per = max(1, units.block_size // sub_size)  # sub-blocks per block
        # the first sub-block of each block, -1 for a block of a chunk without sub-blocks
        self._sub_first = np.where(nsub[item] > 0, self._sub_item[:-1][item] + index * per, -1).tolist()
        self._pieces: dict[int, list[tuple[int, int, int]]] = {}
        self._sub_pieces: dict[int, list[tuple[int, int, int]]] = {}
        self._pending: set[int] = set()  # blocks with sub-blocks that span units
        self._lock = threading.Lock()

    def __call__(self, unit: Unit) -> None:
        """Checksums the blocks, sub-blocks, or pieces of them, that ``unit`` holds."""
        u, start = self.units, unit.start
        data = unit.view(start, unit.stop)
        ids = u.blocks_touching(start, unit.stop)
        b0, b1 = u.block_start[ids], u.block_stop[ids]
        lo, hi = np.maximum(b0, start), np.minimum(b1, unit.stop)
        whole = (lo == b0) & (hi == b1)
        found, sub_found, pending = [], [], []
        for b, s, e, w, first in zip(ids.tolist(), (lo - start).tolist(), (hi - start).tolist(), whole.tolist(),
                                     (b0 - start).tolist()):
            sf = self._sub_first[b]
            if sf < 0:
                if w:
                    self._sums[b] = crc32c(data[s:e])
                else:
                    found.append((b, (s + start, crc32c(data[s:e]), e - s)))
                continue
            sub = self.sub
            k0 = (s - first) // sub
            for k in range(k0, -(-(e - first) // sub)):
                a, z = max(s, first + k * sub), min(e, first + (k + 1) * sub)
                crc = crc32c(data[a:z])
                if (a == first + k * sub and z - a == sub) or (a == first + k * sub and z == e and w):
                    self._subs[sf + k] = crc
                else:
                    sub_found.append((sf + k, (a + start, crc, z - a)))
            if w:
                self._sums[b] = self._join_block(b)
            else:
                pending.append(b)
        if found or sub_found or pending:
            with self._lock:
                self._pending.update(pending)
                for b, piece in found:
                    self._pieces.setdefault(b, []).append(piece)
                for i, piece in sub_found:
                    self._sub_pieces.setdefault(i, []).append(piece)

    def _join_block(self, b: int) -> int:
        """Block ``b``'s CRC32C from its sub-blocks' (all known)."""
        u, sub = self.units, self.sub
        n = int(u.block_stop[b] - u.block_start[b])
        sf = self._sub_first[b]
        k = -(-n // sub)
        return join_sub_crcs(self._subs[sf : sf + k].tolist(), sub, n - (k - 1) * sub)

    def result(self) -> BlockSums:
        """The checksums of every block and sub-block, once every unit was seen (pieces
        joined in file order)."""
        u = self.units
        for i, pieces in self._sub_pieces.items():
            self._subs[i] = _join_pieces(pieces, u.plan.name, f"sub-block {i}")
        for b in self._pending:
            self._sums[b] = self._join_block(b)
        for b, pieces in self._pieces.items():
            start, stop = int(u.block_start[b]), int(u.block_stop[b])
            if sorted(pieces)[0][0] != start or sum(n for _, _, n in pieces) != stop - start:
                raise RuntimeError(f"{u.plan.name}: block {b} was not fully staged")
            self._sums[b] = _join_pieces(pieces, u.plan.name, f"block {b}")
        self._pieces, self._sub_pieces, self._pending = {}, {}, set()
        return BlockSums(self._sums, u.block_first, self._subs, self._sub_item, self.sub)

    def cancel(self) -> None:
        """Nothing held: the pipeline writes and gives back the units."""

    def close(self) -> None:
        """Nothing to free."""


def _join_pieces(pieces: list[tuple[int, int, int]], file: str, what: str) -> int:
    """The CRC32C of consecutive pieces ``(file offset, CRC32C, length)``, in any order."""
    crc, pos = 0, None
    for s, c, n in sorted(pieces):
        if pos is not None and s != pos:
            raise RuntimeError(f"{file}: {what} was not fully staged (gap at byte {pos})")
        crc = c if pos is None else crc32c_combine(crc, c, n)
        pos = s + n
    return crc


class Compress:
    """Codes the checksum blocks of a block file's units (laid out by ``assembly.block_layout``:
    no block spans two units), at most ``window`` blocks at once, and lays them out in
    file order with its ``Assembler``, which writes them through ``out`` (parts named by
    ``name_of``) and gives each unit back (``release``) once its blocks are appended."""

    inline = False  # costly: runs on the transform pool
    coded = True

    def __init__(self, units: FileUnits, compression: str, window: int, out: Output,
                 name_of: Callable[[int], str], release: Callable[[Unit], None]) -> None:
        self.units, self.compression, self.release = units, compression, release
        self.assembler = Assembler(units, name_of, out, release)
        self._slots = threading.BoundedSemaphore(max(1, window))
        item, first = units.block_item.tolist(), units.block_first.tolist()
        start, stop = units.block_start.tolist(), units.block_stop.tolist()
        self.blocks: list[list[tuple[int, int, int, int]]] = []  # per unit: (block id, item, start, length)
        for k in range(units.nunits):
            self.blocks.append([(b, item[b], start[b], stop[b] - start[b]) for b in units.blocks_ending_in(k).tolist()])
        self.first = first

    def __call__(self, unit: Unit) -> None:
        """Codes every block of ``unit`` and hands them to the assembler (which gives the
        unit back once they are appended; a failure to code gives it back here)."""
        try:
            coded = self.code(unit)
        except BaseException:
            self.release(unit)
            raise
        self.assembler.put(unit, coded)

    def code(self, unit: Unit) -> list[tuple[int, CodedBlock]]:
        """``(block id, coded block)`` of every block of ``unit``; a raw block's data is a
        view of the unit (valid until the unit is released), a coded one owns its bytes."""
        out = []
        items = self.units.plan.items
        for b, i, start, n in self.blocks[unit.k]:
            with self._slots:
                out.append((b, _code(unit.view(start, start + n), items[i].dtype, self.compression)))
        return out

    def result(self) -> list[CodedFile]:
        """Writes what is left once every block was appended; each part's contents."""
        return self.assembler.finish()

    def cancel(self) -> None:
        """Gives back every unit still waiting to be appended."""
        self.assembler.cancel()

    def close(self) -> None:
        """Frees the assembler's chunk buffers."""
        self.assembler.close()


def _code(raw: memoryview, dtype: str, compression: str) -> CodedBlock:
    if len(raw) == 0:
        crc = crc32c(b"")
        return CodedBlock(RAW, b"", crc, crc)
    # kept as the codec returns it, not copied: coded bytes are the codec's fresh buffer
    # (``codec.encode``), and a copy would hold every block in flight twice
    return code_block(raw, dtype, compression)  # type: ignore[arg-type]


__all__ = ["Checksum", "Compress", "Transform", "transform_pool"]
