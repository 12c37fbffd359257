"""Step directories under a manager's directory: naming, listing, records, leftovers.

``<directory>/step_<N>`` (N zero-padded to 8 digits; wider numbers are accepted) holds the
checkpoint of step N. Whether a step counts is decided only by
``engine.commit.is_committed``, the same function loaders use, so listing, restore and
retention can never disagree about which steps exist. Hidden working directories of
unfinished saves are recognised only by ``engine.commit.is_temporary``. What every other
name in the directory is (a step set aside as damaged, one a rollback moved aside) is
decided by ``classify``, and ``StepDirectory.entries`` is the one listing: the manager's
steps and leftovers and the ``shardsafe`` command's listings are read from it.

What the manager knows about a step (save time, metrics) is stored in the index metadata
under ``"shardsafe.manager"``, so it is committed atomically with the step itself;
``recorded`` reads it back.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .. import values
from ..engine import commit
from ..engine.commit import sweep
from ..engine.commit.names import parse_step, step_name
from ..engine.load.index_exchange import read_index_alone
from ..format.index.objects import Index
from ..plan.layout import is_data_file_name
from ..storage.base import Storage
from .retention import StepRecord

log = logging.getLogger("shardsafe")

MANAGER_KEY = "shardsafe.manager"
QUARANTINE_SUFFIX = ".corrupt"
ROLLBACK_MARKER = ".rolled-back-"
# a step set aside as damaged: step_N.corrupt (or step_N.corrupt.2, ... when taken)
_SET_ASIDE_RE = re.compile(re.escape(QUARANTINE_SUFFIX) + r"(\.\d+)?$")
# JSON has no non-finite numbers (the index is encoded with allow_nan=False): a NaN loss
# must not make a save fail, so non-finite metric values are stored as these strings.
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


Kind = Literal["step", "temporary", "set-aside", "rolled-back", "other"]


def classify(name: str) -> tuple[Kind, int | None]:
    """What an entry of a step directory is, from its name, and the step it belongs to:
    a step (``step_N``), the working directory of an unfinished save
    (``.step_N.shardsafe-tmp-<id>``; any name for a save not made by a manager), a step set
    aside as damaged (``step_N.corrupt``), one moved aside by a rollback
    (``step_N.rolled-back-<time>``), or something else (a checkpoint of any name)."""
    if commit.is_temporary(name):
        return "temporary", parse_step(name[1:].split(commit.TMP_MARKER, 1)[0])
    if _SET_ASIDE_RE.search(name):
        return "set-aside", parse_step(_SET_ASIDE_RE.sub("", name))
    if ROLLBACK_MARKER in name:
        step = parse_step(name.split(ROLLBACK_MARKER, 1)[0])
        if step is not None:
            return "rolled-back", step
    step = parse_step(name)
    return ("step", step) if step is not None else ("other", None)


def is_rolled_back(name: str) -> bool:
    """True for a step moved aside by ``restore(..., rollback=True)``."""
    return classify(name)[0] == "rolled-back"


# ---------------------------------------------------------------------- metadata
def _metric_value(key: str, value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if values.is_tensor(value) and values.shape_of(value) in ((), (1,)):
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


def recorded(index: Index) -> dict[str, Any]:
    """What a manager save recorded in ``index``: ``step``, ``time`` and ``metrics`` (as
    stored: JSON values, non-finite numbers as their markers), each only when well formed;
    empty for a checkpoint a manager did not write."""
    info = index.metadata.get(MANAGER_KEY)
    if not isinstance(info, dict):
        return {}
    out: dict[str, Any] = {}
    if type(info.get("step")) is int:  # noqa: E721 - not a bool
        out["step"] = info["step"]
    t = info.get("time")
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        out["time"] = float(t)
    if isinstance(info.get("metrics"), dict):
        out["metrics"] = info["metrics"]
    return out


# ---------------------------------------------------------------------- the directory
@dataclass(frozen=True, slots=True)
class StepEntry:
    """An entry of a step directory, as ``StepDirectory.entries`` lists it.

    Attributes:
        name: Its name in the directory.
        kind: What its name says it is (``classify``).
        step: The step its name belongs to (None: no step in the name).
        committed: Whether it holds a committed checkpoint (never for a temporary or a
            step set aside).
    """

    name: str
    kind: Kind
    step: int | None
    committed: bool


@dataclass(frozen=True, slots=True)
class StepDirectory:
    """The step directories under ``path`` (in ``storage``'s own path syntax)."""

    storage: Storage
    path: str

    def step_path(self, step: int, name: str | None = None) -> str:
        return self.storage.join(self.path, name or step_name(step))

    def entries(self, every: bool = False,
                map_fn: Callable[[Callable[[str], StepEntry | None], list[str]], Iterator[Any]] = map,
                ) -> list[StepEntry]:
        """The listing: every step and unfinished save in the directory (symbolic links
        are never listed), with whether each is committed; a step directory without an
        index is an interrupted delete or, on an object store, a save in progress.

        With ``every`` (what ``shardsafe ls`` shows), also the steps set aside or rolled
        back and checkpoints of any name (committed, or a directory holding data files),
        and temporaries only when they are directories. ``map_fn`` runs the per-entry
        requests (the command passes a thread pool's ``map``: one request per entry on an
        object store).
        """
        names = commit.list_entries(self.storage, self.path)
        return [e for e in map_fn(lambda n: self._entry(n, every), names) if e is not None]

    def _entry(self, name: str, every: bool) -> StepEntry | None:
        kind, step = classify(name)
        path = self.storage.join(self.path, name)
        if kind == "temporary":
            return StepEntry(name, kind, step, False) if not every or self.storage.is_directory(path) else None
        if kind != "step" and not every:
            return None
        if kind == "set-aside":
            return StepEntry(name, kind, step, False)
        if commit.is_committed(self.storage, path):
            return StepEntry(name, kind, step, True)
        if not self.storage.is_directory(path):
            return None  # a file, FIFO or device named like a step: not ours
        if kind == "step" or any(is_data_file_name(n) for n in self.storage.list(path)):
            return StepEntry(name, kind, step, False)
        return None

    def committed(self) -> dict[int, str]:
        """Committed steps and their directory names (canonical name preferred)."""
        out: dict[int, str] = {}
        for e in sorted(self.entries(), key=lambda e: e.name != step_name(e.step or 0)):
            if e.kind == "step" and e.committed and e.step is not None:
                out.setdefault(e.step, e.name)
        return dict(sorted(out.items()))

    def record(self, step: int, name: str | None = None) -> StepRecord:
        """The step's save time and metrics, read from its committed index (of a version 4
        index only the head: a few kilobytes, however many ranks saved it).

        Raises:
            CheckpointNotFoundError: the step is not committed.
            CorruptCheckpointError: its index is damaged.
        """
        index = read_index_alone(self.storage, self.step_path(step, name)).index
        r = recorded(index)  # empty for a plain shardsafe.save checkpoint placed here
        return StepRecord(step, r.get("time", index.created), decode_metrics(r.get("metrics")))

    def leftovers(self) -> list[str]:
        """Names of crash leftovers: unfinished saves and half-deleted steps.

        A step directory without an index may also hold data files that committed steps
        reference (incremental saves): ``remove_leftovers`` and ``sweep`` keep those.
        """
        return [e.name for e in self.entries() if not e.committed]

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
        (``engine.commit.sweep``), except ``pinned`` files (``<step dir>/<file>``: a save in
        flight) and the directories named in ``exclude``; returns the swept directories."""
        skip = set(exclude)
        names = [n for n in commit.list_entries(self.storage, self.path)
                 if classify(n)[0] == "step" and n not in skip]
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
