"""Load a checkpoint: into a live state in place, or as a new nested dict."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import dtensor, tensors
from .._collector import paused
from ..comm import distributed_active, get_comm
from ..engine.buffers import allocating
from ..engine.index_exchange import IndexRead, read_index_alone, read_index_collective
from ..engine.commit import is_committed, read_index
from ..engine.mmap_load import load_mapped
from ..engine.reader import ChunkReader, ReadJob
from ..errors import CheckpointNotFoundError, CorruptCheckpointError, StateMismatchError
from ..format.dtypes import lookup
from ..format.index.objects import Index
from ..jax import restore as jax_restore
from ..per_rank import loading
from ..plan.flatten import Stateful, is_stateful
from ..plan.regroup import regroup
from ..storage import Deadline, LocalStorage, storage_for
from . import new_state
from .match import TensorTarget, match
from .new_state import Allocated, whole_raw

log = logging.getLogger("shardsafe")


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What an in-place ``load(path, state, strict=False)`` skipped (all empty when strict)."""

    missing: list[str] = field(default_factory=list)
    """Key paths of ``state`` that the checkpoint does not hold (left unchanged)."""
    unexpected: list[str] = field(default_factory=list)
    """Key paths in the checkpoint that ``state`` has no place for (not loaded)."""
    mismatched: list[str] = field(default_factory=list)
    """Key paths whose shape or dtype differs between checkpoint and ``state`` (not loaded)."""


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
    whole = whole_raw(table).tolist() if table is not None else None
    starts = table.tensor_start.tolist() if table is not None else None
    for tt in targets:
        if tt.dest is None and tt.offsets is None and whole is not None and tt.tid >= 0 and whole[tt.tid]:
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
        dest = tensors.writable_bytes(target)
        if dest is not None:
            jobs.append(ReadJob(e, dest, offsets, shape))
            continue
        tmp, tmp_bytes = tensors.empty(e.kind, e.dtype, shape)  # device / strided target

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


def load(path: str, state: MutableMapping[str, Any] | Stateful | None = None, *, strict: bool = True,
         storage_options: dict | None = None, mmap: bool = False, process_group: Any = None,
         collective: bool | None = None, timeout: float | None = None) -> Any:
    """Loads the checkpoint at ``path``.

    With ``state``: restores in place. Tensors are copied into the existing tensors (same
    objects, same memory), containers are updated, Stateful objects receive
    ``load_state_dict``. Returns a LoadResult listing what was skipped (``strict=False``).
    ``state`` may also be a single Stateful object (a module, an optimizer,
    ``ModelOptimizerState``, ...), for a checkpoint saved from one: it is loaded as if
    it stood inside a mapping (into its ``state_dict()``, then ``load_state_dict``), and
    the result is a LoadResult too.
    Without ``state``: returns a new nested dict (torch tensors on the CPU, numpy arrays
    for arrays saved from numpy; from 2 MiB on, each in a page-aligned mapping of its
    own that cold reads fill directly, see ``engine.buffers.new_tensor``). With ``mmap=True`` (local checkpoints, no ``state``)
    the tensors are copy-on-write views of the memory-mapped data files, verified up
    front (see ``engine.mmap_load``).

    Under torch.distributed (more than one rank) the load is collective by default,
    like ``save``: every rank of ``process_group`` (default: the world) must call it.
    Rank 0 reads and validates the index once and broadcasts it; then each rank reads
    only the byte ranges its own tensors need (a DTensor target: its local shard), so
    a checkpoint saved by N ranks loads onto any other number and sharding. Pass
    ``collective=False`` to load on one rank alone. ``timeout`` (default
    ``SHARDSAFE_TIMEOUT``) bounds the wait for the other ranks: a rank that never calls
    ``load`` turns into ``CheckpointTimeoutError`` naming it. On an object store it is
    also the load's deadline, counted from the call (``CheckpointTimeoutError`` naming the
    rank, the file and the request abandoned).

    Raises:
        CheckpointNotFoundError: No committed checkpoint at ``path``.
        CorruptCheckpointError: A checksum fails or a file is truncated/malformed.
        StateMismatchError: ``strict`` and the target's keys, shapes or dtypes differ.
    """
    return load_checked(path, state, None, strict=strict, storage_options=storage_options, mmap=mmap,
                        process_group=process_group, collective=collective, timeout=timeout)


def load_checked(path: str, state: MutableMapping[str, Any] | Stateful | None,
                 check: Callable[[Index], None] | None, *, strict: bool = True,
                 storage_options: dict | None = None, mmap: bool = False, process_group: Any = None,
                 collective: bool | None = None, timeout: float | None = None) -> Any:
    """``load``, first calling ``check(index)`` with the validated index: it raises (a
    ``CheckpointError``) to refuse the checkpoint before anything is read. The manager
    checks that a step's index records the step and run it restores."""
    if state is not None and not isinstance(state, MutableMapping) and not is_stateful(state) \
            and not jax_restore.holds_jax(state):
        raise TypeError(f"state must be a mutable mapping (dict) or a Stateful object (with "
                        f"state_dict() and load_state_dict()) to load into, got {type(state).__name__}")
    with paused():  # building thousands of tensors and entries: no collection meanwhile
        return _load(path, state, check, strict, storage_options, mmap, process_group, collective, timeout)


