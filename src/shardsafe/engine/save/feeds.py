"""Feeds: the first stage of the save pipeline, which copies a save's bytes out of
training memory, exactly once, into host units.

A save's output files are *streams* (``engine.save.streams``), each cut into units
(``engine.save.units``). A feed fills every unit of every live stream and hands each
one on (``emit``) as soon as its bytes are final; the next stages checksum or compress
it and write it, and give it back (``release``) when every sink has it.

- ``ImageFeed``: whole file images carved from one slab of the Checkpointer's staging
  arena (async saves without a budget): every unit is a view into its image, so the
  state is staged in full and the call can return before anything is written.
- ``PoolFeed``: each unit is copied into a buffer of a bounded pool (sync saves'
  bounce buffers; the slots of ``max_staging_bytes``), which the unit holds until
  every sink wrote it. The pool is the bound on everything in flight: when all its
  buffers are taken, the feed waits for the writes. Buffers are taken in unit order
  (under one lock), so the oldest unit in flight always has one and ordered sinks
  (block files, uploads) always progress.

CUDA tensors fit the same seam: their bytes are copied device-to-host on side streams
that wait for the caller's stream at the call (the save's ``cuda.Fence``), into the same
buffers, page-locked (under the tensors' GPU) the first time a save of GPU state uses
them. ``PoolFeed`` copies each unit's device parts and waits for them before handing the
unit on. ``ImageFeed`` queues the whole state's device copies first (overlapping the
host copies), makes the caller's streams wait for them on the GPU, and returns without
waiting: ``settle`` (the writer's thread) hands those units on once they have landed.

Copies run on the calling thread plus helpers of the copy pool (numpy and torch copies
release the GIL); the copy pool is separate from the I/O pool, so staging never queues
behind the writes it feeds.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ... import knobs
from ...plan.layout import FilePlan
from .. import cuda
from ..buffers import BouncePool, HostBuffer, HostSlice
from ..io_pool import SharedThreadPool, wait_all
from .sources import Sources, copy_device_parts, copy_unit, pin_device
from .units import FileUnits

_pool = SharedThreadPool(lambda: max(1, knobs.copy_threads() - 1), "shardsafe-copy")


def copy_pool() -> ThreadPoolExecutor:
    """The process-wide pool of staging helpers (``SHARDSAFE_COPY_THREADS`` - 1 threads)."""
    return _pool.get()


class Fed(Protocol):
    """What a feed needs of a stream: its units, the items' bytes, and whether anyone
    still wants it (a stream whose every sink has failed is not staged)."""

    units: FileUnits
    sources: Sources

    def live(self) -> bool: ...


class Feed(Protocol):
    """The first stage of a save: fills every stream's units with the state's bytes and
    hands each on (``emit``) once final; a feed whose copies finish on a device later
    hands those on in ``settle``."""

    def stage(self, streams: Sequence[Fed], emit: Emit, stopped: Stopped, threads: int | None = None) -> None:
        """Fills and emits the units (``stopped()`` says why to stop early); raises a
        staging failure."""
        ...

    def settle(self, emit: Emit) -> None:
        """Emits the units whose device copies were still landing when ``stage`` returned."""
        ...


@dataclass(slots=True, eq=False)
class Unit:
    """One unit of a stream, its bytes final in ``buf``.

    Attributes:
        stream: The stream it belongs to.
        k: Its number in the stream.
        start, stop: Its file range in the stream's image.
        buf: The host buffer holding it.
        base: The image offset of ``buf``'s first byte (0 for an image; ``start`` for a
            pool buffer).
        holds: Sinks still writing it (it is released when the last one is done).
    """

    stream: Fed
    k: int
    start: int
    stop: int
    buf: HostBuffer | HostSlice
    base: int
    holds: int = 0

    def view(self, start: int, stop: int) -> memoryview:
        """Image bytes ``[start, stop)`` (``stop`` may reach into the buffer's padding)."""
        return self.buf.view(start - self.base, stop - self.base)

    @property
    def array(self) -> np.ndarray:
        """The unit's bytes, as uint8."""
        return self.buf.array[self.start - self.base : self.stop - self.base]


Emit = Callable[[Unit], None]
Stopped = Callable[[], BaseException | None]
Images = Sequence[HostBuffer | HostSlice]


class ImageFeed:
    """Copies every stream into its own image (``images[i]`` holds stream ``i`` whole).

    Args:
        images: One per stream, or what makes them from the streams' sizes when staging
            begins (a Checkpointer's staging arena: ``StagingArena.get``).
        pin: Page-lock the images' memory when a stream has CUDA items.
        fence: Where the caller's streams were at the call (None: no CUDA tensors).
    """

    def __init__(self, images: Images | Callable[[list[int]], Images], *, pin: bool = False,
                 fence: cuda.Fence | None = None) -> None:
        self._images = images
        self.images: list[HostBuffer | HostSlice] = []
        self.pin, self.fence = pin, fence
        self._landing: tuple[cuda.DeviceCopier, list[Unit]] | None = None

    def stage(self, streams: Sequence[Fed], emit: Emit, stopped: Stopped, threads: int | None = None) -> None:
        """Stages every unit of every live stream, emitting each once its bytes are final
        (units with device copies: by ``settle``)."""
        got = self._images
        self.images = list(got([s.units.size for s in streams]) if callable(got) else got)
        copier = None
        done: list[Unit] = []
        for s, img in zip(streams, self.images):
            if not s.sources.device or not s.live():
                continue
            if self.pin:
                img.pin_for(pin_device(s.sources, s.units.plan))
            for i in s.sources.device:
                if copier is None:  # from here on, settle() must wait for them, even after a failure
                    copier = cuda.DeviceCopier(self.fence)
                    self._landing = (copier, done)
                off, n = int(s.units.offsets[i]), int(s.units.nbytes[i])
                copier.copy(s.units.plan.items[i].value, img.array[off : off + n])
        if copier is not None:
            copier.hold_callers()  # the caller's next kernels run after the copies, on the GPU
        work = [(s, img, k) for s, img in zip(streams, self.images) if s.live() for k in range(s.units.nunits)]
        cursor = itertools.count()  # next() on a count is atomic under the GIL

        def run() -> None:
            while (j := next(cursor)) < len(work) and stopped() is None:
                s, img, k = work[j]
                copy_unit(s.units, k, s.sources, img.array)
                start, stop = s.units.span(k)
                unit = Unit(s, k, start, stop, img, 0)
                if copier is None:
                    emit(unit)
                else:  # with device copies, emitted once they have landed
                    done.append(unit)

        _run_threads(run, min(threads or knobs.copy_threads(), len(work)))

    def settle(self, emit: Emit) -> None:
        """Waits (asleep) for the device copies ``stage`` queued, then emits their units.

        An async save's caller returns before this: its streams wait for the copies on the
        GPU (``DeviceCopier.hold_callers``); the writer's thread calls this. A save that
        fails calls it too (emitting nothing), so that no copy still lands in an image the
        next save reuses.
        """
        landing, self._landing = self._landing, None
        if landing is not None:
            copier, done = landing
            copier.wait()
            for unit in done:
                emit(unit)

    def release(self, unit: Unit) -> None:
        """Nothing to give back: the image stays for the next save."""


class PoolFeed:
    """Copies each unit into a buffer of ``pool`` (every stream's units at most
    ``pool.size`` bytes), given back by ``release``."""

    def __init__(self, pool: BouncePool, *, fence: cuda.Fence | None = None) -> None:
        self.pool, self.fence = pool, fence

    def stage(self, streams: Sequence[Fed], emit: Emit, stopped: Stopped, threads: int | None = None) -> None:
        """Stages every unit of every live stream, in order, waiting for free buffers."""
        for s in streams:
            if s.units.unit_size > self.pool.size:
                raise ValueError(f"{s.units.plan.name}: units of {s.units.unit_size} bytes do not fit "
                                 f"buffers of {self.pool.size}")
        work = [(s, k) for s in streams if s.live() for k in range(s.units.nunits)]
        cursor = itertools.count()
        take = threading.Lock()

        def run() -> None:
            while True:
                with take:  # buffers go to units in order (see the module docstring)
                    j = next(cursor)
                    if j >= len(work):
                        return
                    buf = self.pool.acquire(lambda: stopped() is not None)
                if buf is None:
                    return
                s, k = work[j]
                start, stop = s.units.span(k)
                try:
                    if s.live():
                        self.copy(s, k, buf, start)
                    else:
                        self.skip(s, k)
                except BaseException:
                    self.pool.release(buf)
                    raise
                emit(Unit(s, k, start, stop, buf, start))

        _run_threads(run, min(threads or knobs.copy_threads(), len(work), self.pool.count))

    def copy(self, stream: Fed, k: int, buf: HostBuffer, start: int) -> None:
        """Copies unit ``k`` of ``stream`` (image offset ``start``) into ``buf`` (a feed whose
        sources arrive late, such as a re-encoding copy's, copies them as they come)."""
        copy_unit(stream.units, k, stream.sources, buf.array, base=start)
        if stream.sources.device:
            if self.pool.pin:
                buf.pin_for(pin_device(stream.sources, stream.units.plan))
            copy_device_parts(stream.units, k, stream.sources, buf.array, base=start, fence=self.fence)

    def skip(self, stream: Fed, k: int) -> None:
        """Unit ``k`` of ``stream`` is not copied (nobody wants the stream any more)."""

    def settle(self, emit: Emit) -> None:
        """Nothing is in flight once ``stage`` returns: each unit's device copies landed
        before it was handed on."""

    def release(self, unit: Unit) -> None:
        self.pool.release(unit.buf)  # type: ignore[arg-type]


@dataclass(slots=True, eq=False)
class _Whole:
    """A stream staged whole, wanted to the end (``stage_image``)."""

    units: FileUnits
    sources: Sources

    def live(self) -> bool:
        return True


def stage_image(plan: FilePlan, image: HostBuffer | HostSlice, unit_size: int, block_size: int, *,
                pin: bool = False) -> None:
    """Copies the items of ``plan`` into ``image`` (``plan.layout.size`` bytes) with an
    ``ImageFeed``: units copied in parallel, CUDA items on a side stream that waits for
    this thread's current stream (``pin``: page-locking ``image`` first); returns once
    every byte has landed (``shardsafe.dcp.Stager``'s copy, outside any save)."""
    feed = ImageFeed([image], pin=pin, fence=cuda.Fence.capture(it.value for it in plan.items))
    feed.stage([_Whole(FileUnits(plan, unit_size, block_size), Sources(plan))], lambda unit: None, lambda: None)
    feed.settle(lambda unit: None)


def _run_threads(run: Callable[[], None], n: int) -> None:
    """Runs ``run`` on this thread and ``n - 1`` copy-pool helpers; re-raises the first error."""
    helpers = [copy_pool().submit(run) for _ in range(max(0, n - 1))]
    try:
        run()
    finally:
        wait_all(helpers)


__all__ = ["ImageFeed", "PoolFeed", "Unit", "copy_pool", "stage_image"]
