"""One step's save to every tier it is due on: the seam between the manager and the engine.

``TierSaver.save`` starts the saves of one step and hands each tier's save to the
tier's ``TierWriter``. It returns once the state is captured (``async_save``: copied
into the Checkpointer's reusable staging buffers) or, without ``async_save``, once
every due tier has committed and applied retention.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.checkpointer import Checkpointer
from ..engine.copies import Copy
from ..engine.handle import SaveHandle
from ..errors import CheckpointError
from .local_tier import LocalTier
from .options import ManagerOptions
from .persistent_tier import PersistentTier
from .steps import manager_metadata
from .tier_writer import TierWriter


class _Done:
    """A save that completed before ``save`` returned."""

    def result(self, timeout: float | None = None) -> None:
        return None


class TierSaver:
    """Starts the saves of a manager's steps (one at a time), reusing the staging buffers.

    A step due on both tiers is one engine save of the persistent checkpoint carrying the
    local checkpoint as a copy (``engine.copies``): the state leaves training memory once
    and both are written from the same staged bytes, within the same budget. A step due
    on the local tier alone is an ordinary save of this rank's view of the state. It does
    not wait for a persistent save still writing (slow storage must not hold up the
    local tier): without a budget it then stages into a second Checkpointer's buffers
    (made on first need, kept: two copies of the state while both are busy); with a
    budget it waits, since the budget bounds all staging memory together.

    Args:
        opts: The manager's options (async saves, budget, compression, timeout).
    """

    def __init__(self, opts: ManagerOptions) -> None:
        self.opts = opts
        self._ckpt = Checkpointer(max_staging_bytes=opts.max_staging_bytes, compression=opts.compression)
        self._spare: Checkpointer | None = None  # local-only steps while the persistent save writes

    def save(self, step: int, state: Mapping[str, Any], *, metrics: Mapping[str, Any] | None,
             persistent: PersistentTier | None, local: LocalTier | None,
             writers: Sequence[TierWriter], seq: int) -> None:
        """Starts the save of ``step`` on each given tier (``writers``: persistent, local).

        Raises (before anything is written): TypeError for an unsaveable value, ValueError
        for metadata that is not JSON, CheckpointError when the step must not be written;
        without ``async_save`` also the persistent save's own failure. The local tier's
        writer is started whatever happens (its peers expect this round).
        """
        copy = Copy(*local.target(step, state)) if local is not None else None
        local_job: SaveHandle | _Done | BaseException = CheckpointError("the save did not start")
        try:
            if persistent is not None:
                self._persistent(step, state, metrics, persistent, writers[0], seq, copy)
            elif copy is not None:
                self._local_only(copy, writers[0])
        except BaseException as e:
            local_job = e
            raise
        finally:
            if copy is not None:
                writers[1].start(step, copy.handle if copy.handle is not None else local_job, seq)

    def _local_only(self, copy: Copy, persistent: TierWriter) -> None:
        ckpt = self._ckpt
        if persistent.step is not None and self.opts.max_staging_bytes is None:
            if self._spare is None:
                self._spare = Checkpointer(compression=self.opts.compression)
            ckpt = self._spare  # the persistent save is still writing: do not wait for it
        else:
            persistent.wait()  # its outcome is collected before its Checkpointer is reused
        kw: dict[str, Any] = dict(overwrite=True, collective=False, metadata=copy.metadata)
        try:
            if self.opts.async_save:
                copy.handle = ckpt.async_save(copy.state, copy.path, **kw)
            else:
                ckpt.save(copy.state, copy.path, **kw)
                copy.handle = _done(copy.path)
        except (OSError, CheckpointError) as e:
            copy.handle = _done(copy.path, e)

    def _persistent(self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any] | None,
                    tier: PersistentTier, writer: TierWriter, seq: int, copy: Copy | None) -> None:
        opts, url = self.opts, tier.path(step)
        kw: dict[str, Any] = dict(metadata=manager_metadata(step, time.time(), metrics), timeout=opts.timeout,
                                  storage_options=dict(opts.storage_options) if opts.storage_options else None,
                                  baseline=tier.baseline, copies=[copy] if copy is not None else [])
        job: SaveHandle | _Done | BaseException
        if opts.async_save:
            try:
                job = self._ckpt.async_save(state, url, **kw)
            except CheckpointError:
                raise
            except OSError as e:
                raise CheckpointError(f"saving step {step} to {url!r} failed: {e}") from e
        else:
            try:
                self._ckpt.save(state, url, **kw)
                job = _Done()
            except (OSError, CheckpointError) as e:
                job = e
        writer.start(step, job, seq)

    def close(self) -> None:
        """Frees the staging buffers (the saves were collected by the writers)."""
        self._ckpt.close()
        if self._spare is not None:
            self._spare.close()


def _done(path: str, error: BaseException | None = None) -> SaveHandle:
    """A handle of a save that already ended (with ``error``, or committed)."""
    h = SaveHandle(path)
    h.settle(error)
    return h


__all__ = ["TierSaver"]
