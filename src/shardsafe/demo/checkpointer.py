"""Periodic checkpoints of the demo job, one directory per step, via ``shardsafe.save``/``load``.

A local ``shardsafe.save`` writes into a hidden temporary directory and renames it into
place only after its index is published, so a visible ``step-<n>`` directory is always
a committed checkpoint; a save cut short by SIGKILL leaves only a hidden leftover.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any

import shardsafe

_STEP_DIR = re.compile(r"^step-(\d{8})$")


@dataclass(frozen=True, slots=True)
class SaveRecord:
    """One checkpoint written by the training loop.

    Attributes:
        step: The step it holds.
        blocked_s: Seconds the training loop was stopped for the save.
        nbytes: Size of the checkpoint on disk (all its files).
        path: Where it was written.
    """

    step: int
    blocked_s: float
    nbytes: int
    path: str


def directory_size(path: str) -> int:
    """Total size in bytes of the files under ``path``."""
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


class StepCheckpointer:
    """Saves the state every ``every`` steps to ``<directory>/step-<n>`` and restores the newest.

    Args:
        directory: Parent directory of the step checkpoints (created if missing).
        every: Save after every ``every``-th step; 0 never saves periodically.
    """

    def __init__(self, directory: str, every: int) -> None:
        if every < 0:
            raise ValueError(f"every must be >= 0, got {every}")
        self.directory = directory
        self.every = every
        os.makedirs(directory, exist_ok=True)

    def path(self, step: int) -> str:
        """Directory of the checkpoint of ``step``."""
        return os.path.join(self.directory, f"step-{step:08d}")

    def steps(self) -> list[int]:
        """Committed steps, oldest first (hidden leftovers of cut-short saves are ignored)."""
        found = (_STEP_DIR.match(name) for name in os.listdir(self.directory))
        return sorted(int(m.group(1)) for m in found if m)

    def restore(self, state: dict[str, Any]) -> int | None:
        """Loads the newest committed checkpoint into ``state``; returns its step or None."""
        steps = self.steps()
        if not steps:
            return None
        shardsafe.load(self.path(steps[-1]), state)
        return steps[-1]

    def save(self, step: int, state: dict[str, Any]) -> SaveRecord:
        """Saves ``state`` as the checkpoint of ``step`` and times how long that blocked."""
        path = self.path(step)
        start = time.perf_counter()
        shardsafe.save(state, path, metadata={"step": step})
        blocked = time.perf_counter() - start
        return SaveRecord(step, blocked, directory_size(path), path)

    def maybe_save(self, step: int, state: dict[str, Any]) -> SaveRecord | None:
        """Saves when ``step`` is due (a multiple of ``every``); returns what was written."""
        if self.every and step % self.every == 0:
            return self.save(step, state)
        return None
