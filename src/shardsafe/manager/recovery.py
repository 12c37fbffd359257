"""Restore the newest step that verifies, falling back past damaged ones.

An in-place load verifies every chunk as it reads; a damaged step may therefore have
written some tensors of ``state`` before the bad chunk was found. Falling back loads the
older step into the same ``state`` with the same strict matching, which rewrites every
tensor and applies containers and ``load_state_dict`` only after all reads succeeded, so
the result equals the older step exactly.

A step can also vanish while it is read (a trainer's retention deleting it under a
read-only evaluator); that is not damage: the listing is re-read and the newest step
tried again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ..engine.load.request import LoadRequest
from ..engine.load.run import run
from ..comm.agreement import Agreement
from ..engine.commit.detach import detach
from ..errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from ..format.index.objects import Index
from .steps import StepDirectory, recorded

log = logging.getLogger("shardsafe")


# restore outcomes, worst last: ranks agree on the maximum (see ``load_step``)
OK, VANISHED, CORRUPT, FAILED = 0, 1, 2, 3


def load_step(steps: StepDirectory, base_url: str, step: int, name: str,
              state: MutableMapping[str, Any], storage_options: Mapping[str, Any] | None,
              agree: Callable[[int], int] | None = None, timeout: float | None = None,
              cast: bool = False) -> None:
    """Loads step ``step`` (directory ``name`` under ``base_url``) into ``state`` in place
    (``cast``: as ``shardsafe.load``'s).

    ``agree`` (collective restores) turns this rank's outcome into the worst outcome of
    all ranks: each rank verifies only the bytes it reads, so a damaged chunk may be
    seen by one rank alone, and then every rank must raise, not just that one. ``timeout``
    bounds the collective load (default ``SHARDSAFE_TIMEOUT``).

    Raises:
        CheckpointNotFoundError: The step is not committed (or was deleted meanwhile).
        CorruptCheckpointError: It fails verification, or a data file vanished mid-read.
    """
    url = steps.storage.join(base_url, name)
    t0 = time.monotonic()
    outcome, error = OK, None
    try:
        _load(url, step, state, storage_options, timeout, cast)
    except CheckpointNotFoundError as e:
        outcome, error = VANISHED, e
    except CorruptCheckpointError as e:
        outcome, error = CORRUPT, e
    except CheckpointError as e:
        outcome, error = FAILED, e
    if agree is not None:
        worst = agree(outcome)
        if worst > outcome:  # another rank failed: fail alike
            error = {VANISHED: CheckpointNotFoundError, CORRUPT: CorruptCheckpointError}.get(
                worst, CheckpointError)(f"step {step}: another rank could not load it")
    if error is not None:
        error.add_note(f"shardsafe: while restoring step {step} from {url!r}")
        raise error
    log.info("restored step %d from %s in %.2f s", step, url, time.monotonic() - t0)


def _load(url: str, step: int, state: MutableMapping[str, Any],
          storage_options: Mapping[str, Any] | None, timeout: float | None, cast: bool) -> None:
    try:
        run(LoadRequest(path=url, state=state, check=_records(step),
                        storage_options=dict(storage_options) if storage_options is not None else None,
                        timeout=timeout, cast=cast))
    except FileNotFoundError as e:
        if isinstance(e, CheckpointNotFoundError):
            raise
        raise CorruptCheckpointError("data file is missing",
                                     file=os.path.basename(e.filename or "") or None) from e


def _records(step: int) -> Callable[[Index], None]:
    """A check that an index records ``step`` (a step's identity is in its index, not its
    name: a copied or renamed step directory is refused as damaged, never restored as
    the step its name says)."""
    def check(index: Index) -> None:
        saved = recorded(index).get("step")
        if saved is not None and saved != step:
            raise CorruptCheckpointError(f"the directory of step {step} holds step {saved} "
                                         f"(its index says so): a copy or a renamed step")
    return check


@dataclass(slots=True)
class Outcome:
    """Result of ``restore_newest``.

    Attributes:
        step: The restored step (None: no committed step at all).
        corrupt: Damaged steps skipped on the way: step -> (directory name, reason).
    """

    step: int | None = None
    corrupt: dict[int, tuple[str, str]] = field(default_factory=dict)


def listed_once(steps: StepDirectory, agreement: Agreement) -> dict[int, str]:
    """The committed steps (step -> directory name), listed by rank 0 alone and told to
    every rank: one LIST (and one existence check per step) for the whole job, not one
    per rank. Collective: every rank calls it at the same point."""
    if agreement.world_size == 1:
        return steps.committed()
    pairs = agreement.leader_decides(lambda: list(steps.committed().items()),
                                     what=f"listing the steps of {steps.path!r}")
    return {int(s): str(n) for s, n in pairs}


def restore_newest(steps: StepDirectory, base_url: str, state: MutableMapping[str, Any], *,
                   fallback: bool, storage_options: Mapping[str, Any] | None,
                   agree: Callable[[int], int] | None = None, timeout: float | None = None,
                   listing: Callable[[], dict[int, str]] | None = None, cast: bool = False) -> Outcome:
    """Loads the newest committed step that verifies into ``state``.

    ``listing`` gives the committed steps (default: ``steps.committed()``; a collective
    restore passes ``listed_once``, so that one rank lists for all).

    Raises:
        CorruptCheckpointError: The newest step is damaged and ``fallback`` is False, or
            every committed step is damaged.
    """
    committed = listing or steps.committed
    out = Outcome()
    vanished: set[int] = set()
    while True:
        candidates = {s: n for s, n in committed().items()
                      if s not in out.corrupt and s not in vanished}
        if not candidates:
            break
        step, name = max(candidates.items())
        try:
            load_step(steps, base_url, step, name, state, storage_options, agree, timeout, cast)
        except CheckpointNotFoundError:
            vanished.add(step)
            continue
        except CorruptCheckpointError as e:
            if step not in committed():
                vanished.add(step)  # deleted while we read it: not damage
                continue
            if not fallback:
                raise
            log.warning("step %d in %s failed verification, falling back to an older step: %s",
                        step, base_url, e)
            out.corrupt[step] = (name, str(e))
            continue
        out.step = step
        return out
    if out.corrupt:
        reasons = "; ".join(f"step {s}: {r}" for s, (_, r) in sorted(out.corrupt.items(), reverse=True))
        raise CorruptCheckpointError(f"no committed step in {base_url!r} could be restored "
                                     f"({reasons}); `state` may be partially overwritten")
    return out


# ---------------------------------------------------------------------- rollback
def check_rollback(steps: StepDirectory, base_url: str, step: int | None) -> None:
    """Raises CheckpointError unless a rollback to ``step`` is possible here."""
    if step is None:
        raise CheckpointError("restore(rollback=True) needs the step to continue from")
    if not steps.storage.atomic_rename:
        raise CheckpointError(f"cannot roll back {base_url!r}: its storage cannot rename a step "
                              f"atomically to move it aside; delete the newer steps with "
                              f"delete(step) if you mean to")


def roll_back_after(steps: StepDirectory, base_url: str, step: int) -> None:
    """Moves every committed step newer than ``step`` aside (kept, no longer listed).

    Each is first made self-contained (``engine.commit.detach``): a step that references another
    moved step still loads where it lies and when it is renamed back.
    """
    now = time.time()
    newer = {s: name for s, name in steps.committed().items() if s > step}
    for s, name in newer.items():
        detach(steps.storage, steps.step_path(s, name))
    for s, name in newer.items():
        new = steps.roll_back(s, name, now)
        log.warning("rolled back to step %d in %s: step %d moved aside to %s", step, base_url, s, new)
