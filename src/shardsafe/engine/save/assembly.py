"""Block files: coded blocks laid out in file order, in aligned chunks, in parts.

A save's compressed items are staged like the rest of the state, into units laid out by
``block_layout`` so that no checksum block spans two units (an item starts at the next
unit when it does not fit in the rest of the current one; a unit is a whole number of
blocks). The transform codes each block from the unit it was staged into
(``transforms.Compress``); the ``Assembler`` then appends the coded blocks in file order
(item by item, block by block), whatever order they were coded in.

The bytes are gathered into page-aligned chunks of ``CHUNK`` bytes and each full chunk
is written at its offset, so block files go through direct I/O like data files (a
part's last chunk is offered padded to a page; the sink cuts the padding off). A block file's size is known
only once its blocks are coded: its sinks are opened at an upper bound (a coded block is
never larger than its raw bytes) and closed at the real size. A file holding
``PART_BYTES`` begins a new part (``data-r<rank>-001.blocks``, ...) at the next item.

Memory: a unit is given back once its blocks are appended; at most ``CHUNKS`` chunks
exist per block file (the assembler waits for a write when both are in flight).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ...format.blockfile import MAGIC, CodedBlock
from ...format.datafile import Layout
from ...plan.flatten import TensorItem
from ...plan.layout import FilePlan
from ..buffers import BouncePool, HostBuffer, round_up
from ..commit.entries import CodedFile
from .feeds import Unit
from .units import FileUnits

PART_BYTES = 1 << 30  # a block file holding this much ends; the next item begins a new part
CHUNK = 4 << 20  # bytes per aligned write of a block file
CHUNKS = 2  # chunks per block file: one being filled, one being written
ASSEMBLY_BYTES = CHUNK * CHUNKS  # host memory an assembler holds besides the units


def block_layout(name: str, items: Sequence[TensorItem], unit_size: int) -> FilePlan:
    """The staging layout of coded items: no block spans two units (``unit_size`` is a
    multiple of the checksum block size)."""
    offsets, pos = [], 0
    for it in items:
        room = unit_size - pos % unit_size
        if it.nbytes > room and pos % unit_size:
            pos += room  # start at the next unit
        offsets.append(pos)
        pos += it.nbytes
    return FilePlan(name, tuple(items), Layout(b"", tuple(offsets), pos))


class Output(Protocol):
    """Where an assembler's parts go (the stream's sinks, through the pipeline)."""

    def open_part(self, part: int, name: str, bound: int) -> None:
        """Part ``part`` begins: open its sinks at ``bound`` bytes at most."""

    def write(self, part: int, offset: int, data: memoryview, padded: memoryview | None,
              done: Callable[[], None]) -> None:
        """Writes ``data`` at ``offset`` of part ``part`` to every live sink (``padded``: as
        for ``Sink.write``); ``done`` once all have it."""


class Assembler:
    """Appends a block stream's coded blocks in file order (see the module docstring).

    Args:
        units: The stream's units (laid out by ``block_layout``).
        name_of: The file name of part ``k``.
        out: Opens parts and writes chunks.
        release: Gives a unit back once all its blocks are appended.
    """

    def __init__(self, units: FileUnits, name_of: Callable[[int], str], out: Output,
                 release: Callable[[Unit], None]) -> None:
        self.units, self.name_of, self.out, self.release = units, name_of, out, release
        self.items = units.plan.items
        self.item_of = units.block_item.tolist()
        self.first = units.block_first.tolist()
        self.parts: list[CodedFile] = []
        self._raw_left = sum(it.nbytes for it in self.items)
        self._next = 0
        self._pending: dict[int, tuple[Unit, CodedBlock]] = {}
        self._left: dict[int, int] = {}  # id(unit) -> its blocks not yet appended
        self._lock = threading.Lock()  # pending and left
        self._order = threading.Lock()  # held by the one thread appending
        self._chunks = BouncePool(CHUNK, CHUNKS)
        self._buf: HostBuffer | None = None
        self._fill = 0
        self._at = 0  # file offset of the chunk being filled

    def put(self, unit: Unit, coded: Sequence[tuple[int, CodedBlock]]) -> None:
        """The coded blocks of ``unit`` (any thread, any order); appends what is next."""
        if not coded:
            self.release(unit)
            return
        with self._lock:
            self._left[id(unit)] = len(coded)
            for b, c in coded:
                self._pending[b] = (unit, c)
        with self._order:
            while True:
                with self._lock:
                    got = self._pending.pop(self._next, None)
                    if got is None:
                        return
                    b = self._next
                    self._next += 1
                self._append(b, *got)

    def _append(self, b: int, unit: Unit, c: CodedBlock) -> None:
        i = self.item_of[b]
        if b == self.first[i]:  # the item's first block
            if not self.parts or self.parts[-1].size >= PART_BYTES:
                self._new_part()
            self.parts[-1].begin_item(self.items[i])
            self._raw_left -= self.items[i].nbytes
        self.parts[-1].add_block(c)
        self._copy(memoryview(c.data).cast("B") if len(c.data) else memoryview(b""))
        with self._lock:
            left = self._left[id(unit)] - 1
            if left:
                self._left[id(unit)] = left
            else:
                del self._left[id(unit)]
        if not left:
            self.release(unit)

    def _new_part(self) -> None:
        if self.parts:
            self._flush(last=True)
        k = len(self.parts)
        self.parts.append(CodedFile.empty(self.name_of(k)))
        self.out.open_part(k, self.parts[-1].name, len(MAGIC) + self._raw_left)
        self._at, self._fill = 0, 0
        self._copy(memoryview(MAGIC))

    def _copy(self, data: memoryview) -> None:
        """Appends ``data`` to the chunk being filled, writing each chunk once full."""
        while len(data):
            if self._buf is None:
                self._buf = self._chunks.acquire()
                assert self._buf is not None
            n = min(len(data), CHUNK - self._fill)
            self._buf.array[self._fill : self._fill + n] = np.frombuffer(data[:n], dtype=np.uint8)
            self._fill += n
            data = data[n:]
            if self._fill == CHUNK:
                self._flush(last=False)

    def _flush(self, *, last: bool) -> None:
        """Writes the chunk being filled (the ``last`` of a part: padded to a page)."""
        buf, self._buf = self._buf, None
        if buf is None:
            return
        n, k, at = self._fill, len(self.parts) - 1, self._at
        self._at += n
        self._fill = 0
        self.out.write(k, at, buf.view(0, n), buf.view(0, round_up(n)) if last else None,
                       lambda: self._chunks.release(buf))

    def finish(self) -> list[CodedFile]:
        """Writes what is left once every block was appended; returns each part's contents."""
        with self._order:
            if self._next != self.units.nblocks_total:
                raise RuntimeError(f"{self.units.plan.name}: {self.units.nblocks_total - self._next} "
                                   f"blocks were never coded")
            if not self.parts:  # nothing to code: an empty block file still holds its magic
                self._new_part()
            self._flush(last=True)
        return self.parts

    def cancel(self) -> None:
        """Gives back every unit still waiting to be appended (the save stopped)."""
        with self._lock:
            held = {id(u): u for u, _ in self._pending.values()}
            self._pending.clear()
            self._left.clear()
        for u in held.values():
            self.release(u)

    def close(self) -> None:
        """Frees the chunk buffers (the writes have ended)."""
        self._chunks.close()


__all__ = ["ASSEMBLY_BYTES", "Assembler", "PART_BYTES", "block_layout"]