def _load(path: str, state: MutableMapping[str, Any] | Stateful | None, check: Callable[[Index], None] | None,
          strict: bool, storage_options: dict | None, mmap: bool, process_group: Any,
          collective: bool | None, timeout: float | None) -> Any:
    storage, spath = storage_for(path, storage_options, deadline=Deadline.for_call(
        timeout, get_comm(process_group).rank, f"load of {path}"))
    whole = state is None or mmap  # else a version 4 index is read in parts (what the targets need)
    if collective is not False and distributed_active(process_group):
        read = read_index_collective(storage, spath, get_comm(process_group), timeout, whole)
        if check is not None:
            check(read.index)
        return _load_from(storage, spath, read, path, state, strict, mmap)
    for attempt in range(_ATTEMPTS):
        before = _identity(storage, spath)
        try:
            read = read_index_alone(storage, spath, whole)
            if check is not None:
                check(read.index)
            return _load_from(storage, spath, read, path, state, strict, mmap)
        except (CorruptCheckpointError, CheckpointNotFoundError) as e:
            if not is_committed(storage, spath):  # deleted (e.g. by retention) while we read it
                raise CheckpointNotFoundError(f"no committed checkpoint at {path!r} (deleted while "
                                              f"being loaded)") from e
            if before is None or _identity(storage, spath) == before or attempt == _ATTEMPTS - 1:
                raise
            log.info("%s was replaced (overwrite) while being loaded; loading the new one", path)
    raise AssertionError("unreachable")


_ATTEMPTS = 10  # an overwrite swaps the directory mid-load: read the new checkpoint instead (a
# writer that overwrites as fast as the loads run can overtake a few in a row on a busy machine)


def _identity(storage: Any, spath: str) -> tuple[int, int] | None:
    """Which directory ``spath`` is now (an overwrite swaps in another one); None off POSIX."""
    if not isinstance(storage, LocalStorage):
        return None
    try:
        st = os.stat(spath)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _total(index: Index, path: str) -> str:
    size = sum(math.prod(t.shape) * lookup(t.dtype).itemsize for t in index.tensors)
    return f"{path!r} ({size} bytes of tensors)"


def _load_from(storage: Any, spath: str, read: IndexRead, path: str,
               state: MutableMapping[str, Any] | Stateful | None,
               strict: bool, mmap: bool) -> Any:
    index = read.index
    if mmap:
        if state is not None or not isinstance(storage, LocalStorage):
            raise ValueError("mmap=True applies to load(path) of a local checkpoint, without a state")
        return load_mapped(spath, index)
    jax_target = state is not None and jax_restore.holds_jax(state)
    if jax_target or (state is not None and _saved_from_jax(index)):  # names nested one way, flat the other
        tree = regroup(index.tree, state)
        index = index if tree is index.tree else dataclasses.replace(index, tree=tree)
    if jax_target:
        return _restore_jax(read, index, path, state, strict)
    if state is None:
        reader = ChunkReader(storage, spath, index)
        with allocating(lambda: _total(index, path)):
            value, new = new_state.build(index)
        read_targets(reader, new.others, new)
        return value
    with loading():  # PerRank values describe only this rank's entry
        m = match(index, state)
    problems = m.problems()
    if problems and strict:
        raise StateMismatchError(problems)
    if problems:
        log.warning("load(%s, strict=False) skipped %d key path(s):\n  %s", path, len(problems),
                    "\n  ".join(problems))
    reader = ChunkReader(storage, spath, read.narrow(target_regions(m.reads, index)))
    with allocating(lambda: _total(index, path)):  # temporaries for device / strided targets
        read_targets(reader, m.reads)
    m.apply()
    return LoadResult(m.missing, m.unexpected, m.mismatched)


def _saved_from_jax(index: Index) -> bool:
    return any(t.kind == "jax" for t in (index.infos if index.infos is not None else index.tensors))


def _restore_jax(read: IndexRead, index: Index, path: str, target: Any, strict: bool) -> Any:
    """``load`` into a JAX target (``shardsafe.jax.restore``): returns the restored pytree."""
    with allocating(lambda: _total(index, path)):
        r = jax_restore.plan(index, target)
        if r.problems and strict:
            raise StateMismatchError(r.problems)
        if r.problems:
            log.warning("load(%s, strict=False) skipped %d key path(s):\n  %s", path, len(r.problems),
                        "\n  ".join(r.problems))
        targets = [TensorTarget(None, b.host, offsets=b.offsets, tid=b.tid) for b in r.reads]
        reader = ChunkReader(read.storage, read.spath, read.narrow(target_regions(targets, index)))
        read_targets(reader, targets)
    return r.finish()


def read_checkpoint_index(path: str, storage_options: dict | None = None) -> Index:
    """The validated index of a committed checkpoint (for tools such as the CLI)."""
    storage, spath = storage_for(path, storage_options)
    return read_index(storage, spath)


__all__ = ["LoadResult", "load", "load_checked", "read_checkpoint_index", "read_targets"]
