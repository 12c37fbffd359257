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

    Args:
        opts: The manager's options (async saves, budget, compression, timeout).
    """

    def __init__(self, opts: ManagerOptions) -> None:
        self.opts = opts
        self._ckpt = Checkpointer(max_staging_bytes=opts.max_staging_bytes)
        self._local_ckpt = Checkpointer(max_staging_bytes=opts.max_staging_bytes)

    def save(self, step: int, state: Mapping[str, Any], *, metrics: Mapping[str, Any] | None,
             persistent: PersistentTier | None, local: LocalTier | None,
             writers: Sequence[TierWriter], seq: int) -> None:
        """Starts the save of ``step`` on each given tier (``writers``: persistent, local).

        Raises (before anything is written): TypeError for an unsaveable value, ValueError
        for metadata that is not JSON, CheckpointError when the step must not be written;
        without ``async_save`` also the save's own failure.
        """
        if persistent is not None:
            self._persistent(step, state, metrics, persistent, writers[0], seq)
        if local is not None:
            view, path, md = local.target(step, state)
            job: SaveHandle | _Done | BaseException
            try:
                if self.opts.async_save:
                    job = self._local_ckpt.async_save(view, path, overwrite=True, collective=False, metadata=md)
                else:
                    self._local_ckpt.save(view, path, overwrite=True, collective=False, metadata=md)
                    job = _Done()
            except (OSError, CheckpointError) as e:
                job = e
            writers[1].start(step, job, seq)

    def _persistent(self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any] | None,
                    tier: PersistentTier, writer: TierWriter, seq: int) -> None:
        opts, url = self.opts, tier.path(step)
        kw: dict[str, Any] = dict(metadata=manager_metadata(step, time.time(), metrics), timeout=opts.timeout,
                                  storage_options=dict(opts.storage_options) if opts.storage_options else None,
                                  compression=opts.compression, baseline=tier.baseline)
        job: SaveHandle | _Done | BaseException
        if opts.async_save:
            try:
                job = self._ckpt.async_save(state, url, **kw)
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
        self._local_ckpt.close()


__all__ = ["TierSaver"]
