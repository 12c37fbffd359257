"""``run()``: the one driver of a load, from its request to what it returns.

    index ──▶ placer.place ──▶ units: source ─▶ transform ─▶ destination ──▶ placer.finish
    (once, or   (match, allocate;   (byte ranges   (checksums,    (the target's own
     collective) nothing changed)    coalesced)     decoding)      memory, or staged)

Every load goes through it: ``shardsafe.load``, ``Checkpointer.load``, the manager's
tiers, the JAX restore, ``shardsafe.dcp.Reader`` (``read``) and the CLI. The index is read
once (rank 0 for all under torch.distributed, ``index_exchange``); the placer of the
request's target kind (``placers.placer_for``) says what to read, each tensor's
destination is decided once (``read_placement``), the units run on the I/O pool
(``reader``: the stages of different units overlap across its threads) and staged
targets go through bounded buffers (``placers.staged``); ``finish`` then hands back the
result.

A checkpoint overwritten while it is being loaded (the directory is swapped atomically)
is loaded again, from the new index; one deleted meanwhile (retention) is reported as
not found rather than damaged.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np

from ... import values
from ...values import torch as torch_values
from ..._gc_pause import paused
from ..._numbers import transfer
from ...errors import CheckpointNotFoundError, CorruptCheckpointError
from ...storage import Deadline, LocalStorage, storage_for
from ..buffers import allocating
from ..commit import is_committed
from ..commit.diagnose import not_found
from .index_exchange import IndexRead, read_index_alone, read_index_collective
from .match import TensorTarget
from .placers import Placement, Placer, placer_for, tensor_bytes
from .placers.new import Allocated, whole_raw
from .placers.staged import StagedTarget, place_staged
from .reader import ChunkReader, ReadJob
from .request import LoadRequest

log = logging.getLogger("shardsafe")

ATTEMPTS = 10  # an overwrite swaps the directory mid-load: read the new checkpoint instead (a
# writer that overwrites as fast as the loads run can overtake a few in a row on a busy machine)


def run(request: LoadRequest) -> Any:
    """Loads as ``request`` says: the new state, the ``LoadResult`` of an in-place load,
    or the restored JAX pytree (see ``shardsafe.load``)."""
    with paused():  # building thousands of tensors and entries: no collection meanwhile
        return _run(request)


def _run(r: LoadRequest) -> Any:
    t0 = time.perf_counter()
    comm = r.ranks()
    storage, spath = storage_for(r.path, r.storage_options, deadline=Deadline.for_call(
        r.timeout, comm.rank, f"load of {r.path}"))
    whole = r.target in ("new", "mapped")  # else a version 4 index is read in parts (what the targets need)
    if r.is_collective():
        try:
            read = read_index_collective(storage, spath, comm, r.timeout, whole)
        except CheckpointNotFoundError:
            raise not_found(storage, spath, r.path) from None
        return _from(read, r, t0)
    for attempt in range(ATTEMPTS):
        before = _identity(storage, spath)
        read = None
        try:
            read = read_index_alone(storage, spath, whole)
            return _from(read, r, t0)
        except (CorruptCheckpointError, CheckpointNotFoundError):
            if not is_committed(storage, spath):
                if read is None:  # never found an index: say what the path is instead
                    raise not_found(storage, spath, r.path) from None
                raise CheckpointNotFoundError(f"the checkpoint at {r.path!r} was deleted while being "
                                              f"loaded (by retention, or another process?)") from None
            if before is None or _identity(storage, spath) == before or attempt == ATTEMPTS - 1:
                raise
            log.info("%s was replaced (overwrite) while being loaded; loading the new one", r.path)
    raise AssertionError("unreachable")


def _from(read: IndexRead, r: LoadRequest, t0: float) -> Any:
    """Places the checkpoint whose index is ``read`` as ``r`` says; logs the load."""
    if r.check is not None:
        r.check(read.index)
    placer: Placer = placer_for(r)
    with allocating(lambda: f"{r.path!r} ({tensor_bytes(read.index)} bytes of tensors)"):
        placement = placer.place(read)
        read_placement(ChunkReader(read.storage, read.spath, placement.index), placement)
    value = placer.finish()
    log.info("loaded %s: %s", r.path, transfer(placement.nbytes, time.perf_counter() - t0))
    return value


def _identity(storage: Any, spath: str) -> tuple[int, int] | None:
    """Which directory ``spath`` is now (an overwrite swaps in another one); None off POSIX."""
    if not isinstance(storage, LocalStorage):
        return None
    try:
        st = os.stat(spath)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def read_placement(reader: ChunkReader, placement: Placement) -> None:
    """Reads (and verifies) every target of ``placement`` into its destination.

    Each target's destination is decided once, here: whole tensors stored as one raw
    chunk whose target is contiguous host memory are read by table row and address
    (``ChunkReader.whole_tasks``); other host-contiguous targets through ``ReadJob``s
    into their own bytes; the rest (device, strided, ``cast``) are staged
    (``placers.staged``). The reads of the first two kinds run together on the I/O pool,
    then the staged waves.
    """
    jobs: list[ReadJob] = []
    staged: list[StagedTarget] = []
    direct = placement.new or Allocated()
    table = reader.index.table
    assert table is not None, "a decoded index has its chunk table as columns"
    whole = whole_raw(table).tolist()
    starts = table.tensor_start.tolist()
    for tt in placement.targets:
        if tt.dest is None and tt.offsets is None and tt.tid >= 0 and whole[tt.tid] and not tt.cast:
            addr = _address(tt.target)
            if addr is not None:
                direct.tensors.append(tt.tid)
                direct.rows.append(starts[tt.tid])
                direct.addrs.append(addr)
                continue
        e = reader.index.tensors[tt.tid] if tt.tid >= 0 else tt.entry
        assert e is not None, "a target names its tensor by entry or by id"
        if tt.dest is not None:  # a new tensor: its bytes are known, and it is the whole
            jobs.append(ReadJob(e, tt.dest, (0,) * len(e.shape), e.shape, fresh=True))
            continue
        target, offsets, shape = _region(tt)
        dest = None if tt.cast else values.writable_bytes(target)
        if dest is not None:
            jobs.append(ReadJob(e, dest, offsets, shape))
        else:
            staged.append(StagedTarget(e, target, offsets, shape))
    tasks = reader.tasks(jobs)
    if direct.rows:
        tasks += reader.whole_tasks(np.asarray(direct.rows, dtype=np.int64), direct.addrs,
                                    np.asarray(direct.tensors, dtype=np.int64), fresh=placement.new is not None)
    reader.run_tasks(tasks)
    if staged:
        place_staged(reader, staged)


def _region(tt: TensorTarget) -> tuple[Any, tuple[int, ...], tuple[int, ...]]:
    """``(tensor, offsets, shape)``: what a target is read into, and where it lies in the
    stored tensor (a DTensor: its local shard)."""
    if tt.offsets is None:
        return values.target_region(tt.target)
    return tt.target, tt.offsets, values.shape_of(tt.target)


def _address(x: Any) -> int | None:
    """The address of a plain host tensor's memory when a load may write it directly
    (contiguous, on the CPU, no conj/neg bit, numpy: writeable); else None."""
    if type(x) in torch_values.PLAIN_TENSOR_TYPES:
        if x.is_cpu and x.is_contiguous() and not x.is_conj() and not x.is_neg():
            return x.data_ptr()
        return None
    if type(x) is np.ndarray and x.flags.c_contiguous and x.flags.writeable:
        return x.ctypes.data
    return None


__all__ = ["ATTEMPTS", "read_placement", "run"]
