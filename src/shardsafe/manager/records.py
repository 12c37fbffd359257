"""What the manager knows about its committed steps (save time, metrics), cached.

A committed step never changes, so a writer caches what it read from each index; a
reader does not (the trainer may set a corrupt step aside and later commit the same
number again). Retention asks for the records of a listing; a step deleted since the
listing is skipped, and a step whose index is damaged gets a record without metrics
(saved at time 0), so one bad step cannot stop retention (``restore`` reports the damage).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from ..errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from .retention import StepRecord
from .steps import StepDirectory

log = logging.getLogger("shardsafe")


class StepRecords:
    """Records of the steps in ``directory`` (thread-safe; cached unless ``read_only``)."""

    def __init__(self, directory: StepDirectory, url: str, *, read_only: bool) -> None:
        self._dir = directory
        self._url = url
        self._cache_enabled = not read_only
        self._lock = threading.Lock()
        self._cache: dict[tuple[int, str], StepRecord] = {}

    def _put(self, step: int, name: str, rec: StepRecord) -> None:
        if self._cache_enabled:
            with self._lock:
                self._cache[(step, name)] = rec

    def get(self, step: int, name: str) -> StepRecord:
        """The record of committed ``step`` in directory ``name``.

        Raises:
            CheckpointNotFoundError: the step is not committed.
            CorruptCheckpointError: its index is damaged.
        """
        with self._lock:
            rec = self._cache.get((step, name))
        if rec is None:
            rec = self._dir.record(step, name)
            self._put(step, name, rec)
        return rec

    def of(self, committed: Mapping[int, str]) -> list[StepRecord]:
        """Records of listed steps, oldest first, for retention and ``best_step``."""
        out = []
        for step, name in committed.items():
            try:
                out.append(self.get(step, name))
            except CheckpointNotFoundError:
                continue
            except CorruptCheckpointError as e:
                log.warning("step %d in %s has a damaged index (%s); retention treats it as "
                            "saved without metrics", step, self._url, e)
                rec = StepRecord(step, 0.0, None)
                self._put(step, name, rec)
                out.append(rec)
        return out

    def forget(self, step: int, *, and_newer: bool = False) -> None:
        """Drops what is cached about ``step`` (and every newer step if ``and_newer``)."""
        with self._lock:
            for key in [k for k in self._cache if k[0] == step or (and_newer and k[0] > step)]:
                del self._cache[key]

    def newest_time(self) -> float:
        """Save time of the newest committed step (the reference of a time interval), or now."""
        now = time.time()
        committed = self._dir.committed()
        if not committed:
            return now
        step, name = next(reversed(committed.items()))
        try:
            return min(now, self.get(step, name).time)
        except CheckpointError as e:
            log.warning("cannot read the save time of step %d in %s: %s", step, self._url, e)
            return now
