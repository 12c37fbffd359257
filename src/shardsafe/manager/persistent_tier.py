"""The persistent tier: the manager's directory of ``step_<N>`` checkpoints.

What the manager does for this tier after each save (the ``TierHooks`` of its
``TierWriter``): once the step is committed, rank 0 applies the retention policy
(``retention``: un-commit what it drops, then one sweep that keeps every file a kept
step, or the save in flight, references) and the other ranks wait until it has,
through ``comm.agreement`` (the store, never the training process group: this runs on
a background thread), bounded by the manager's timeout.

With ``incremental`` the tier keeps the ``engine.save.incremental.Baseline`` of its last
committed save: the next save references the chunks unchanged since then, and sweeps
keep the baseline's files (``pinned``).
"""

from __future__ import annotations

import logging

from ..comm.agreement import Agreement
from ..engine.save.handle import summary
from ..engine.save.incremental import Baseline
from ..errors import CheckpointError
from .records import StepRecords
from .retention import PreservationPolicy, steps_to_delete
from .steps import StepDirectory, step_name
from .tier_writer import SaveJob

log = logging.getLogger("shardsafe")


class PersistentTier:
    """Retention and the incremental baseline of the persistent directory.

    Args:
        steps: The directory.
        url: Its URL as the user gave it (messages).
        records: What is known about its steps (for the policy).
        policy: The retention policy.
        agreement: How the ranks wait for rank 0's retention.
        incremental: Keep a baseline for incremental saves.
    """

    def __init__(self, steps: StepDirectory, url: str, records: StepRecords, policy: PreservationPolicy,
                 agreement: Agreement, *, incremental: bool) -> None:
        self.steps, self.url, self.records, self.policy = steps, url, records, policy
        self.agreement = agreement
        self.baseline = Baseline() if incremental else None

    def path(self, step: int) -> str:
        """The URL of ``step``'s checkpoint."""
        return self.steps.storage.join(self.url, step_name(step))

    def describe(self, step: int) -> str:
        return f"saving step {step} to {self.path(step)!r}"

    def after_save(self, step: int, error: CheckpointError | None, seq: int, job: SaveJob | None) -> None:
        """Rank 0 applies retention once ``step`` is committed; every rank returns once it has."""
        if error is not None:
            return
        if job is not None:
            log.info("committed step %d in %s: %s", step, self.url, summary(job.nbytes, job.timings))
        else:
            log.info("committed step %d in %s", step, self.url)
        try:
            self.agreement.leader_acts_in_background(
                f"manager/{self.url}/{seq}", self.retain, what=f"retention after step {step}",
                errors=(OSError, CheckpointError, ValueError))
        except (OSError, CheckpointError, ValueError) as e:
            raise CheckpointError(f"step {step} was saved, but retention failed: {e}") from e

    def retain(self) -> None:
        """Rank 0: un-commits the steps the retention policy drops, then sweeps their data."""
        committed = self.steps.committed()
        dropped = {s: committed[s] for s in steps_to_delete(self.records.of(committed), self.policy)}
        self.steps.drop(dropped, self.pinned())
        for s in dropped:
            self.records.forget(s)
            log.info("retention deleted step %d in %s", s, self.url)

    # ------------------------------------------------------------------ incremental
    def keep_baseline_only_if(self, committed: list[str]) -> None:
        """Forgets the baseline unless its step is among ``committed`` (step directory
        names): after a delete, rollback or set-aside the next save writes everything."""
        if self.baseline is not None and self.baseline.keep_only_if(committed):
            log.info("the incremental baseline's step left %s; the next save writes everything", self.url)

    def pinned(self) -> set[str]:
        """Files a save in flight may reference (``<step dir>/<file>``): the baseline's files
        hold every chunk the current or next save can reference; sweeps keep them."""
        return self.baseline.files() if self.baseline is not None else set()


__all__ = ["PersistentTier"]
