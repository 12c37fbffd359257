"""What each load target needs read, turned into the reader's tasks, then placed.

A target is a live tensor to restore in place (``match``), a new tensor of ``load(path)``
(``new_state``) or a region a DCP read item asks for. Whole tensors stored as one raw
chunk whose target is contiguous host memory are read by table row and address, with no
per-tensor object (``ChunkReader.whole_tasks``); the others through ``ReadJob``s; a target
the reader cannot fill directly (device memory, strided, another dtype: ``cast=True``)
gets a temporary of the stored dtype, copied (converted) in once every read succeeded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import dtensor, tensors
from ...format.index.objects import Index
from .match import TensorTarget
from .new_state import Allocated, whole_raw
from .reader import ChunkReader, ReadJob


def read_targets(reader: ChunkReader, targets: list[TensorTarget], new: Allocated | None = None) -> None:
    """Reads (and verifies) every target's region (and the tensors of a new state), then
    runs the copies into targets that are not contiguous host memory.

    Whole tensors stored as one raw chunk, whose target is contiguous host memory, are
    read by table row and address (``ChunkReader.whole_tasks``); the others through
    ``ReadJob``s.
    """
    jobs: list[ReadJob] = []
    direct = new or Allocated()
    table = reader.index.table
    assert table is not None, "a decoded index has its chunk table as columns"
    whole = whole_raw(table).tolist()
    starts = table.tensor_start.tolist()
    for tt in targets:
        if tt.dest is None and tt.offsets is None and tt.tid >= 0 and whole[tt.tid] and not tt.cast:
            addr = _address(tt.target)
            if addr is not None:
                direct.tensors.append(tt.tid)
                direct.rows.append(starts[tt.tid])
                direct.addrs.append(addr)
                continue
        e = reader.index.tensors[tt.tid] if tt.tid >= 0 else tt.entry
        if tt.dest is not None:  # a new tensor: its bytes are known, and it is the whole
            jobs.append(ReadJob(e, tt.dest, (0,) * len(e.shape), e.shape))
            continue
        # a DTensor target reads only its own box of the global tensor
        if tt.offsets is None:
            target, offsets, shape = dtensor.target_region(tt.target)
        else:
            target, offsets, shape = tt.target, tt.offsets, tensors.shape_of(tt.target)
        dest = None if tt.cast else tensors.writable_bytes(target)
        if dest is not None:
            jobs.append(ReadJob(e, dest, offsets, shape))
            continue
        tmp, tmp_bytes = tensors.empty(e.kind, e.dtype, shape)  # device / strided / cast target

        def done(target: Any = target, tmp: Any = tmp) -> None:
            tensors.copy_into(target, tmp)

        jobs.append(ReadJob(e, tmp_bytes, offsets, shape, done))
    tasks = reader.tasks(jobs)
    if direct.rows:
        tasks += reader.whole_tasks(np.asarray(direct.rows, dtype=np.int64), direct.addrs,
                                    np.asarray(direct.tensors, dtype=np.int64), fresh=new is not None)
    reader.run_tasks(tasks)
    for job in jobs:
        if job.done is not None:
            job.done()


def target_regions(targets: list[TensorTarget], index: Index) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """``(tensor id, offsets, shape)``: the region of its tensor each target is read from
    (what a load needs of the index). A DTensor target's box is worked out once, here:
    its local tensor and offsets replace it in the target."""
    out = []
    for tt in targets:
        if tt.dest is not None:
            shape = tuple(index.tensors[tt.tid].shape)
            out.append((tt.tid, (0,) * len(shape), shape))
            continue
        if tt.offsets is None and dtensor.is_dtensor(tt.target):
            tt.target, tt.offsets, _ = dtensor.target_region(tt.target)
        shape = tensors.shape_of(tt.target)
        out.append((tt.tid, tt.offsets if tt.offsets is not None else (0,) * len(shape), shape))
    return out


def _address(x: Any) -> int | None:
    """The address of a plain host tensor's memory when a load may write it directly
    (contiguous, on the CPU, no conj/neg bit, numpy: writeable); else None."""
    if type(x) in tensors.PLAIN_TENSOR_TYPES:
        if x.is_cpu and x.is_contiguous() and not x.is_conj() and not x.is_neg():
            return x.data_ptr()
        return None
    if type(x) is np.ndarray and x.flags.c_contiguous and x.flags.writeable:
        return x.ctypes.data
    return None


__all__ = ["read_targets", "target_regions"]
