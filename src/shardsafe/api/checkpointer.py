"""``Checkpointer``: a reusable saver that keeps its staging buffers and runs one save at a time.

The public face of the engine's ``Saver`` (``engine.save.saver``): its options are
validated once, when it is built (``engine.save.options``); each call describes its save
as a ``SaveRequest`` and submits it.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from ..comm import Comm
from ..engine.load.request import LoadRequest
from ..engine.load.run import run as run_load
from ..engine.save.handle import SaveHandle
from ..engine.save.options import SaveOptions
from ..engine.save.request import SaveRequest, StagingMode
from ..engine.save.saver import Saver
from ..engine.save.units import UNIT_SIZE
from ..format.codec import Compression
from ..plan.flatten import Stateful


class Checkpointer:
    """Saves training states, synchronously or in the background, reusing its buffers.

    Sync saves need no copy of the state: each unit is copied into one of a few aligned
    bounce buffers, checksummed and written with direct I/O while the next units are
    copied. Async saves stage the state into buffers the Checkpointer keeps for the next
    save (one slab, pre-faulted), then checksum, write and commit on a background thread;
    under ``max_staging_bytes`` they stream through that many bytes of unit buffers instead.

    Args:
        comm: The group of ranks taking part in each save (default: this process alone).
        unit_size: Bytes per staging/write unit (a multiple of 4096).
        pin_memory: Page-lock staging buffers for CUDA copies (default: when CUDA is present).
        overlap_writes: With ``staging="blocking"``, start writing units while later units
            are still being copied (shorter time to durable, but the writes compete with
            the caller's copy for CPU and memory bandwidth, lengthening the stall).
        max_staging_bytes: Host memory an async save may stage into (None: a copy of the
            whole state, kept for the next save). A smaller state is staged as usual; a
            larger one streams through ``max_staging_bytes // unit_size`` unit buffers,
            and ``async_save`` blocks until the rest of the state fits (at least one
            unit). Sync saves bounce through the same buffers. ``async_save`` may
            override it per call. Combines with ``compression`` (then ``unit_size`` must
            be a multiple of the 16 MiB checksum block, as by default, and the budget at
            least 56 MiB: a unit, a block being coded and the block file's write chunks).
        compression: The default ``compression`` of every save (see ``shardsafe.save``);
            a call may override it.

    Raises:
        ValueError: an invalid option or combination.

    Example::

        ckpt = shardsafe.Checkpointer()
        for step in range(steps):
            train_step()
            if step % 100 == 0:
                ckpt.async_save({"model": model, "optim": opt, "step": step}, f"ckpt/{step}")
        ckpt.close()  # waits for the last save; raises its error if it failed
    """

    def __init__(self, *, comm: Comm | None = None, unit_size: int = UNIT_SIZE,
                 pin_memory: bool | None = None, overlap_writes: bool = False,
                 max_staging_bytes: int | None = None, compression: Compression | None = None) -> None:
        self._saver = Saver(SaveOptions(unit_size=unit_size, pin_memory=pin_memory, overlap_writes=overlap_writes,
                                        max_staging_bytes=max_staging_bytes, compression=compression), comm)

    def save(self, state: Mapping[str, Any] | Stateful, path: str, *, overwrite: bool = False,
             metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
             process_group: Any = None, timeout: float | None = None,
             collective: bool | None = None, compression: Compression | None = None) -> None:
        """Saves ``state`` and returns once the checkpoint is committed and durable.

        Waits for an async save still in flight first (and raises its error if it failed
        and nobody collected it). Arguments as for ``shardsafe.save``; ``compression``
        defaults to the Checkpointer's.
        """
        self._saver.submit(SaveRequest(state=state, path=path, overwrite=overwrite, metadata=metadata,
                                       storage_options=storage_options, process_group=process_group,
                                       timeout=timeout, collective=collective, compression=compression))

    def async_save(self, state: Mapping[str, Any] | Stateful, path: str, *,
                   staging: StagingMode = "blocking", overwrite: bool = False,
                   metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
                   process_group: Any = None, timeout: float | None = None, collective: bool | None = None,
                   compression: Compression | None = None, max_staging_bytes: int | None = None) -> SaveHandle:
        """Starts saving ``state``; checksums, writes and commit run in the background.

        Args:
            state: As for ``shardsafe.save``.
            path: Checkpoint directory (or fsspec URL).
            staging: ``"blocking"``: returns once the state is copied into host buffers;
                the caller may change its tensors immediately. ``"background"``: returns
                at once and copies in the background; call ``handle.wait_staged()``
                before changing any tensor of ``state`` (e.g. before ``optimizer.step()``).
            overwrite: Replace an existing committed checkpoint.
            metadata: JSON-serialisable user metadata.
            storage_options: Passed to fsspec for URLs.
            process_group: As for ``shardsafe.save``: the group of a collective save.
            timeout: As for ``shardsafe.save``: how long ranks wait for each other.
            collective: As for ``shardsafe.save``: ``False`` saves this rank's state alone.
            compression: As for ``shardsafe.save`` (default: the Checkpointer's).
                Compression runs in the background, after staging (under a budget, as
                units stream through): it does not lengthen the caller's stall.
            max_staging_bytes: Host staging memory of this save (default: the
                Checkpointer's). When the state is larger, units stream through that many
                bytes of buffers while they are written, and the call (or, with
                ``"background"``, ``wait_staged()``) returns once the last unit is staged.

        Returns:
            A SaveHandle; ``result()`` waits for the commit and re-raises any failure.

        Raises:
            TypeError: a value cannot be saved (raised here, before anything is written).
            CheckpointError: the previous async save failed and nobody collected the error,
                or the path must not be overwritten.
            ValueError: ``staging``, ``max_staging_bytes`` or ``compression`` is invalid.
            BaseException: with a budget, a write that failed while the call was staging.
        """
        return self._saver.submit(SaveRequest(
            state=state, path=path, overwrite=overwrite, metadata=metadata, storage_options=storage_options,
            process_group=process_group, timeout=timeout, collective=collective, compression=compression,
            staging=staging, max_staging_bytes=max_staging_bytes)).handle

    def load(self, path: str, state: MutableMapping[str, Any] | Stateful | None = None, *, strict: bool = True,
             storage_options: dict | None = None, mmap: bool = False, process_group: Any = None,
             collective: bool | None = None, timeout: float | None = None, cast: bool = False) -> Any:
        """Loads the checkpoint at ``path``, as ``shardsafe.load`` does, among the
        Checkpointer's ranks (its ``comm``; ``process_group`` overrides it), once its save
        in flight is committed: a checkpoint this Checkpointer just saved asynchronously
        loads as it was saved.

        Raises:
            CheckpointError: The save in flight failed and nobody collected its error (raised
                once, as the next save would raise it), or the load failed (see
                ``shardsafe.load``).
        """
        self._saver.settle()
        comm = self._saver.comm if process_group is None else None
        return run_load(LoadRequest(path=path, state=state, strict=strict, storage_options=storage_options,
                                    mmap=mmap, process_group=process_group, comm=comm, collective=collective,
                                    timeout=timeout, cast=cast))

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called (a closed Checkpointer refuses new saves)."""
        return self._saver.closed

    @property
    def retained_bytes(self) -> int:
        """Host memory kept between saves: staging buffers plus sync-save bounce buffers."""
        return self._saver.retained_bytes

    def wait(self, timeout: float | None = None) -> None:
        """Waits for the save in flight (if any) and raises its error if it failed."""
        self._saver.wait(timeout)

    def close(self) -> None:
        """Waits for the save in flight, frees the buffers, and raises an uncollected failure."""
        self._saver.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Checkpointer"]
