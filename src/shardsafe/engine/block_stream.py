"""Code a block file from units as they stream through a memory budget (``max_staging_bytes``).

With a budget, the items a save compresses are staged like the rest of the state, unit
by unit into the budget's buffers (``staging.stage_through``), and coded from there.
``slotted_layout`` places the items so that no checksum block spans two units (an item
starts at the next unit when it does not fit in the rest of the current one, and a unit
is a whole number of blocks), so every block is coded straight from the buffer its unit
was staged into. Coded blocks are appended to the block file in file order (item by
item, block by block, which is the order the stager takes units in) through a ranged
writer opened at an upper bound of the size (a block never grows: one that does not
shrink is stored raw) and truncated to the real size at the end; mirrors
(``engine.copies.MirrorBlocks``) receive the same ranges.

Memory: a unit's buffer goes back to the pool once all its blocks are written, and a
block is coded only while it is among the next ``window`` blocks to be written, so at
most ``window`` coded blocks exist beside the budget's buffers. Blocks are admitted in
file order, so the unit holding the next block to write always progresses (the stager
runs at most as many threads as the pool has buffers). A save writes one block file
this way; its size is not bounded by memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..format.blockfile import MAGIC, CodedBlock
from ..format.datafile import Layout
from ..plan.flatten import TensorItem
from ..plan.layout import FilePlan
from ..storage.base import RangeWriter, Storage
from ..storage.files import with_path
from .block_writer import BlockMirror, _code
from .buffers import BouncePool, HostBuffer
from .commit.entries import CodedFile
from .io_pool import io_pool
from .units import FileUnits


def slotted_layout(name: str, items: Sequence[TensorItem], unit_size: int) -> FilePlan:
    """The staging layout of coded items under a budget: no block spans two units.

    ``unit_size`` must be a multiple of the checksum block size (the caller checks).
    """
    offsets, pos = [], 0
    for it in items:
        room = unit_size - pos % unit_size
        if it.nbytes > room and pos % unit_size:
            pos += room  # start at the next unit
        offsets.append(pos)
        pos += it.nbytes
    return FilePlan(name, tuple(items), Layout(b"", tuple(offsets), pos))


@dataclass(frozen=True, slots=True)
class _Block:
    seq: int  # position in the file (item by item, block by block)
    item: int
    index: int  # block number within its item
    start: int  # offset in its unit
    length: int


def _unit_blocks(units: FileUnits) -> list[list[_Block]]:
    """Per unit, the blocks it holds in file order (no block spans two units)."""
    item, first = units.block_item.tolist(), units.block_first.tolist()
    start, stop = units.block_start.tolist(), units.block_stop.tolist()
    out = []
    for k in range(units.nunits):
        base = units.span(k)[0]
        out.append([_Block(b, item[b], b - first[item[b]], start[b] - base, stop[b] - start[b])
                    for b in units.blocks_ending_in(k).tolist()])
    return out


class SlottedBlockWrite:
    """Codes and writes the block file of ``plan`` from units staged into ``slots``.

    The protocol of ``FileWrite`` in slotted mode: ``start``, ``unit_ready(k, buf)``,
    ``fail``, ``error``, ``finish`` (returns the ``CodedFile``), ``cancel``.

    Args:
        plan: The items to compress, laid out by ``slotted_layout``.
        storage: Backend (ranged writes needed).
        path_of: The storage path of a file name.
        name: The block file's name.
        compression: ``"zstd"`` or ``"auto"``.
        block_size: Raw bytes per coded block.
        unit_size: Bytes per staging unit (a multiple of ``block_size``).
        slots: The pool the units' buffers come from (given back here).
        window: Blocks coded ahead of the writer at most.
        mirrors: Other directories receiving the same file.
    """

    def __init__(self, plan: FilePlan, storage: Storage, path_of: Callable[[str], str], name: str,
                 compression: str, block_size: int, unit_size: int, slots: BouncePool, *,
                 window: int, mirrors: Sequence[BlockMirror] = ()) -> None:
        self.plan, self.storage, self.name = plan, storage, name
        self.path = path_of(name)
        self.compression, self.slots, self.window = compression, slots, max(1, window)
        self.mirrors = list(mirrors)
        self.units = FileUnits(plan, unit_size, block_size)
        self._blocks = _unit_blocks(self.units)
        self._total = self.units.nblocks_total
        self.bound = len(MAGIC) + sum(it.nbytes for it in plan.items)
        self.out = CodedFile.empty(name)
        self._cond = threading.Condition()
        self._order = threading.Lock()  # held while writing blocks in file order
        self._next = 0  # the next block to write
        self._written = 0
        self._coded: dict[int, tuple[_Block, CodedBlock]] = {}
        self._held: dict[int, tuple[HostBuffer, int]] = {}  # unit -> (buffer, blocks not yet written)
        self._unit_of_seq: dict[int, int] = {b.seq: k for k, bs in enumerate(self._blocks) for b in bs}
        self._failed: BaseException | None = None
        self._writer: RangeWriter | None = None

    def start(self) -> None:
        """Creates the file (at its upper bound) and writes the magic bytes."""
        w = self.storage.open_writer(self.path, self.bound)
        if w is None:
            raise ValueError(f"{type(self.storage).__name__} has no ranged writes "
                             f"(max_staging_bytes needs a local path)")
        self._writer = w
        self._write(0, memoryview(MAGIC))

    def error(self) -> BaseException | None:
        return self._failed

    def fail(self, exc: BaseException) -> None:
        """Staging failed (or a job did): ``finish`` raises ``exc``."""
        with self._cond:
            if self._failed is None:
                self._failed = exc
            self._cond.notify_all()

    def unit_ready(self, k: int, buf: HostBuffer) -> None:
        """Unit ``k`` is staged in ``buf``: its blocks are coded (in file order, at most
        ``window`` ahead of the writer) and ``buf`` is given back once they are written."""
        blocks = self._blocks[k]
        with self._cond:
            if self._failed is not None or not blocks:
                self.slots.release(buf)
                return
            self._held[k] = (buf, len(blocks))
        for b in blocks:
            with self._cond:
                while b.seq >= self._next + self.window and self._failed is None:
                    self._cond.wait()
                if self._failed is not None:
                    return  # cancel() gives the buffer back
            view = buf.array[b.start : b.start + b.length]
            fut = io_pool().submit(_code, view, self.plan.items[b.item].dtype, self.compression, False)
            fut.add_done_callback(lambda f, b=b: self._coded_one(b, f))

    def _coded_one(self, b: _Block, fut: object) -> None:
        try:
            coded = fut.result()  # type: ignore[attr-defined]
        except BaseException as e:  # noqa: BLE001 - the save fails with it (finish raises)
            self.fail(e)
            return
        with self._cond:
            self._coded[b.seq] = (b, coded)
        with self._order:  # one thread at a time writes the blocks that are next, in order
            while True:
                with self._cond:
                    got = self._coded.pop(self._next, None)
                    if got is None:
                        return
                    self._next += 1
                self._append(*got)

    def _append(self, b: _Block, c: CodedBlock) -> None:
        o = self.out
        try:
            if self._failed is None:
                self._write(o.size, memoryview(c.data).cast("B") if len(c.data) else memoryview(b""))
        except BaseException as e:  # noqa: BLE001 - the save fails with it
            self.fail(with_path(e, self.path))
        if b.index == 0:
            o.begin_item(self.plan.items[b.item])
        o.add_block(c)
        k = self._unit_of_seq[b.seq]
        with self._cond:
            held = self._held.get(k)
            if held is not None and held[1] == 1:
                del self._held[k]
                self.slots.release(held[0])
            elif held is not None:
                self._held[k] = (held[0], held[1] - 1)
            self._written += 1
            self._cond.notify_all()

    def _write(self, offset: int, data: memoryview) -> None:
        for m in self.mirrors:
            m.write_at(self.name, self.bound, offset, data)
        assert self._writer is not None
        self._writer.write_at(offset, data)

    def finish(self, timeout: float | None = None) -> list[CodedFile]:
        """Waits for every block, makes the file durable, returns what it holds."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._written == self._total or self._failed is not None, timeout)
        try:
            if not ok:
                raise TimeoutError(f"{self.name}: staging did not finish")
            if self._failed is not None:
                raise self._failed
            assert self._writer is not None
            self._writer.size = self.out.size
            self._writer.close(sync=True)
            self._writer = None
        except BaseException as e:
            self.cancel(e)
            raise
        mirrors, self.mirrors = self.mirrors, []
        for m in mirrors:
            m.finish([self.out])
        return [self.out]

    def cancel(self, error: BaseException | None = None) -> None:
        """Stops: gives the held buffers back, closes the file unsynced, fails the mirrors."""
        self.fail(error or RuntimeError(f"the write of {self.name} was cancelled"))
        with self._cond:
            held, self._held = list(self._held.values()), {}
        for buf, _ in held:
            self.slots.release(buf)
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        mirrors, self.mirrors = self.mirrors, []
        for m in mirrors:
            m.finish(None, self._failed)


__all__ = ["SlottedBlockWrite", "slotted_layout"]
