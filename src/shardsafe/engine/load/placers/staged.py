"""Staged destinations: targets a read cannot fill in place, through bounded host buffers.

A tensor on a GPU, a host tensor with strided memory, or one of another floating-point
dtype than the stored one (``load(..., cast=True)``) cannot be the destination of a
read. Such a target is cut into boxes of at most ``UNIT`` bytes (whole rows where a row
fits, ``boxes``); boxes are read in waves of at most ``WAVE`` bytes into one of two host
buffers, page-locked when a target is on a GPU, and each wave is copied (converted)
into its targets while the next wave is being read into the other buffer. A load's
staging memory is so at most ``2 * WAVE`` whatever the size of its targets, and a
GPU's copies run from page-locked memory, asynchronously, overlapped with the reads.

A box is copied into its target only after every block it was read from passed its
checksum; a load that fails part-way leaves the boxes of earlier waves restored (as a
contiguous host target is left part-read, see docs/guides/save-and-load.md).
``STATS`` records the staging memory of this process's most recent load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .... import values
from ....values import torch as torch_values
from ....format.dtypes import lookup
from ....format.index.objects import TensorEntry
from ... import cuda
from ...buffers import HostBuffer
from ...io_pool import io_pool, wait_all
from ..reader import ChunkReader, ReadJob

UNIT = 16 << 20  # bytes of one box at most (a checksum block by default)
WAVE = 64 << 20  # bytes of boxes read into one staging buffer at a time
ALIGN = 64  # each box starts on this boundary of its buffer


@dataclass(slots=True)
class StagedTarget:
    """A region of a stored tensor to copy into ``target`` once read.

    Attributes:
        entry: The stored tensor.
        target: The tensor the region is copied into (all of it).
        offsets: Where ``target`` starts in the stored tensor.
        shape: ``target``'s shape (the region's).
    """

    entry: TensorEntry
    target: Any
    offsets: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(slots=True)
class StagingStats:
    """Staging memory of this process's most recent load.

    Attributes:
        peak: Bytes of staging buffers held at once.
        live: Bytes still held (0 once a load returned or raised).
        waves: Waves read.
    """

    peak: int = 0
    live: int = 0
    waves: int = 0


STATS = StagingStats()

Box = tuple[tuple[int, ...], tuple[int, ...]]


def boxes(shape: tuple[int, ...], itemsize: int, unit: int | None = None) -> list[Box]:
    """``(offsets, extent)`` of row-major boxes of at most ``unit`` bytes (at least one
    element each) that tile ``shape``: runs of whole rows where a row fits in ``unit``,
    else one row at a time, itself cut the same way (``unit`` default: ``UNIT``)."""
    unit = UNIT if unit is None else unit
    if not shape:
        return [((), ())]
    if math.prod(shape) == 0:
        return []
    row = math.prod(shape[1:]) * itemsize
    if len(shape) == 1 or row <= unit:
        per = max(1, unit // row)
        rest = (0,) * (len(shape) - 1)
        return [((r, *rest), (min(per, shape[0] - r), *shape[1:])) for r in range(0, shape[0], per)]
    inner = boxes(shape[1:], itemsize, unit)
    return [((r, *o), (1, *e)) for r in range(shape[0]) for o, e in inner]


@dataclass(slots=True)
class _Piece:
    item: StagedTarget
    offsets: tuple[int, ...]
    extent: tuple[int, ...]
    nbytes: int


def _waves(items: Sequence[StagedTarget]) -> list[list[_Piece]]:
    waves: list[list[_Piece]] = [[]]
    used = 0
    for it in items:
        size = lookup(it.entry.dtype).itemsize
        for off, ext in boxes(it.shape, size):
            n = math.prod(ext) * size
            padded = -(-n // ALIGN) * ALIGN
            if used + padded > WAVE and waves[-1]:
                waves.append([])
                used = 0
            waves[-1].append(_Piece(it, off, ext, n))
            used += padded
    return [w for w in waves if w]


def place_staged(reader: ChunkReader, items: Sequence[StagedTarget]) -> None:
    """Reads every item's region (verified) and copies it into its target, in waves
    through two bounded host buffers (see the module docstring)."""
    waves = _waves(items)
    STATS.peak, STATS.waves = STATS.live, len(waves)
    if not waves:
        return
    size = max(sum(-(-p.nbytes // ALIGN) * ALIGN for p in w) for w in waves)
    device = next((cuda.device_index(it.target) for it in items if cuda.is_device_tensor(it.target)), None)
    buffers: list[HostBuffer] = []
    copies = _Copies()
    try:
        for _ in range(min(2, len(waves))):
            buf = HostBuffer(size, prefault=False)
            buffers.append(buf)
            STATS.live += buf.capacity
            STATS.peak = max(STATS.peak, STATS.live)
            if device is not None:
                buf.pin_for(device)
        prev: tuple[list[_Piece], list[ReadJob]] | None = None
        for k, wave in enumerate(waves):
            buf = buffers[k % 2]
            copies.wait(k % 2)  # the copies out of this buffer two waves ago
            jobs = _jobs(wave, buf)
            futures = [io_pool().submit(fn, *args) for fn, args in reader.tasks(jobs)]
            try:
                if prev is not None:
                    copies.issue((k - 1) % 2, *prev)  # overlapped with this wave's reads
            finally:
                wait_all(futures)
            prev = (wave, jobs)
        assert prev is not None
        copies.issue((len(waves) - 1) % 2, *prev)
    finally:
        copies.wait_all()
        for buf in buffers:
            STATS.live -= buf.capacity
            buf.close()


def _jobs(wave: list[_Piece], buf: HostBuffer) -> list[ReadJob]:
    jobs, at = [], 0
    for p in wave:
        start = tuple(a + b for a, b in zip(p.item.offsets, p.offsets))
        jobs.append(ReadJob(p.item.entry, buf.array[at : at + p.nbytes], start, p.extent))
        at += -(-p.nbytes // ALIGN) * ALIGN
    return jobs


class _Copies:
    """The copies of staged boxes into their targets; GPU ones asynchronous, each buffer's
    waited for before the buffer is read into again."""

    def __init__(self) -> None:
        self._events: dict[int, list[Any]] = {0: [], 1: []}

    def issue(self, slot: int, wave: list[_Piece], jobs: list[ReadJob]) -> None:
        devices = set()
        for p, job in zip(wave, jobs):
            src = values.stored_kind(p.item.entry.kind).from_bytes(p.item.entry.dtype, p.extent, job.dest)
            dst = p.item.target[_slices(p.offsets, p.extent)] if p.extent else p.item.target
            if cuda.is_device_tensor(dst):
                _copy_to_device(dst, src)
                devices.add(cuda.device_index(dst))
            else:
                values.copy_into(dst, src)
        if devices:
            torch = torch_values.torch
            for d in devices:
                ev = torch.cuda.Event()
                ev.record(torch.cuda.current_stream(d))
                self._events[slot].append(ev)

    def wait(self, slot: int) -> None:
        for ev in self._events[slot]:
            ev.synchronize()
        self._events[slot] = []

    def wait_all(self) -> None:
        self.wait(0)
        self.wait(1)


def _copy_to_device(dst: Any, src: Any) -> None:
    torch = torch_values.torch
    with torch.inference_mode() if dst.is_inference() else torch.no_grad():
        dst.copy_(src, non_blocking=True)  # from page-locked memory: asynchronous


def _slices(offsets: tuple[int, ...], extent: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(a, a + n) for a, n in zip(offsets, extent))


__all__ = ["STATS", "StagedTarget", "StagingStats", "UNIT", "WAVE", "boxes", "place_staged"]
