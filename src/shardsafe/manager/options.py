"""The manager's configuration: one small, frozen, validated dataclass.

Every keyword argument of ``CheckpointManager`` lands here; cross-field checks run in
``__post_init__`` so a bad combination fails when the manager is built, not hours later
when the first checkpoint would have been deleted.
"""

from __future__ import annotations

import datetime
import math
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..engine.buffers import slot_count
from ..engine.prepared import UNIT_SIZE
from ..format.codec import Compression, check_compression

BestFn = Callable[[Mapping[str, Any]], float]


def _positive_int(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


def _seconds(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be seconds (a number or timedelta) or None, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    return float(value)


def _steps(value: Iterable[int]) -> frozenset[int]:
    steps = frozenset(value)
    bad = [s for s in steps if isinstance(s, bool) or not isinstance(s, int) or s < 0]
    if bad:
        raise ValueError(f"save_on_steps must hold non-negative ints, got {sorted(map(repr, bad))}")
    return steps


def _signals(value: Iterable[int]) -> tuple[signal.Signals, ...]:
    out = []
    for s in value:
        try:
            out.append(signal.Signals(s))
        except ValueError:
            raise ValueError(f"preemption_signals: {s!r} is not a signal") from None
    if signal.SIGKILL in out or getattr(signal, "SIGSTOP", None) in out:
        raise ValueError("preemption_signals cannot include SIGKILL or SIGSTOP (they cannot be caught)")
    return tuple(dict.fromkeys(out))


BestMode = Literal["max", "min"]
"""Which end of ``best_fn`` is best."""

BEST_MODES: tuple[BestMode, ...] = get_args(BestMode)


@dataclass(frozen=True, kw_only=True, slots=True)
class ManagerOptions:
    """Options of a ``CheckpointManager`` (the same names as its keyword arguments).

    Save decisions (``save_interval_steps``, ``save_on_steps``, ``save_interval_seconds``,
    ``initial_save``, a preemption signal) combine as "any of" (``save_policy``);
    retention (``max_to_keep``, ``keep_period``, ``keep_time_interval``, ``best_fn``)
    keeps what any of its rules keeps (``retention``).
    """

    save_interval_steps: int | Literal["auto"] | None = 1
    """Save when ``step % save_interval_steps == 0``; None disables step-based saving
    (e.g. to save by time only); ``"auto"`` chooses the interval from the measured save
    cost and step time and ``expected_mtbf_seconds`` (Young/Daly, see ``interval``)."""

    save_on_steps: frozenset[int] = frozenset()
    """Steps that are always saved (any iterable of non-negative ints)."""

    save_interval_seconds: float | None = None
    """Save when this many seconds have passed since the last save (or since the newest
    checkpoint was written, for a fresh manager); a number or ``datetime.timedelta``."""

    initial_save: bool = False
    """Save the first step asked about when the directory holds no checkpoint yet."""

    max_to_keep: int | None = None
    """Keep the newest this many checkpoints (the best this many, with ``best_fn``);
    None keeps all."""

    keep_period: int | None = None
    """Additionally keep every step divisible by this."""

    keep_time_interval: float | None = None
    """Additionally keep one checkpoint per this many seconds (a number or
    ``datetime.timedelta``)."""

    best_fn: BestFn | None = None
    """``metrics -> float`` ranking checkpoints for retention and ``best_step()``."""

    best_mode: BestMode = "max"
    """``"max"`` or ``"min"``: which end of ``best_fn`` is best (needs ``best_fn``)."""

    keep_checkpoints_without_metrics: bool = True
    """With ``best_fn``, never delete checkpoints that were saved without metrics."""

    async_save: bool = True
    """Return from ``save`` once the state is staged in host memory and write in the
    background; False returns only after the commit and retention are done."""

    max_staging_bytes: int | None = None
    """Host memory an async save may stage into (None: a copy of the whole state). A
    larger state streams through this many bytes while it is written, and ``save``
    returns once the rest fits (see ``Checkpointer``); at least one staging unit."""

    preemption_signals: tuple[signal.Signals, ...] = ()
    """Signals that mean "save at the next step and exit" (not SIGKILL or SIGSTOP)."""

    read_only: bool = False
    """Never write, delete, lock or clean up (an evaluator next to a trainer)."""

    restore_fallback: bool = True
    """If the newest checkpoint fails verification, ``restore`` falls back to the next
    older one; False raises instead."""

    storage_options: Mapping[str, Any] | None = None
    """Passed to the storage backend (fsspec URLs)."""

    incremental: bool = False
    """Write only the chunks that changed since this manager's previous committed save;
    the new step's index references the unchanged ones in the earlier step's data files
    (exact: a 256-bit hash of the bytes plus key, dtype and shape equality). Step
    directories are then no longer self-contained: retention and ``delete`` keep the
    files a kept step references, and ``shardsafe export`` copies one step out. After a
    restart the first save writes everything. See README, "Incremental saves"."""
    local_directory: str | None = None
    """A fast directory on this node (e.g. ``/dev/shm/run``) for the local tier: each rank
    saves its own state there every ``local_save_interval_steps`` (see ``local_tier``).
    Survives process crashes, not the loss of the node."""

    local_save_interval_steps: int | None = None
    """Local saves when ``step % local_save_interval_steps == 0`` (needs ``local_directory``;
    default: every step that ``save`` is called for)."""

    local_max_to_keep: int = 2
    """Keep this many newest local checkpoints (and peer copies) per rank."""

    local_replication: bool = False
    """Also keep each rank's local checkpoint on a rank of another node, sent over a
    dedicated gloo group (see ``comm.p2p``), so a lost node's ranks restore from peers."""

    expected_mtbf_seconds: float | None = None
    """Mean time between failures, for ``save_interval_steps="auto"``."""

    timeout: float | None = None
    """Seconds a rank waits for the others in anything the manager does together: save
    decisions, saves and loads, retention, the restore agreement and peer copies (a number
    or ``datetime.timedelta``; default ``SHARDSAFE_TIMEOUT``). A rank that stops calling
    the manager turns into ``CheckpointTimeoutError`` naming it on the ranks that did."""

    compression: Compression | None = None
    """Lossless compression of the saved tensors: None, ``"zstd"`` or ``"auto"`` (see
    ``shardsafe.save``). Pays where writing is slow or storage costs; costs CPU."""

    def __post_init__(self) -> None:
        # frozen: normalised values are written with object.__setattr__
        set_ = object.__setattr__
        if self.save_interval_steps != "auto":
            _positive_int("save_interval_steps", self.save_interval_steps)
        _positive_int("max_to_keep", self.max_to_keep)
        _positive_int("keep_period", self.keep_period)
        if self.max_staging_bytes is not None:
            slot_count(self.max_staging_bytes, UNIT_SIZE)
        set_(self, "save_on_steps", _steps(self.save_on_steps))
        set_(self, "save_interval_seconds", _seconds("save_interval_seconds", self.save_interval_seconds))
        set_(self, "keep_time_interval", _seconds("keep_time_interval", self.keep_time_interval))
        set_(self, "timeout", _seconds("timeout", self.timeout))
        set_(self, "preemption_signals", _signals(self.preemption_signals))
        set_(self, "compression", check_compression(self.compression))
        if self.best_fn is not None and not callable(self.best_fn):
            raise ValueError(f"best_fn must be callable (metrics -> float), got {self.best_fn!r}")
        if self.best_mode not in BEST_MODES:
            raise ValueError(f"best_mode must be 'max' or 'min', got {self.best_mode!r}")
        if self.best_fn is None and self.best_mode != "max":
            raise ValueError("best_mode is set but best_fn is None: give best_fn to rank checkpoints")
        if self.best_fn is None and not self.keep_checkpoints_without_metrics:
            raise ValueError("keep_checkpoints_without_metrics=False only has a meaning with best_fn")
        for name in ("async_save", "read_only", "restore_fallback", "keep_checkpoints_without_metrics",
                     "initial_save", "incremental"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.read_only and self.preemption_signals:
            # a read-only manager never saves, so it could not act on the signal
            raise ValueError("a read_only manager cannot handle preemption_signals (it never saves)")
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise ValueError(f"storage_options must be a mapping, got {self.storage_options!r}")
        self._check_tiers()

    def _check_tiers(self) -> None:
        """Cross-field checks of the local tier and the automatic interval."""
        set_ = object.__setattr__
        set_(self, "expected_mtbf_seconds", _seconds("expected_mtbf_seconds", self.expected_mtbf_seconds))
        if (self.save_interval_steps == "auto") != (self.expected_mtbf_seconds is not None):
            raise ValueError('save_interval_steps="auto" and expected_mtbf_seconds go together '
                             "(the interval is computed from the failure rate)")
        _positive_int("local_save_interval_steps", self.local_save_interval_steps)
        _positive_int("local_max_to_keep", self.local_max_to_keep)
        if self.local_max_to_keep is None:
            raise ValueError("local_max_to_keep must be a positive int")
        if not isinstance(self.local_replication, bool):
            raise ValueError(f"local_replication must be a bool, got {self.local_replication!r}")
        if self.local_directory is not None:
            if not isinstance(self.local_directory, (str, os.PathLike)):
                raise ValueError(f"local_directory must be a path, got {self.local_directory!r}")
            set_(self, "local_directory", os.fspath(self.local_directory))
            if "://" in self.local_directory:
                raise ValueError(f"local_directory must be a local path, got {self.local_directory!r}")
        elif self.local_save_interval_steps is not None or self.local_replication:
            raise ValueError("local_save_interval_steps and local_replication need local_directory")
