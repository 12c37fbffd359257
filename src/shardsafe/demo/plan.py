"""Where the demo interrupts its training run: a seeded crash point and a preemption point.

Pure: no processes, no torch. Both points lie in the middle half of a checkpoint
interval, so the interruption lands between checkpoints even when the training process
runs on for a few steps before the signal arrives; the preemption comes at least one
interval after the crash, and neither comes in the last interval, so the resumed
processes always have work left when the signal reaches them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Interruptions:
    """The planned interruptions of one demo run.

    Attributes:
        crash_at: SIGKILL the first training process once it reports this step.
        preempt_at: SIGTERM the second (resumed) process once it reports this step.
    """

    crash_at: int
    preempt_at: int


def plan_interruptions(steps: int, every: int, seed: int) -> Interruptions:
    """Chooses the crash and preemption points for ``steps`` with a checkpoint every ``every``.

    Raises:
        ValueError: ``steps`` and ``every`` leave no room for both interruptions.
    """
    if every < 4:
        raise ValueError(f"--every must be at least 4 so a crash can land between checkpoints, "
                         f"got {every}")
    lo, hi = every // 4, every - every // 4
    # after the first checkpoint, mid-interval, and not in the last interval
    candidates = [s for s in range(every + 1, steps - every) if lo <= s % every <= hi]
    intervals = sorted({s // every for s in candidates})
    if len(intervals) < 2:
        raise ValueError(f"--steps {steps} leaves no room for a crash and a later preemption "
                         f"between checkpoints (every {every} steps); use at least "
                         f"{4 * every} steps")
    rng = random.Random(seed)
    crash = rng.choice([s for s in candidates if s // every < intervals[-1]])
    preempt = rng.choice([s for s in candidates if s // every > crash // every])
    return Interruptions(crash, preempt)
