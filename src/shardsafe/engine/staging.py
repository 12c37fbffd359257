"""Copy tensors into the host image of their data files, with several threads.

Staging is the only part of an async save the training loop waits for (with
``staging="blocking"``), so it is a plain memcpy into pre-faulted buffers, split into
units that the caller thread and the copy pool take in turns (numpy and torch copies
release the GIL). CUDA tensors are copied asynchronously into pinned memory on a side
stream (``cuda.DeviceCopier``) while the host tensors are being copied.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .. import knobs, tensors
from ..plan.layout import FilePlan
from .buffers import BouncePool
from .io_pool import wait_all
from . import cuda
from .units import HEADER, FileUnits

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def copy_pool() -> ThreadPoolExecutor:
    """The process-wide pool of staging helpers (separate from the I/O pool: staging
    tasks must never queue behind, or wait for, writes)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, knobs.copy_threads() - 1), thread_name_prefix="shardsafe-copy")
        return _pool


def _reset_in_child() -> None:
    """After ``fork``: drop the parent's copy pool (its threads do not exist in the child)."""
    global _pool, _pool_lock
    _pool_lock = threading.Lock()
    _pool = None


os.register_at_fork(after_in_child=_reset_in_child)


def host_sources(plan: FilePlan, *, device: bool = True) -> list[np.ndarray | None]:
    """Flat uint8 host views of each item's bytes.

    With ``device`` (staging), CUDA tensors get None: ``stage_files`` copies them on a
    side stream. Without it they are copied to the host here, synchronously.
    """
    return [None if device and cuda.is_device_tensor(it.value) else _host_view(it.value)
            for it in plan.items]


def _host_view(x: object) -> np.ndarray:
    """``tensors.host_bytes``, with a shortcut for contiguous CPU tensors numpy can view
    (half the per-tensor cost, which is what 20,000 small tensors pay)."""
    if (type(x) in tensors.PLAIN_TENSOR_TYPES and x.device.type == "cpu" and x.is_contiguous()
            and not x.is_conj() and not x.is_neg()):
        try:
            return x.detach().numpy().reshape(-1).view(np.uint8)
        except TypeError:  # bfloat16 and other dtypes numpy lacks
            pass
    return tensors.host_bytes(x)


def copy_unit(units: FileUnits, k: int, sources: Sequence[np.ndarray | None],
              out: np.ndarray, base: int = 0) -> None:
    """Copies the host bytes of unit ``k`` into ``out[dst - base]`` (device parts are skipped)."""
    header = units.plan.layout.header
    for p in units.parts(k):
        if p.item == HEADER:
            src = np.frombuffer(header, dtype=np.uint8, count=p.length, offset=p.src)
        else:
            s = sources[p.item]
            if s is None:
                continue
            src = s[p.src : p.src + p.length]
        out[p.dst - base : p.dst - base + p.length] = src


@dataclass(slots=True)
class StageTask:
    """One data file to stage: its units, item sources, destination, and a progress callback."""

    units: FileUnits
    """The file's units (what to copy where)."""
    out: np.ndarray
    """The file image (uint8, the file's size) the units are copied into."""
    on_unit: Callable[..., None] | None = None
    """Called with ``k`` once unit ``k`` holds its final bytes (any thread, any order);
    ``stage_through`` passes the unit's buffer too: ``on_unit(k, buf)``."""
    sources: list[np.ndarray | None] | None = None
    """Per-item flat host bytes (default: ``host_sources`` of the plan; None: a CUDA item)."""


def stage_files(tasks: Sequence[StageTask], *, threads: int | None = None) -> None:
    """Stages every file, calling ``on_unit(k)`` as each unit's bytes are in place.

    The calling thread works too; ``threads - 1`` helpers come from the copy pool.
    Device (CUDA) items are queued on a side stream first and awaited before the units
    are reported, so a reported unit is always complete.
    """
    copier = None
    for t in tasks:
        if t.sources is None:
            t.sources = host_sources(t.units.plan)
        for i, src in enumerate(t.sources):
            if src is None:
                copier = copier or cuda.DeviceCopier()
                off, n = t.units.plan.layout.offsets[i], t.units.nbytes[i]
                copier.copy(t.units.plan.items[i].value, t.out[off : off + n])
    work = [(t, k) for t in tasks for k in range(t.units.nunits)]
    report = copier is None  # with device copies, report only after they have landed
    cursor = itertools.count()  # next() on a count is atomic under the GIL

    def run() -> None:
        while (j := next(cursor)) < len(work):
            t, k = work[j]
            copy_unit(t.units, k, t.sources, t.out)
            if report and t.on_unit is not None:
                t.on_unit(k)

    n = min(threads or knobs.copy_threads(), len(work))
    helpers = [copy_pool().submit(run) for _ in range(n - 1)]
    try:
        run()
    finally:
        wait_all(helpers)
    if copier is not None:
        copier.wait()
        for t, k in work:
            if t.on_unit is not None:
                t.on_unit(k)


def stage_through(tasks: Sequence[StageTask], slots: BouncePool, *, threads: int | None = None,
                  failed: Callable[[], BaseException | None] = lambda: None) -> None:
    """Stages every file unit by unit through the buffers of ``slots`` (a memory budget).

    Units are taken in order; each is copied into a free buffer of ``slots`` (waiting for
    one to be released when all are in use) and handed on with ``on_unit(k, buf)``, whose
    receiver releases the buffer once the unit is written. Returns once every unit is
    staged, so a state larger than the pool streams through it while the writes go on.
    ``out`` of the tasks is unused. Device (CUDA) parts are copied per unit and awaited
    before the unit is handed on.

    Raises:
        BaseException: ``failed()`` returned an error (a write failed): staging stops
            and re-raises it.
    """
    for t in tasks:
        if t.sources is None:
            t.sources = host_sources(t.units.plan)
    work = [(t, k) for t in tasks for k in range(t.units.nunits)]
    cursor = itertools.count()
    broken = threading.Event()  # a copy failed: the other stagers stop too

    def stop() -> bool:
        return broken.is_set() or failed() is not None

    def run() -> None:
        while (j := next(cursor)) < len(work):
            t, k = work[j]
            buf = slots.acquire(stop)
            if buf is None:
                return
            try:
                start = t.units.span(k)[0]
                copy_unit(t.units, k, t.sources, buf.array, base=start)
                _copy_device_parts(t.units, k, t.sources, buf.array, start)
            except BaseException:
                broken.set()
                slots.release(buf)
                raise
            t.on_unit(k, buf)

    n = min(threads or knobs.copy_threads(), len(work), slots.count)
    helpers = [copy_pool().submit(run) for _ in range(n - 1)]
    try:
        run()
    finally:
        wait_all(helpers)
    err = failed()
    if err is not None:
        raise err


def _copy_device_parts(units: FileUnits, k: int, sources: Sequence[np.ndarray | None],
                       out: np.ndarray, base: int) -> None:
    """Copies the CUDA parts of unit ``k`` into ``out[dst - base]`` and waits for them."""
    copier = None
    for p in units.parts(k):
        if p.item != HEADER and sources[p.item] is None:
            copier = copier or cuda.DeviceCopier()
            copier.copy(units.plan.items[p.item].value, out[p.dst - base : p.dst - base + p.length],
                        start=p.src)
    if copier is not None:
        copier.wait()


__all__ = ["StageTask", "stage_files", "stage_through", "copy_unit", "host_sources"]
