"""Cut a data file into write units and checksum blocks (pure arithmetic, no I/O).

A *unit* is an aligned file range ``[k * unit_size, (k + 1) * unit_size)``: the
granule that is staged, written and (for sync saves) bounced through one buffer.
Units never share a 4096-byte page, so each is written with direct I/O on its own.
A *block* is a checksum block of the format: ``block_size`` bytes of one item counted
from the item's first byte (the last block of an item may be shorter). Blocks do not
line up with units; a block may be checksummed once every unit it touches is staged.

Everything is held as numpy columns (one row per item, one row per block), so a file
of 100,000 small tensors is cut in milliseconds; a unit's parts and blocks are found
by binary search.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._numbers import ceil_div
from ...format.index.chunk_table import num_blocks
from ...format.datafile import ALIGN
from ...plan.layout import FilePlan

BLOCK_SIZE = 16 << 20  # checksum block: partial (resharded) reads verify whole blocks
UNIT_SIZE = 16 << 20  # staging/write unit: big enough for full-speed direct I/O, small
#                       enough that writes start while later units are still staged
HEADER = -1  # the ``item`` of a part that copies the safetensors header
I64 = np.int64


class Parts(NamedTuple):
    """What one unit holds, as parallel lists in file order: bytes ``[src, src + length)``
    of ``item`` (``HEADER``: of the safetensors header) land at file offset ``dst``."""

    item: list[int]
    src: list[int]
    dst: list[int]
    length: list[int]


class FileUnits:
    """The units and blocks of one planned data file.

    Args:
        plan: The file.
        unit_size: Bytes per unit (a multiple of 4096).
        block_size: Checksum block size of the index.

    Attributes:
        offsets, nbytes: Per item (plan order): absolute file offset and byte length.
        nblocks: Per item: its number of checksum blocks (at least one).
        block_first: ``(items + 1,)`` the id of each item's first block (blocks are
            numbered item by item, in block order within an item).
        block_start, block_stop: Per block: its file range ``[start, stop)``.
    """

    def __init__(self, plan: FilePlan, unit_size: int, block_size: int) -> None:
        if unit_size <= 0 or unit_size % ALIGN:
            raise ValueError(f"unit_size must be a positive multiple of {ALIGN}, got {unit_size}")
        self.plan = plan
        self.unit_size = unit_size
        self.block_size = block_size
        self.size = plan.layout.size
        self.nunits = max(1, ceil_div(self.size, unit_size))
        n = len(plan.items)
        self.offsets = np.asarray(plan.layout.offsets, dtype=I64).reshape(n)
        sizes = plan.layout.nbytes or [it.nbytes for it in plan.items]
        self.nbytes = np.asarray(sizes, dtype=I64).reshape(n)
        self.nblocks = num_blocks(self.nbytes.copy(), block_size)
        self.block_first = np.zeros(n + 1, dtype=I64)
        np.cumsum(self.nblocks, out=self.block_first[1:])
        item = np.repeat(np.arange(n, dtype=I64), self.nblocks)
        index = np.arange(len(item), dtype=I64) - self.block_first[:-1][item]
        self.block_start = self.offsets[item] + index * block_size
        self.block_stop = self.offsets[item] + np.minimum((index + 1) * block_size, self.nbytes[item])
        self.block_item = item
        # file order of the items and of the blocks (ties: zero-byte items keep plan order)
        self._order = np.argsort(self.offsets, kind="stable")
        self._starts = self.offsets[self._order]
        self._ends = self._starts + self.nbytes[self._order]
        self._border = np.argsort(self.block_start, kind="stable")
        self._bstart = self.block_start[self._border]
        self._bstop = self.block_stop[self._border]
        last = np.maximum(self.block_start, self.block_stop - 1)
        unit = np.minimum(last // unit_size, self.nunits - 1)
        self._by_unit = np.argsort(unit, kind="stable")
        self._unit_bounds = np.searchsorted(unit[self._by_unit], np.arange(self.nunits + 1), side="left")

    @property
    def nblocks_total(self) -> int:
        return int(self.block_first[-1])

    def unit_of(self, offset: int) -> int:
        """The unit holding file byte ``offset`` (clamped to the last unit)."""
        return min(offset // self.unit_size, self.nunits - 1)

    def span(self, k: int) -> tuple[int, int]:
        """File range ``[start, stop)`` of unit ``k``."""
        start = k * self.unit_size
        return start, min(start + self.unit_size, self.size)

    def parts(self, k: int) -> Parts:
        """What unit ``k`` holds: pieces of the header and of items, in file order."""
        start, stop = self.span(k)
        out = Parts([], [], [], [])
        hdr = self.plan.layout.data_start
        if start < hdr:
            out.item.append(HEADER)
            out.src.append(start)
            out.dst.append(start)
            out.length.append(min(stop, hdr) - start)
        lo = int(np.searchsorted(self._ends, start, side="right"))  # first item ending after start
        hi = int(np.searchsorted(self._starts, stop, side="left"))  # items starting before stop
        if hi > lo:
            off, end = self._starts[lo:hi], self._ends[lo:hi]
            keep = end > off  # zero-byte items hold nothing
            items = self._order[lo:hi]
            if not keep.all():
                off, end, items = off[keep], end[keep], items[keep]
            a = np.maximum(off, start)
            out.item.extend(items.tolist())
            out.src.extend((a - off).tolist())
            out.dst.extend(a.tolist())
            out.length.extend((np.minimum(end, stop) - a).tolist())
        return out

    def blocks_ending_in(self, k: int) -> np.ndarray:
        """Ids of the blocks whose last byte lies in unit ``k`` (a zero-byte block: its
        position), in item order."""
        return self._by_unit[self._unit_bounds[k] : self._unit_bounds[k + 1]]

    def blocks_touching(self, start: int, stop: int) -> np.ndarray:
        """Ids of the non-empty blocks that overlap the file range ``[start, stop)``, in file order."""
        lo = int(np.searchsorted(self._bstop, start, side="right"))
        hi = int(np.searchsorted(self._bstart, stop, side="left"))
        ids = self._border[lo:hi]
        nonempty = self._bstop[lo:hi] > self._bstart[lo:hi]
        return ids if nonempty.all() else ids[nonempty]


