"""The writes of a save and of its copies, and the stager that feeds them all.

A save (``PreparedSave``) may carry copies (``engine.copies``): a mirrored file of a
copy is written by the save's own write of that file (its ``mirrors``), a copy's own
files get writes of their own. Every shape returns ``Jobs``: the save's writes (data
files, then block files), each copy's own writes (the same order), and the stager that
copies the state out of training memory, once, into whatever feeds them:

* ``staged``: whole file images carved from one slab (``StagingArena.get``: the
  save's files, then each copy's own files); block files are coded from their images
  once staged.
* ``slotted``: units stream through a bounded pool of buffers (``max_staging_bytes``);
  block files are coded from the units as they arrive (``engine.block_stream``); each
  buffer is given back once the save and every mirror wrote it.
* ``streamed`` (sync saves, on the caller's thread): each unit is bounced through a few
  buffers and written; block files are coded from per-block copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..plan.layout import FilePlan, block_file_name
from ..storage.base import Storage
from . import pipeline
from .block_stream import SlottedBlockWrite, slotted_layout
from .block_writer import BlockFileWrite
from .buffers import BouncePool, HostBuffer, HostSlice
from .copies import MirrorBlocks, MirrorFile, PreparedCopy
from .handle import SaveHandle
from .prepared import BLOCK_SIZE, PreparedSave
from .staging import StageTask, host_sources, stage_files, stage_through
from .units import FileUnits
from .writer import FileWrite

Write = FileWrite | BlockFileWrite | SlottedBlockWrite
Stager = Callable[[int | None], None]
"""Copies the state into host buffers with that many threads (None: the default)."""


@dataclass(slots=True)
class Jobs:
    """What a save writes: its own writes, each copy's own writes, and the stager."""

    writes: list[Write]
    copy_writes: list[list[Write]]
    stage: Stager

    def all_writes(self) -> list[Write]:
        """The save's writes and every copy's."""
        return self.writes + [w for own in self.copy_writes for w in own]


def staged_sizes(prep: PreparedSave, copies: Sequence[PreparedCopy]) -> list[int]:
    """The sizes of the images ``staged`` needs, in its order."""
    plans = prep.plans + prep.coded + [p for c in copies for p in c.own_plans() + c.own_coded()]
    return [p.layout.size for p in plans]


def _mirrors(copies: Sequence[PreparedCopy], prep: PreparedSave, j: int, coded: bool) -> list:
    """The mirror targets of the save's plan ``j`` (block plan with ``coded``), one per copy
    that mirrors it; each also joins its copy's ``targets``."""
    out: list[MirrorFile | MirrorBlocks] = []
    for c in copies:
        where = c.coded_mirrors if coded else c.mirrors
        if j in where:
            plan = c.prep.coded[where[j]] if coded else c.prep.plans[where[j]]
            t = MirrorBlocks(c, plan, prep.coded[j]) if coded else MirrorFile(c, plan, prep.plans[j])
            c.targets.append(t)
            out.append(t)
    return out


def staged(prep: PreparedSave, copies: Sequence[PreparedCopy], buffers: Sequence[HostBuffer | HostSlice],
           unit_size: int) -> Jobs:
    """Writes of whole staged file images (block files coded once staged), and the stager."""
    tasks: list[StageTask] = []
    images = iter(buffers)

    def data_write(p: PreparedSave, plan: FilePlan, mirrors: list) -> FileWrite:
        buf, units = next(images), FileUnits(plan, unit_size, BLOCK_SIZE)
        fw = FileWrite(units, p.storage, p.file_path(plan), staged=buf, mirrors=mirrors)
        tasks.append(StageTask(units, buf.array, fw.unit_ready))
        return fw

    def block_write(p: PreparedSave, plan: FilePlan, mirrors: list, name_of: Callable[[int], str] | None) -> BlockFileWrite:
        buf, units = next(images), FileUnits(plan, unit_size, BLOCK_SIZE)
        bw = pipeline.block_file_write(p, plan, staged=buf.array, nunits=units.nunits, mirrors=mirrors,
                                       name_of=name_of)
        tasks.append(StageTask(units, buf.array, bw.unit_ready))
        return bw

    writes: list[Write] = [data_write(prep, plan, _mirrors(copies, prep, j, False)) for j, plan in enumerate(prep.plans)]
    writes += [block_write(prep, plan, _mirrors(copies, prep, j, True), None) for j, plan in enumerate(prep.coded)]
    copy_writes: list[list[Write]] = []
    for c in copies:
        own: list[Write] = [data_write(c.prep, plan, []) for plan in c.own_plans()]
        own += [block_write(c.prep, plan, [], c.own_block_name) for plan in c.own_coded()]
        copy_writes.append(own)
    return Jobs(writes, copy_writes, lambda threads: stage_files(tasks, threads=threads))


