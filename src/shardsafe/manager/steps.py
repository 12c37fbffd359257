"""Step directories under a manager's directory: naming, listing, records, leftovers.

``<directory>/step_<N>`` (N zero-padded to 8 digits; wider numbers are accepted) holds the
checkpoint of step N. Whether a step counts is decided only by
``engine.commit.is_committed``, the same function loaders use, so listing, restore and
retention can never disagree about which steps exist. Hidden working directories of
unfinished saves are recognised only by ``engine.commit.is_temporary``.

What the manager knows about a step (save time, metrics) is stored in the index metadata
under ``"shardsafe.manager"``, so it is committed atomically with the step itself.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import tensors
from ..engine import commit, sweep
from ..engine.index_exchange import read_index_alone
from ..storage.base import Storage
from .retention import StepRecord

log = logging.getLogger("shardsafe")

MANAGER_KEY = "shardsafe.manager"
QUARANTINE_SUFFIX = ".corrupt"
ROLLBACK_MARKER = ".rolled-back-"
_STEP_RE = re.compile(r"^step_(\d+)$")
# JSON has no non-finite numbers (the index is encoded with allow_nan=False): a NaN loss
# must not make a save fail, so non-finite metric values are stored as these strings.
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def step_name(step: int) -> str:
    """Directory name of ``step`` (``step_00000042``)."""
    return f"step_{step:08d}"


def parse_step(name: str) -> int | None:
    """The step a directory name stands for, or None if it is not a step directory."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------- metadata
