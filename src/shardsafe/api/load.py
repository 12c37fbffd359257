"""Load a checkpoint: into a live state in place, or as a new nested dict."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from ..engine.commit.diagnose import read_index_explained
from ..engine.load.request import LoadRequest, LoadResult
from ..engine.load.run import run
from ..format.index.objects import Index
from ..plan.flatten import Stateful
from ..storage import storage_for


def load(path: str, state: MutableMapping[str, Any] | Stateful | None = None, *, strict: bool = True,
         storage_options: dict | None = None, mmap: bool = False, process_group: Any = None,
         collective: bool | None = None, timeout: float | None = None, cast: bool = False) -> Any:
    """Loads the checkpoint at ``path``.

    With ``state``: restores in place. Tensors are copied into the existing tensors (same
    objects, same memory), containers are updated, Stateful objects receive
    ``load_state_dict``. Returns a LoadResult listing what was skipped (``strict=False``).
    A tensor whose dtype differs from the stored one is refused (``StateMismatchError``;
    skipped with ``strict=False``), unless ``cast=True`` and both are floating point
    (float64, float32, float16, bfloat16, float8): then the stored values are converted
    to the target's dtype, as ``torch.nn.Module.load_state_dict`` does (a matching dtype
    is still copied bit for bit). Integers, booleans and complex numbers are never
    converted, nor one kind into another.
    ``state`` may also be a single Stateful object (a module, an optimizer,
    ``ModelOptimizerState``, ...), for a checkpoint saved from one: it is loaded as if
    it stood inside a mapping (into its ``state_dict()``, then ``load_state_dict``), and
    the result is a LoadResult too.
    Without ``state``: returns a new nested dict (torch tensors on the CPU, numpy arrays
    for arrays saved from numpy; from 2 MiB on, each in a page-aligned mapping of its
    own that cold reads fill directly; like ``torch.load``'s, such a tensor's storage
    cannot be resized). With ``mmap=True`` (local checkpoints, no ``state``) the tensors
    are copy-on-write views of the memory-mapped data files, every checksum verified up
    front (writing to one changes only this process's copy).

    Under torch.distributed (more than one rank), or in a multi-process ``jax.distributed``
    job, the load is collective by default, like ``save``: every rank of ``process_group``
    (default: the world, or every process of the JAX job) must call it.
    Rank 0 reads and validates the index once and broadcasts it; then each rank reads
    only the byte ranges its own tensors need (a DTensor target: its local shard), so
    a checkpoint saved by N ranks loads onto any other number and sharding. Pass
    ``collective=False`` to load on one rank alone. ``timeout`` (default
    ``SHARDSAFE_TIMEOUT``) bounds the wait for the other ranks: a rank that never calls
    ``load`` turns into ``CheckpointTimeoutError`` naming it. On an object store it is
    also the load's deadline, counted from the call (``CheckpointTimeoutError`` naming the
    rank, the file and the request abandoned).

    Raises:
        CheckpointNotFoundError: No committed checkpoint at ``path``; the message says what
            the path is instead (missing, a torch.save file, a DCP checkpoint, a directory of
            checkpoints, an unfinished save, ...).
        CorruptCheckpointError: A checksum fails or a file is truncated/malformed.
        StateMismatchError: ``strict`` and the target's keys, shapes or dtypes differ.
    """
    return run(LoadRequest(path=path, state=state, strict=strict, storage_options=storage_options, mmap=mmap,
                           process_group=process_group, collective=collective, timeout=timeout, cast=cast))


def read_checkpoint_index(path: str, storage_options: dict | None = None) -> Index:
    """The validated index of a committed checkpoint (for tools such as the CLI).

    Raises:
        CheckpointNotFoundError: No committed checkpoint at ``path`` (the message says
            what the path is instead).
        CorruptCheckpointError: The index is damaged or a data file is truncated.
    """
    storage, spath = storage_for(path, storage_options)
    return read_index_explained(storage, spath, path)


__all__ = ["LoadResult", "load", "read_checkpoint_index"]
