"""Copy tensors into the host image of their data files, with several threads.

Staging is the only part of an async save the training loop waits for (with
``staging="blocking"``), so it is a plain memcpy into pre-faulted buffers, split into
units that the caller thread and the copy pool take in turns (numpy and torch copies
release the GIL). CUDA tensors are copied asynchronously into pinned memory on a side
stream (``cuda.DeviceCopier``) while the host tensors are being copied.
"""

from __future__ import annotations

import ctypes
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


class Sources(Sequence[np.ndarray]):
    """Where the bytes of each item of a plan are on the host, by address.

    ``addr[i]`` is the address of item ``i``'s row-major bytes: the tensor's own memory
    when it is a contiguous host tensor (no object is made for it), else a host copy
    kept alive here; 0 for a CUDA item that staging copies on a side stream (``device``
    lists those). Indexing gives item ``i``'s bytes as a flat uint8 array (made on demand:
    the block writer and gathered writes use arrays; the copies use addresses).
    """

    def __init__(self, plan: FilePlan, *, device: bool = True) -> None:
        self._items = plan.items
        self.addr: list[int] = []
        self.device: list[int] = []
        self._keep: dict[int, np.ndarray] = {}
        plain, strided = tensors.PLAIN_TENSOR_TYPES, tensors.STRIDED
        for i, it in enumerate(plan.items):
            x = it.value
            if (type(x) in plain and x.is_cpu and x.layout is strided and x.is_contiguous()
                    and not x.is_conj() and not x.is_neg()):
                self.addr.append(x.data_ptr())
            elif type(x) is np.ndarray and x.flags.c_contiguous:
                self.addr.append(x.ctypes.data)
            elif device and cuda.is_device_tensor(x):
                self.addr.append(0)
                self.device.append(i)
            else:
                host = self._keep[i] = tensors.host_bytes(x)
                self.addr.append(host.ctypes.data)

    def __len__(self) -> int:
        return len(self.addr)

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        """Item ``i``'s bytes as a flat uint8 array (None for a CUDA item left to staging)."""
        kept = self._keep.get(i)
        if kept is not None:
            return kept
        if self.addr[i] == 0 and i in self.device:
            return None  # type: ignore[return-value]
        return _host_view(self._items[i].value)


def host_sources(plan: FilePlan, *, device: bool = True) -> Sources:
    """The host bytes of each item of ``plan`` (see ``Sources``).

    With ``device`` (staging), CUDA tensors are left out (``Sources.device``):
    ``stage_files`` copies them on a side stream. Without it they are copied to the host
    here, synchronously.
    """
    return Sources(plan, device=device)


def _host_view(x: object) -> np.ndarray:
    """``tensors.host_bytes``, with a shortcut for contiguous CPU tensors numpy can view."""
    if (type(x) in tensors.PLAIN_TENSOR_TYPES and x.device.type == "cpu" and x.is_contiguous()
            and not x.is_conj() and not x.is_neg()):
        try:
            return x.detach().numpy().reshape(-1).view(np.uint8)
        except TypeError:  # bfloat16 and other dtypes numpy lacks
            pass
    return tensors.host_bytes(x)


def copy_unit(units: FileUnits, k: int, sources: Sources, out: np.ndarray, base: int = 0) -> None:
    """Copies the host bytes of unit ``k`` into ``out[dst - base]`` (device parts are skipped).

    One ``memmove`` per part, by address: it releases the GIL (copy threads run in
    parallel) and costs no Python object per tensor.
    """
    header = units.plan.layout.header
    parts = units.parts(k)
    addr = sources.addr
    dst0 = out.ctypes.data - base
    move = ctypes.memmove
    for item, src, dst, n in zip(*parts):
        if item == HEADER:
            out[dst - base : dst - base + n] = np.frombuffer(header, dtype=np.uint8, count=n, offset=src)
        elif addr[item]:
            move(dst0 + dst, addr[item] + src, n)


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
    sources: Sources | None = None
    """Per-item host bytes (default: ``host_sources`` of the plan)."""


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
        for i in t.sources.device:
            copier = copier or cuda.DeviceCopier()
            off, n = int(t.units.offsets[i]), int(t.units.nbytes[i])
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


def _copy_device_parts(units: FileUnits, k: int, sources: Sources, out: np.ndarray, base: int) -> None:
    """Copies the CUDA parts of unit ``k`` into ``out[dst - base]`` and waits for them."""
    if not sources.device:
        return
    copier = None
    addr = sources.addr
    for item, src, dst, n in zip(*units.parts(k)):
        if item != HEADER and addr[item] == 0:
            copier = copier or cuda.DeviceCopier()
            copier.copy(units.plan.items[item].value, out[dst - base : dst - base + n], start=src)
    if copier is not None:
        copier.wait()


__all__ = ["Sources", "StageTask", "stage_files", "stage_through", "copy_unit", "host_sources"]