def _metric_value(key: str, value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if tensors.is_tensor(value) and tensors.shape_of(value) in ((), (1,)):
        value = value.item()  # a 0-d torch tensor / numpy array (e.g. the loss)
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        if math.isfinite(f):
            return f
        return "NaN" if math.isnan(f) else ("Infinity" if f > 0 else "-Infinity")
    raise TypeError(f"metrics[{key!r}] is a {type(value).__name__}; metric values must be "
                    f"numbers (or scalar tensors), str, bool or None")


def encode_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Metrics as plain JSON values (raises TypeError naming the offending key)."""
    if metrics is None:
        return None
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping of str to numbers, got {type(metrics).__name__}")
    out = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise TypeError(f"metric names must be str, got {k!r}")
        out[k] = _metric_value(k, v)
    return out


def decode_metrics(raw: Any) -> dict[str, Any] | None:
    """Inverse of ``encode_metrics`` (non-finite markers become floats again)."""
    if not isinstance(raw, dict):
        return None
    return {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in raw.items()}


def manager_metadata(step: int, time: float, metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """The index metadata a manager save stores with ``step``."""
    return {MANAGER_KEY: {"step": step, "time": time, "metrics": encode_metrics(metrics)}}


# ---------------------------------------------------------------------- the directory
@dataclass(frozen=True, slots=True)
class StepDirectory:
    """The step directories under ``path`` (in ``storage``'s own path syntax)."""

    storage: Storage
    path: str

    def step_path(self, step: int, name: str | None = None) -> str:
        return self.storage.join(self.path, name or step_name(step))

    def _names(self) -> dict[int, list[str]]:
        by_step: dict[int, list[str]] = {}
        for name in commit.list_entries(self.storage, self.path):  # links are never steps
            step = parse_step(name)
            if step is not None:
                by_step.setdefault(step, []).append(name)
        return by_step

    def committed(self) -> dict[int, str]:
        """Committed steps and their directory names (canonical name preferred)."""
        out: dict[int, str] = {}
        for step, names in self._names().items():
            names.sort(key=lambda n: n != step_name(step))
            for name in names:
                if commit.is_committed(self.storage, self.step_path(step, name)):
                    out[step] = name
                    break
        return dict(sorted(out.items()))

    def record(self, step: int, name: str | None = None) -> StepRecord:
        """The step's save time and metrics, read from its committed index (of a version 4
        index only the head: a few kilobytes, however many ranks saved it).

        Raises:
            CheckpointNotFoundError: the step is not committed.
            CorruptCheckpointError: its index is damaged.
        """
        index = read_index_alone(self.storage, self.step_path(step, name)).index
        info = index.metadata.get(MANAGER_KEY)
        if not isinstance(info, dict):  # a plain shardsafe.save checkpoint placed here
            return StepRecord(step, index.created, None)
        t = info.get("time")
        t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else index.created
        return StepRecord(step, t, decode_metrics(info.get("metrics")))

    def leftovers(self) -> list[str]:
        """Names of crash leftovers: unfinished saves and half-deleted steps.

        A step directory without an index may also hold data files that committed steps
        reference (incremental saves): ``remove_leftovers`` and ``sweep`` keep those.
        """
        names = commit.list_entries(self.storage, self.path)
        out = [n for n in names if commit.is_temporary(n)]
        for n in names:
            step = parse_step(n)
            path = self.step_path(step or 0, n)
            if step is not None and not commit.is_committed(self.storage, path) and self.storage.is_directory(path):
                out.append(n)  # no index: a delete (index first, then data) was interrupted
        return out

    def remove_leftovers(self) -> list[str]:
        """Deletes unfinished saves and sweeps un-committed step directories (keeping the
        files committed steps reference); returns the names of what it removed or swept.
        Only for the single writer, with no save in flight."""
        removed = []
        for name in commit.list_entries(self.storage, self.path):
            if commit.is_temporary(name):
                self.storage.delete(self.storage.join(self.path, name))
                removed.append(name)
        removed += self.sweep()
        if removed:
            log.warning("removed %d leftover(s) of interrupted saves/deletes in %s: %s",
                        len(removed), self.path, ", ".join(removed))
        return removed

    def sweep(self, pinned: Iterable[str] = (), exclude: Iterable[str] = ()) -> list[str]:
        """Removes the files of un-committed step directories that no committed step uses
        (``engine.sweep``), except ``pinned`` files (``<step dir>/<file>``: a save in
        flight) and the directories named in ``exclude``; returns the swept directories."""
        skip = set(exclude)
        names = [n for n in commit.list_entries(self.storage, self.path)
                 if parse_step(n) is not None and n not in skip]
        return sweep.sweep(self.storage, self.path, names, pinned)

    def uncommit(self, step: int, name: str | None = None) -> None:
        """Removes the step's index: from now on it is not committed (its data is swept later)."""
        commit.uncommit(self.storage, self.step_path(step, name))

    def drop(self, steps: Mapping[int, str], pinned: Iterable[str] = ()) -> None:
        """Deletes ``steps`` (step -> directory name) crash-safely: every index first, then
        one ``sweep`` (retention)."""
        for step, name in steps.items():
            self.uncommit(step, name)
        if steps:
            self.sweep(pinned)

    def delete(self, step: int, name: str | None = None, pinned: Iterable[str] = (),
               exclude: Iterable[str] = ()) -> None:
        """Deletes a step crash-safely: index first (a half-deleted step is never
        committed), then every file no committed step references (``sweep``)."""
        self.uncommit(step, name)
        self.sweep(pinned, exclude)

    def _move(self, step: int, name: str | None, base: str) -> str:
        """Renames a step to ``base`` (or ``base.1``, ``base.2``, ... if taken)."""
        taken = set(self.storage.list(self.path))
        dst_name, i = base, 1
        while dst_name in taken:
            dst_name, i = f"{base}.{i}", i + 1
        self.storage.rename(self.step_path(step, name), self.storage.join(self.path, dst_name))
        return dst_name

    def set_aside(self, step: int, name: str | None = None) -> str | None:
        """Takes a corrupt step out of the listing; returns its new name (None: deleted).

        On local storage the step is renamed to ``step_N.corrupt`` and its bytes are kept
        for inspection; that name does not parse as a step, so listing, restore and the
        "not older than the latest step" rule ignore it. Object stores cannot rename a
        prefix atomically, so there the step is deleted crash-safely instead.
        """
        if not self.storage.atomic_rename:
            self.delete(step, name)
            return None
        return self._move(step, name, (name or step_name(step)) + QUARANTINE_SUFFIX)

    def roll_back(self, step: int, name: str | None, when: float) -> str:
        """Moves a healthy step out of the listing for a rollback; returns its new name.

        The new name is ``step_N.rolled-back-<UTC time>``: it keeps every byte (the step
        can be renamed back by hand), does not parse as a step, and ``shardsafe ls``
        shows it. Only for storage that renames atomically (the caller checks).
        """
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
        return self._move(step, name, f"{name or step_name(step)}{ROLLBACK_MARKER}{stamp}")


def is_rolled_back(name: str) -> bool:
    """True for a step moved aside by ``restore(..., rollback=True)``."""
    return parse_step(name.split(ROLLBACK_MARKER, 1)[0]) is not None and ROLLBACK_MARKER in name
