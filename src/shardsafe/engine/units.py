"""Cut a data file into write units and checksum blocks (pure arithmetic, no I/O).

A *unit* is an aligned file range ``[k * unit_size, (k + 1) * unit_size)``: the
granule that is staged, written and (for sync saves) bounced through one buffer.
Units never share a 4096-byte page, so each is written with direct I/O on its own.
A *block* is a checksum block of the format: ``block_size`` bytes of one item counted
from the item's first byte (the last block of an item may be shorter). Blocks do not
line up with units; a block may be checksummed once every unit it touches is staged.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


from .._numbers import ceil_div
from ..plan.layout import FilePlan
from ..format.datafile import ALIGN

HEADER = -1  # the ``item`` of a Part that copies the safetensors header


@dataclass(frozen=True, slots=True)
class Part:
    """Bytes ``[src, src + length)`` of an item (or of the header) land at file offset ``dst``."""

    item: int
    src: int
    dst: int
    length: int


@dataclass(frozen=True, slots=True)
class Block:
    """Checksum block ``index`` of item ``item``: file bytes ``[start, stop)``."""

    item: int
    index: int
    start: int
    stop: int


class FileUnits:
    """The units and blocks of one planned data file.

    Args:
        plan: The file.
        unit_size: Bytes per unit (a multiple of 4096).
        block_size: Checksum block size of the index.
    """

    def __init__(self, plan: FilePlan, unit_size: int, block_size: int) -> None:
        if unit_size <= 0 or unit_size % ALIGN:
            raise ValueError(f"unit_size must be a positive multiple of {ALIGN}, got {unit_size}")
        self.plan = plan
        self.unit_size = unit_size
        self.size = plan.layout.size
        self.nunits = max(1, ceil_div(self.size, unit_size))
        offsets = plan.layout.offsets
        self.order = sorted(range(len(plan.items)), key=lambda i: offsets[i])
        self._starts = [offsets[i] for i in self.order]
        self.nbytes = [it.nbytes for it in plan.items]
        self.blocks_by_unit: list[list[Block]] = [[] for _ in range(self.nunits)]
        self.nblocks = [0] * len(plan.items)
        for i, off in enumerate(offsets):
            n = self.nbytes[i]
            starts = range(0, n, block_size) if n else (0,)
            self.nblocks[i] = len(starts)
            for j, rel in enumerate(starts):
                b = Block(i, j, off + rel, off + min(rel + block_size, n))
                self.blocks_by_unit[self.unit_of(max(b.start, b.stop - 1))].append(b)

    def unit_of(self, offset: int) -> int:
        """The unit holding file byte ``offset`` (clamped to the last unit)."""
        return min(offset // self.unit_size, self.nunits - 1)

    def span(self, k: int) -> tuple[int, int]:
        """File range ``[start, stop)`` of unit ``k``."""
        start = k * self.unit_size
        return start, min(start + self.unit_size, self.size)

    def parts(self, k: int) -> list[Part]:
        """What unit ``k`` holds: pieces of the header and of items, in file order."""
        start, stop = self.span(k)
        out: list[Part] = []
        hdr = self.plan.layout.data_start
        if start < hdr:
            out.append(Part(HEADER, start, start, min(stop, hdr) - start))
        offsets = self.plan.layout.offsets
        pos = bisect.bisect_right(self._starts, start) - 1
        if pos > 0:  # zero-byte items share their offset with a neighbour: take the first
            pos = bisect.bisect_left(self._starts, self._starts[pos])
        pos = max(pos, 0)
        while pos < len(self.order):
            i = self.order[pos]
            off, n = offsets[i], self.nbytes[i]
            if off >= stop:
                break
            lo, hi = max(off, start), min(off + n, stop)
            if hi > lo:
                out.append(Part(i, lo - off, lo, hi - lo))
            pos += 1
        return out
