"""A load from its path to its result: the index (read once, or collectively), then a new
state, a memory-mapped one, or the reads into a live state.

A checkpoint overwritten while it is being loaded (the directory is swapped atomically)
is loaded again, from the new index; one deleted meanwhile (retention) is reported as
not found rather than damaged.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ...comm import distributed_active, get_comm
from ..._numbers import transfer
from ...errors import CheckpointNotFoundError, CorruptCheckpointError, StateMismatchError
from ...format.dtypes import lookup
from ...format.index.objects import Index
from ...per_rank import loading
from ...plan.flatten import Stateful
from ...plan.regroup import regroup
from ...storage import Deadline, LocalStorage, storage_for
from ..buffers import allocating
from ..commit import is_committed
from ..commit.diagnose import not_found
from . import jax_restore, new_state
from .index_exchange import IndexRead, read_index_alone, read_index_collective
from .mapped import load_mapped
from .match import TensorTarget, match
from .reader import ChunkReader
from .targets import read_targets, target_regions

log = logging.getLogger("shardsafe")

ATTEMPTS = 10  # an overwrite swaps the directory mid-load: read the new checkpoint instead (a
# writer that overwrites as fast as the loads run can overtake a few in a row on a busy machine)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What an in-place ``load(path, state, strict=False)`` skipped (all empty when strict)."""

    missing: list[str] = field(default_factory=list)
    """Key paths of ``state`` that the checkpoint does not hold (left unchanged)."""
    unexpected: list[str] = field(default_factory=list)
    """Key paths in the checkpoint that ``state`` has no place for (not loaded)."""
    mismatched: list[str] = field(default_factory=list)
    """Key paths whose shape, dtype or type differs between checkpoint and ``state`` (not loaded)."""
    problems: list[str] = field(default_factory=list)
    """One line per key path skipped, saying why (as ``StateMismatchError.problems``)."""


def load_path(path: str, state: MutableMapping[str, Any] | Stateful | None,
              check: Callable[[Index], None] | None, *, strict: bool, storage_options: dict | None,
              mmap: bool, process_group: Any, collective: bool | None,
              timeout: float | None, cast: bool = False) -> Any:
    """The new state (``state`` None), or the ``LoadResult`` of an in-place load (see
    ``shardsafe.load``); ``check(index)`` may refuse the checkpoint before any read."""
    t0 = time.perf_counter()
    storage, spath = storage_for(path, storage_options, deadline=Deadline.for_call(
        timeout, get_comm(process_group).rank, f"load of {path}"))
    whole = state is None or mmap  # else a version 4 index is read in parts (what the targets need)
    if collective is not False and distributed_active(process_group):
        try:
            read = read_index_collective(storage, spath, get_comm(process_group), timeout, whole)
        except CheckpointNotFoundError:
            raise not_found(storage, spath, path) from None
        if check is not None:
            check(read.index)
        return _logged(path, t0, *_load_from(storage, spath, read, path, state, strict, mmap, cast))
    for attempt in range(ATTEMPTS):
        before = _identity(storage, spath)
        read = None
        try:
            read = read_index_alone(storage, spath, whole)
            if check is not None:
                check(read.index)
            return _logged(path, t0, *_load_from(storage, spath, read, path, state, strict, mmap, cast))
        except (CorruptCheckpointError, CheckpointNotFoundError):
            if not is_committed(storage, spath):
                if read is None:  # never found an index: say what the path is instead
                    raise not_found(storage, spath, path) from None
                raise CheckpointNotFoundError(f"the checkpoint at {path!r} was deleted while being "
                                              f"loaded (by retention, or another process?)") from None
            if before is None or _identity(storage, spath) == before or attempt == ATTEMPTS - 1:
                raise
            log.info("%s was replaced (overwrite) while being loaded; loading the new one", path)
    raise AssertionError("unreachable")


def _identity(storage: Any, spath: str) -> tuple[int, int] | None:
    """Which directory ``spath`` is now (an overwrite swaps in another one); None off POSIX."""
    if not isinstance(storage, LocalStorage):
        return None
    try:
        st = os.stat(spath)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _logged(path: str, t0: float, value: Any, nbytes: int) -> Any:
    log.info("loaded %s: %s", path, transfer(nbytes, time.perf_counter() - t0))
    return value


def _tensor_bytes(index: Index) -> int:
    return sum(math.prod(t.shape) * lookup(t.dtype).itemsize for t in index.tensors)


def _region_bytes(index: Index, regions: list[tuple[int, tuple[int, ...], tuple[int, ...]]]) -> int:
    """Bytes of the stored tensors' regions a load reads."""
    assert index.infos is not None, "a decoded index has its tensor table as columns"
    return sum(math.prod(shape) * lookup(index.infos[tid].dtype).itemsize for tid, _, shape in regions)


def _total(index: Index, path: str) -> str:
    return f"{path!r} ({_tensor_bytes(index)} bytes of tensors)"


def _load_from(storage: Any, spath: str, read: IndexRead, path: str,
               state: MutableMapping[str, Any] | Stateful | None, strict: bool, mmap: bool,
               cast: bool) -> tuple[Any, int]:
    """What the load returns, and the bytes of tensor data it read."""
    index = read.index
    if mmap:
        if state is not None or not isinstance(storage, LocalStorage):
            raise ValueError("mmap=True applies to load(path) of a local checkpoint, without a state")
        return load_mapped(spath, index), _tensor_bytes(index)
    jax_target = state is not None and jax_restore.holds_jax(state)
    if cast and (state is None or jax_target):
        raise ValueError("cast=True converts into the dtypes of a torch or numpy target state: "
                         + ("a JAX target is restored in the stored dtypes" if jax_target
                            else "load(path) without a state returns the stored dtypes"))
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
        return value, _tensor_bytes(index)
    with loading():  # PerRank values describe only this rank's entry
        m = match(index, state, cast)
    problems = m.problems()
    if problems and strict:
        raise StateMismatchError(problems)
    if problems:
        log.warning("load(%s, strict=False) skipped %d key path(s):\n  %s", path, len(problems),
                    "\n  ".join(problems))
    regions = target_regions(m.reads, index)
    reader = ChunkReader(storage, spath, read.narrow(regions))
    with allocating(lambda: _total(index, path)):  # temporaries for device / strided targets
        read_targets(reader, m.reads)
    m.apply()
    return LoadResult(m.missing, m.unexpected, m.mismatched, problems), _region_bytes(index, regions)


def _saved_from_jax(index: Index) -> bool:
    return any(t.kind == "jax" for t in (index.infos if index.infos is not None else index.tensors))


def _restore_jax(read: IndexRead, index: Index, path: str, target: Any, strict: bool) -> tuple[Any, int]:
    """``load`` into a JAX target (``engine.load.jax_restore``): the restored pytree, and
    the bytes read."""
    with allocating(lambda: _total(index, path)):
        r = jax_restore.plan(index, target)
        if r.problems and strict:
            raise StateMismatchError(r.problems)
        if r.problems:
            log.warning("load(%s, strict=False) skipped %d key path(s):\n  %s", path, len(r.problems),
                        "\n  ".join(r.problems))
        targets = [TensorTarget(None, b.host, offsets=b.offsets, tid=b.tid) for b in r.reads]
        regions = target_regions(targets, index)
        reader = ChunkReader(read.storage, read.spath, read.narrow(regions))
        read_targets(reader, targets)
    return r.finish(), _region_bytes(index, regions)


__all__ = ["ATTEMPTS", "LoadResult", "load_path"]