def slotted(prep: PreparedSave, copies: Sequence[PreparedCopy], handle: SaveHandle, slots: BouncePool,
            unit_size: int, window: int) -> Jobs:
    """Writes fed unit by unit from the buffers of ``slots``, and their stager.

    The stager stops (and raises) once a write of the save failed or the writer thread
    gave up (``handle`` settled early), instead of waiting for buffers nobody will free.
    """
    tasks: list[StageTask] = []

    def data_write(p: PreparedSave, plan: FilePlan, mirrors: list) -> FileWrite:
        units = FileUnits(plan, unit_size, BLOCK_SIZE)
        fw = FileWrite(units, p.storage, p.file_path(plan), slots=slots, mirrors=mirrors)
        tasks.append(StageTask(units, np.empty(0, np.uint8), fw.unit_ready))
        return fw

    def block_write(p: PreparedSave, plan: FilePlan, mirrors: list, name: str) -> SlottedBlockWrite:
        layout = slotted_layout(plan.name, plan.items, unit_size)
        assert p.compression is not None
        bw = SlottedBlockWrite(layout, p.storage, p.path_of, name, p.compression, BLOCK_SIZE, unit_size,
                               slots, window=window, mirrors=mirrors)
        tasks.append(StageTask(bw.units, np.empty(0, np.uint8), bw.unit_ready))
        return bw

    rank = prep.comm.rank
    writes: list[Write] = [data_write(prep, plan, _mirrors(copies, prep, j, False)) for j, plan in enumerate(prep.plans)]
    writes += [block_write(prep, plan, _mirrors(copies, prep, j, True), block_file_name(rank, j))
               for j, plan in enumerate(prep.coded)]
    copy_writes: list[list[Write]] = []
    for c in copies:
        own: list[Write] = [data_write(c.prep, plan, []) for plan in c.own_plans()]
        own += [block_write(c.prep, plan, [], c.own_block_name(j)) for j, plan in enumerate(c.own_coded())]
        copy_writes.append(own)

    def failed() -> BaseException | None:
        if handle.done():
            return handle.exception(0)
        return next((e for w in writes if (e := w.error()) is not None), None)

    return Jobs(writes, copy_writes, lambda threads: stage_through(tasks, slots, threads=threads, failed=failed))


def streamed(prep: PreparedSave, copies: Sequence[PreparedCopy], unit_size: int,
             data_write: Callable[[Storage, str, FileUnits, list], FileWrite]) -> Jobs:
    """Sync-save writes, started and fed at once (``data_write`` makes a started data-file
    write from its storage, path, units and mirrors; block files are coded from per-block
    copies of the items' bytes)."""
    jobs = Jobs([], [], lambda threads: None)
    for j, plan in enumerate(prep.plans):
        jobs.writes.append(data_write(prep.storage, prep.file_path(plan), FileUnits(plan, unit_size, BLOCK_SIZE),
                                      _mirrors(copies, prep, j, False)))
    for j, plan in enumerate(prep.coded):
        bw = pipeline.block_file_write(prep, plan, sources=host_sources(plan, device=False),
                                       mirrors=_mirrors(copies, prep, j, True))
        jobs.writes.append(bw)
        bw.all_ready()
    for c in copies:
        own: list[Write] = [data_write(c.prep.storage, c.prep.file_path(plan), FileUnits(plan, unit_size, BLOCK_SIZE), [])
                            for plan in c.own_plans()]
        for plan in c.own_coded():
            bw = pipeline.block_file_write(c.prep, plan, sources=host_sources(plan, device=False),
                                           name_of=c.own_block_name)
            own.append(bw)
            bw.all_ready()
        jobs.copy_writes.append(own)
    return jobs


__all__ = ["Jobs", "Stager", "Write", "slotted", "staged", "staged_sizes", "streamed"]
