"""Synchronous save: the public entry point; the save itself is ``engine.save``'s run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..format.codec import Compression
from ..plan.flatten import Stateful
from .async_save import default_checkpointer


def save(state: Mapping[str, Any] | Stateful, path: str, *, overwrite: bool = False,
         metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
         process_group: Any = None, timeout: float | None = None,
         collective: bool | None = None, compression: Compression | None = None) -> None:
    """Saves ``state`` to ``path`` and returns once the checkpoint is committed and durable.

    Waits first for an ``async_save`` still in flight (raising its error if it failed and
    nobody collected it). Needs no full copy of the state: each unit of the data file is
    copied into one of a few aligned bounce buffers, checksummed and written with direct
    I/O while the next units are copied.

    Args:
        state: A mapping of tensors, arrays, containers, plain values and Stateful objects,
            or a single Stateful object (a module, an optimizer, ``ModelOptimizerState``,
            ...), saved as its state dict: the checkpoint's root holds its keys.
        path: Checkpoint directory (or fsspec URL).
        overwrite: Replace an existing committed checkpoint (atomically where possible).
        metadata: JSON-serialisable user metadata stored in the index.
        storage_options: Passed to fsspec for URLs.
        process_group: When torch.distributed is initialised the save is collective
            over the default group, or over this group: every rank must call it. Each
            rank writes its own data file; rank 0 commits once all are durable. In a
            multi-process ``jax.distributed`` job (without torch.distributed) it is
            collective over the job's processes, coordinated through JAX's coordination
            service; each process writes the shards it addresses with ``replica_id`` 0.
        timeout: Seconds a rank of a collective save waits for the others before it
            raises CheckpointTimeoutError (default: ``SHARDSAFE_TIMEOUT`` or 600); on an
            object store also the save's deadline, counted from the call: a request
            still running then is abandoned and the save raises CheckpointTimeoutError
            naming the rank, the file and the request, on every rank.
        collective: ``False``: this rank alone writes a complete checkpoint of its own
            state, with no communication at all, even when torch.distributed is
            initialised (for frameworks that save from rank 0 only; the other ranks do
            not call ``save``). Its index says world size 1, so it loads in a plain
            process or, with ``load(..., collective=False)``, on any rank. A DTensor whose
            mesh spans several ranks is refused (``TypeError``): save it collectively.
        compression: None (default) stores raw bytes; ``"zstd"`` compresses every tensor
            of at least 64 KiB with zstd; ``"auto"`` is float-aware (bf16/fp16/fp32 bytes
            split into planes, docs/FORMAT.md section 12). Each 16 MiB block is coded on its
            own, in parallel; blocks that would not shrink stay raw. Compressed tensors go
            to a block file (``data-r<rank>-000.blocks``, docs/FORMAT.md section 12)
            instead of the safetensors file. Needs the ``zstandard`` package (extra
            ``zstd``). Ranks of a collective save may choose differently.

    Raises:
        TypeError: A value cannot be saved safely (the message names its key path).
        ValueError: ``compression`` is not one of None, ``"zstd"``, ``"auto"``.
        CheckpointError: The path holds something that must not be overwritten, or
            another rank of a collective save failed (nothing is committed then).
        CheckpointTimeoutError: Another rank did not answer within ``timeout``, or the
            save passed its deadline.
        StorageRequestError: An object-store request failed on every attempt.
    """
    default_checkpointer().save(state, path, overwrite=overwrite, metadata=metadata, storage_options=storage_options,
                                process_group=process_group, timeout=timeout, collective=collective,
                                compression=compression)


__all__ = ["save"]
