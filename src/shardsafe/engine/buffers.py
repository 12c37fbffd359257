"""Page-aligned, pre-faulted host buffers (anonymous mmap), reusable across saves.

Why mmap and pre-faulting: a copy into freshly allocated memory runs at page-fault
speed (~2 GB/s on the project machine) while a copy into memory whose pages already
exist runs at memcpy speed (~15 GB/s). Staging buffers are therefore allocated once
per state layout (``StagingArena``) and touched once up front; alignment lets the
writers hand them to ``O_DIRECT`` without a bounce copy, and huge pages (see
``storage.memory``) make both the pre-faulting and the direct I/O cheaper.
"""

from __future__ import annotations

import logging
import math
import mmap
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from .. import values
from .._numbers import ceil_div
from ..errors import CheckpointError
from ..format.datafile import ALIGN
from ..format.dtypes import lookup
from ..storage.memory import HUGE, anonymous
from . import cuda

log = logging.getLogger("shardsafe")

PAGE = mmap.PAGESIZE


def round_up(n: int, to: int = ALIGN) -> int:
    """``n`` rounded up to a multiple of ``to`` (buffers are padded to ALIGN so that the
    last range of a file goes through direct I/O too)."""
    return ceil_div(n, to) * to


@contextmanager
def allocating(what: Callable[[], str]) -> Iterator[None]:
    """Turns a failed host allocation (a checkpoint larger than memory, e.g. a forged one
    over sparse files) into a ``CheckpointError``; ``what()`` says what was being read."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        if not isinstance(e, MemoryError) and "alloc" not in str(e):
            raise  # a torch RuntimeError that is not about memory
        raise CheckpointError(f"cannot allocate memory to load {what()}: {e}") from e


def new_tensor(kind: str, dtype: str, shape: tuple[int, ...], *, huge: bool = False) -> tuple[Any, np.ndarray]:
    """A new host tensor (or numpy array) for a load to fill: ``(value, writable bytes)``.

    From ``HUGE`` bytes on, the memory is an anonymous mapping of its own (returned to
    the OS when the tensor dies) whose page-aligned start lets a cold read go straight
    into it with direct I/O, instead of through a bounce buffer and a second copy. Like
    ``torch.load``'s, such a tensor's storage cannot be resized. Smaller values come
    from their stored kind (``values.stored_kind``).

    ``huge``: on transparent huge pages, for bytes read with direct I/O (cold): on the
    project VM a cold direct read into fresh huge pages ran 2x faster than into 4 KiB
    pages, but a copy from the page cache (warm) into them 2-3x slower (its balloon
    device takes back free 2 MiB blocks; docs/BENCHMARKS.md), so warm loads keep 4 KiB
    pages.
    """
    d = lookup(dtype)
    nbytes = d.itemsize * math.prod(shape)
    made = values.stored_kind(kind)
    if nbytes < HUGE or not made.wraps(d):
        return made.empty(dtype, shape)
    try:
        _map, flat = anonymous(nbytes, huge=huge)  # ``flat`` keeps the mapping alive
    except (OSError, OverflowError) as e:  # e.g. ENOMEM: what an allocator would raise
        raise MemoryError(f"cannot map {nbytes} bytes for a {dtype} tensor of shape {shape}: {e}") from e
    return made.from_bytes(dtype, shape, flat), flat


class HostBuffer:
    """A page-aligned host byte buffer, suitable as a direct-I/O source.

    Memory comes from an anonymous mapping, so it is page-aligned and returned to the
    OS on ``close()``. ``array`` has exactly ``nbytes`` bytes; the mapping is padded to
    a multiple of 4096 (``capacity``) so a writer may send the last range padded.

    Page-locking is on demand (``pin_for``): only a save that copies from a GPU pays for
    it (and for a CUDA context), once per buffer, under that GPU.

    Args:
        nbytes: Usable size.
        prefault: Touch every page now so later copies run at memcpy speed.
    """

    def __init__(self, nbytes: int, *, prefault: bool = True) -> None:
        self.nbytes = nbytes
        self.capacity = max(round_up(nbytes), ALIGN)
        self._map, self._full = anonymous(self.capacity)
        self.array = self._full[:nbytes]
        if prefault:
            self._full[::PAGE] = 0
        self.pinned = False
        self._pin_device: int | None = None  # the device it was pinned under (or refused on)

    def pin_for(self, device: int) -> bool:
        """Page-locks the buffer for copies from CUDA ``device`` (once: a refusal, which
        warns, is not retried); whether it is page-locked."""
        if self._pin_device is None and not self._map.closed:
            self._pin_device = device
            self.pinned = cuda.pin(self._full, device)
        return self.pinned

    def view(self, start: int = 0, stop: int | None = None) -> memoryview:
        """A memoryview of ``[start, stop)``; ``stop`` may reach into the padding."""
        return memoryview(self._full)[start:stop]

    @property
    def closed(self) -> bool:
        return self._map.closed

    def close(self) -> None:
        """Returns the memory to the OS (if no view of it is alive, else when they die)."""
        if self._map.closed:
            return
        if self.pinned:
            cuda.unpin(self._full, self._pin_device)
            self.pinned = False
        self.array = self._full = np.empty(0, dtype=np.uint8)
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere; the GC frees it later
            pass


class HostSlice:
    """A page-aligned range of a ``HostBuffer`` with the same interface (``array``,
    ``view``, ``nbytes``, ``capacity``): one file image carved from a staging slab."""

    def __init__(self, parent: HostBuffer, start: int, nbytes: int) -> None:
        self.parent, self.start, self.nbytes = parent, start, nbytes
        self.capacity = max(round_up(nbytes), ALIGN)
        self.array = parent.array[start : start + nbytes]

    def view(self, start: int = 0, stop: int | None = None) -> memoryview:
        """A memoryview of ``[start, stop)``; ``stop`` may reach into the padding."""
        return self.parent.view(self.start + start, self.start + (self.capacity if stop is None else stop))

    def pin_for(self, device: int) -> bool:
        """Page-locks the whole slab this image is carved from (see ``HostBuffer.pin_for``)."""
        return self.parent.pin_for(device)


class StagingArena:
    """Staging memory kept for reuse: one slab of file images, or unit slots under a budget.

    ``get(sizes)`` carves file images of ``sizes`` bytes (each padded to a page, so every
    image can be written with direct I/O) from one slab. The slab is reused whenever the
    images fit in it and fill at least half of it, so saves whose layouts differ but
    whose total stays about the same (a step due on both tiers, then one due on the local
    tier only) reuse memory that is already faulted in; otherwise it is freed and a new
    one allocated (and pre-faulted), so at most one copy of the state is held.
    ``slots(size, count)`` instead gives a pool of at most ``count`` unit-sized buffers
    (saves with ``max_staging_bytes``): a state of any size streams through them. The
    arena holds one kind or the other, never both, so what it holds is what ``nbytes``
    says and never more than ``peak_nbytes``. Not a pool for concurrent saves: the
    Checkpointer runs one save at a time and holds its buffers until that save is written.
    """

    def __init__(self, *, pin: bool = False) -> None:
        self.pin = pin  # whether feeds may page-lock its buffers (they do for saves of GPU state)
        self._lock = threading.Lock()
        self._sizes: tuple[int, ...] | None = None
        self._slab: HostBuffer | None = None
        self._buffers: list[HostSlice] = []
        self._slots: BouncePool | None = None
        self._peak = 0
        self.allocations = 0  # how many times buffers were (re)allocated; for tests/benchmarks

    def get(self, sizes: Sequence[int]) -> list[HostSlice]:
        """Images of exactly ``sizes`` bytes (the same objects when the sizes match the last call)."""
        key = tuple(int(s) for s in sizes)
        need = sum(max(round_up(n), ALIGN) for n in key)
        with self._lock:
            if key == self._sizes:
                return list(self._buffers)
            slab = self._slab
            if slab is None or need > slab.nbytes or 2 * need < slab.nbytes:
                self._free()
                log.debug("allocating a staging slab of %d bytes for %d image(s)", need, len(key))
                slab = self._slab = HostBuffer(need)
                self._peak = max(self._peak, need)
                self.allocations += 1
            self._buffers, at = [], 0
            for n in key:
                self._buffers.append(HostSlice(slab, at, n))
                at += max(round_up(n), ALIGN)
            self._sizes = key
            return list(self._buffers)

    def slots(self, size: int, count: int) -> BouncePool:
        """A pool of at most ``count`` buffers of ``size`` bytes (reused when both match).

        Frees the whole-image buffers first. The pool allocates its buffers on first
        use, so a state smaller than ``count * size`` only costs the units it has.
        """
        with self._lock:
            s = self._slots
            if s is None or s.size != size or s.count != count:
                self._free()
                self._slots = BouncePool(size, count, pin=self.pin)
                self.allocations += 1
            return self._slots

    @property
    def buffers(self) -> tuple[HostSlice, ...]:
        """The images of the last ``get`` (the ones the next same-layout save reuses)."""
        return tuple(self._buffers)

    @property
    def nbytes(self) -> int:
        """Bytes currently held (the slab, or the slots allocated so far)."""
        held = self._slab.nbytes if self._slab is not None else 0
        return held + (self._slots.nbytes if self._slots is not None else 0)

    @property
    def peak_nbytes(self) -> int:
        """The most bytes this arena ever held at once (file images or slots)."""
        slots = self._slots.peak_nbytes if self._slots is not None else 0
        return max(self._peak, slots)

    def _free(self) -> None:
        if self._slab is not None:
            self._slab.close()
        self._slab, self._buffers, self._sizes = None, [], None
        if self._slots is not None:
            self._peak = max(self._peak, self._slots.peak_nbytes)
            self._slots.close()
            self._slots = None

    def release(self) -> None:
        """Frees the buffers (the next ``get`` or ``slots`` allocates again)."""
        with self._lock:
            self._free()


def slot_count(max_staging_bytes: object, unit_size: int) -> int:
    """How many ``unit_size`` buffers fit in ``max_staging_bytes`` (at least one).

    Raises:
        ValueError: the budget is not an int, or smaller than one unit.
    """
    if (isinstance(max_staging_bytes, bool) or not isinstance(max_staging_bytes, int)
            or max_staging_bytes < unit_size):
        raise ValueError(f"max_staging_bytes must be None or an int of at least one staging unit "
                         f"({unit_size} bytes), got {max_staging_bytes!r}")
    return max_staging_bytes // unit_size


class BouncePool:
    """A few fixed-size aligned buffers for streaming (sync-save bounce, budgeted staging).

    ``acquire`` blocks until a buffer is free, so memory stays at ``count * size``;
    buffers are allocated (and pre-faulted) on first need and kept until ``close``.

    Args:
        size: Bytes per buffer.
        count: Most buffers that ever exist at once.
        pin: Whether feeds may page-lock the buffers for CUDA copies (``HostBuffer.pin_for``).
    """

    POLL_S = 0.05  # how often a cancellable acquire re-checks whether it should give up

    def __init__(self, size: int, count: int, *, pin: bool = False) -> None:
        self.size = size
        self.count = count
        self.pin = pin
        self._free: list[HostBuffer] = []
        self._made = 0
        self._peak = 0
        self._cond = threading.Condition()

    def acquire(self, cancelled: Callable[[], bool] | None = None) -> HostBuffer | None:
        """A free buffer; waits for one to be released when all ``count`` are in use.

        With ``cancelled``, returns None as soon as it returns True (checked before
        taking a buffer and every ``POLL_S`` while waiting), so a stager waiting for
        writes that have failed does not wait forever.
        """
        with self._cond:
            while True:
                if cancelled is not None and cancelled():
                    return None
                if self._free:
                    return self._free.pop()
                if self._made < self.count:
                    break
                self._cond.wait(self.POLL_S if cancelled is not None else None)
            self._made += 1
            self._peak = max(self._peak, self._made)
        try:
            return HostBuffer(self.size)
        except BaseException:
            with self._cond:
                self._made -= 1
                self._cond.notify()
            raise

    @property
    def nbytes(self) -> int:
        """Bytes allocated (in use or idle)."""
        return self._made * self.size

    @property
    def peak_nbytes(self) -> int:
        """The most bytes allocated at once since this pool was made."""
        return self._peak * self.size

    def release(self, buf: HostBuffer) -> None:
        with self._cond:
            self._free.append(buf)
            self._cond.notify()

    def close(self) -> None:
        """Frees the idle buffers (buffers still acquired are freed by their holders' GC)."""
        with self._cond:
            for b in self._free:
                b.close()
            self._made -= len(self._free)
            self._free.clear()
