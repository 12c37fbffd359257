"""The jobs of an async save: the file writes, and the stager that copies the state into them.

Two shapes, both ``(writes, stager)``: ``staged`` copies whole file images into buffers
that hold the entire state (block files are coded from theirs once staged); ``slotted``
streams units through a bounded pool of unit buffers (``max_staging_bytes``), each unit
written and its buffer given back while later units are staged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from . import pipeline
from .block_writer import BlockFileWrite
from .buffers import BouncePool, HostBuffer
from .handle import SaveHandle
from .prepared import BLOCK_SIZE, PreparedSave
from .staging import StageTask, stage_files, stage_through
from .units import FileUnits
from .writer import FileWrite

Write = FileWrite | BlockFileWrite
Stager = Callable[[int | None], None]
"""Copies the state into host buffers with that many threads (None: the default)."""
JobMaker = Callable[[], "tuple[list[Write], Stager]"]


def staged(prep: PreparedSave, buffers: Sequence[HostBuffer], unit_size: int) -> tuple[list[Write], Stager]:
    """Writes of whole staged file images (block files coded once staged), and the stager."""
    writes: list[Write] = []
    tasks = []
    for plan, buf in zip(prep.plans, buffers):
        units = FileUnits(plan, unit_size, BLOCK_SIZE)
        fw = FileWrite(units, prep.storage, prep.file_path(plan), staged=buf)
        writes.append(fw)
        tasks.append(StageTask(units, buf.array, fw.unit_ready))
    for plan, buf in zip(prep.coded, buffers[len(prep.plans):]):  # compressed after staging
        units = FileUnits(plan, unit_size, BLOCK_SIZE)
        bw = pipeline.block_file_write(prep, plan, staged=buf.array, nunits=units.nunits)
        writes.append(bw)
        tasks.append(StageTask(units, buf.array, bw.unit_ready))
    return writes, lambda threads: stage_files(tasks, threads=threads)


def slotted(prep: PreparedSave, handle: SaveHandle, slots: BouncePool,
            unit_size: int) -> tuple[list[Write], Stager]:
    """Writes fed unit by unit from the buffers of ``slots``, and their stager.

    The stager stops (and raises) once a write failed or the writer thread gave up
    (``handle`` settled early), instead of waiting for buffers nobody will free.
    """
    writes: list[FileWrite] = []
    tasks = []
    for plan in prep.plans:
        units = FileUnits(plan, unit_size, BLOCK_SIZE)
        fw = FileWrite(units, prep.storage, prep.file_path(plan), slots=slots)
        writes.append(fw)
        tasks.append(StageTask(units, np.empty(0, np.uint8), fw.unit_ready))

    def failed() -> BaseException | None:
        if handle.done():
            return handle.exception(0)
        return next((e for fw in writes if (e := fw.error()) is not None), None)

    def stage(threads: int | None) -> None:
        stage_through(tasks, slots, threads=threads, failed=failed)

    return list(writes), stage
