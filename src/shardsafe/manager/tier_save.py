"""One step's save to every tier it is due on: the seam between the manager and the engine.

``TierSaver.save`` starts the saves of one step and hands each tier's save to the
tier's ``TierWriter``. It returns once the state is captured (``async_save``: copied
into the engine's reusable staging buffers) or, without ``async_save``, once
every due tier has committed and applied retention.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.save.handle import SaveHandle, settled_handle
from ..engine.save.options import SaveOptions
from ..engine.save.request import Replica, SaveRequest
from ..engine.save.saver import Saver
from ..errors import CheckpointError
from .local_tier import LocalTier
from .options import ManagerOptions
from .persistent_tier import PersistentTier
from .steps import manager_metadata
from .tier_writer import TierWriter


class TierSaver:
    """Starts the saves of a manager's steps (one at a time), reusing the staging buffers.

    A step due on both tiers is one engine save of the persistent checkpoint carrying the
    local checkpoint as a replica (``engine.save.replica``): the state leaves training memory once
    and both are written from the same staged bytes, within the same budget. A step due
    on the local tier alone is an ordinary save of this rank's view of the state. It does
    not wait for a persistent save still writing (slow storage must not hold up the
    local tier): without a budget it then stages into a second engine's buffers
    (made on first need, kept: two copies of the state while both are busy); with a
    budget it waits, since the budget bounds all staging memory together.

    Args:
        opts: The manager's options (async saves, budget, compression, timeout).
    """

    def __init__(self, opts: ManagerOptions) -> None:
        self.opts = opts
        self._saver = Saver(SaveOptions(max_staging_bytes=opts.max_staging_bytes, compression=opts.compression))
        self._spare: Saver | None = None  # local-only steps while the persistent save writes

    def save(self, step: int, state: Mapping[str, Any], *, metrics: Mapping[str, Any] | None,
             persistent: PersistentTier | None, local: LocalTier | None,
             writers: Sequence[TierWriter], seq: int) -> None:
        """Starts the save of ``step`` on each given tier (``writers``: persistent, local).

        Raises (before anything is written): TypeError for an unsaveable value, ValueError
        for metadata that is not JSON, CheckpointError when the step must not be written;
        without ``async_save`` also the persistent save's own failure. The local tier's
        writer is started whatever happens (its peers expect this round).
        """
        replica = Replica(*local.target(step, state)) if local is not None else None
        local_job: SaveHandle | BaseException = CheckpointError("the save did not start")
        started = False
        try:
            if persistent is not None:
                self._persistent(step, state, metrics, persistent, writers[0], seq, replica)
            elif replica is not None:
                local_job = self._local_only(replica, writers[0])
            started = True
        except BaseException as e:
            local_job = e
            raise
        finally:
            if replica is not None:
                if started and persistent is not None:
                    local_job = replica.progress.handle
                writers[1].start(step, local_job, seq)

    def _local_only(self, replica: Replica, persistent: TierWriter) -> SaveHandle:
        saver = self._saver
        if persistent.step is not None and self.opts.max_staging_bytes is None:
            if self._spare is None:
                self._spare = Saver(SaveOptions(compression=self.opts.compression))
            saver = self._spare  # the persistent save is still writing: do not wait for it
        else:
            persistent.wait()  # its outcome is collected before its engine is reused
        req = SaveRequest(state=replica.state, path=replica.path, overwrite=True, collective=False,
                          metadata=replica.metadata, staging="blocking" if self.opts.async_save else None)
        try:
            return saver.submit(req).handle
        except (OSError, CheckpointError) as e:
            return settled_handle(replica.path, e)

    def _persistent(self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any] | None,
                    tier: PersistentTier, writer: TierWriter, seq: int, replica: Replica | None) -> None:
        opts, url = self.opts, tier.path(step)
        req = SaveRequest(state=state, path=url, metadata=manager_metadata(step, time.time(), metrics),
                          timeout=opts.timeout,
                          storage_options=dict(opts.storage_options) if opts.storage_options else None,
                          baseline=tier.baseline, replicas=(replica,) if replica is not None else (),
                          staging="blocking" if opts.async_save else None)
        job: SaveHandle | BaseException
        if opts.async_save:
            try:
                job = self._saver.submit(req).handle
            except CheckpointError:
                raise
            except OSError as e:
                raise CheckpointError(f"saving step {step} to {url!r} failed: {e}") from e
        else:
            try:
                job = self._saver.submit(req).handle  # settled: committed already
            except (OSError, CheckpointError) as e:
                job = e
        writer.start(step, job, seq)

    def close(self) -> None:
        """Frees the staging buffers (the saves were collected by the writers)."""
        self._saver.close()
        if self._spare is not None:
            self._spare.close()


__all__ = ["TierSaver"]
