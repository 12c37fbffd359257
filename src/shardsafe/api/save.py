"""Synchronous save: flatten, plan, stream through bounce buffers, write, commit.

The phases live in ``engine.pipeline``; this module is the public entry point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..engine.pipeline import BLOCK_SIZE, PreparedSave, build_index, prepare
from .async_save import default_checkpointer


def save(state: Mapping[str, Any], path: str, *, overwrite: bool = False,
         metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None) -> None:
    """Saves ``state`` to ``path`` and returns once the checkpoint is committed and durable.

    Waits first for an ``async_save`` still in flight (raising its error if it failed and
    nobody collected it). Needs no full copy of the state: each 16 MiB unit of the data
    file passes through one of a few aligned bounce buffers on its way to disk.

    Args:
        state: A mapping of tensors, arrays, containers, plain values and Stateful objects.
        path: Checkpoint directory (or fsspec URL).
        overwrite: Replace an existing committed checkpoint (atomically where possible).
        metadata: JSON-serialisable user metadata stored in the index.
        storage_options: Passed to fsspec for URLs.

    Raises:
        TypeError: A value cannot be saved safely (the message names its key path).
        CheckpointError: The path holds something that must not be overwritten.
    """
    default_checkpointer().save(state, path, overwrite=overwrite, metadata=metadata,
                                storage_options=storage_options)


__all__ = ["save", "prepare", "build_index", "PreparedSave", "BLOCK_SIZE"]
