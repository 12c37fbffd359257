"""The manager's configuration: one small, frozen, validated dataclass, and its docs.

Every keyword argument of ``CheckpointManager`` is a field of ``ManagerOptions``: the
field's annotation, default and docstring are the one source of the option (the
manager's signature spells the same fields out for ``help()``, IDEs and type checkers,
and a test checks that both agree; ``option_docs`` hands the docstrings to the
manager's documentation). Every check, of a field alone or of a combination, runs in
``__post_init__`` (the engine's rules through ``engine.save.options.SaveOptions``), so a
bad combination fails when the manager is built, not hours later when the first
checkpoint would have been deleted; ``check_directory`` adds the rules that depend on
where the checkpoints go. What cannot work is refused with a message naming the
options, never dropped silently: a read-only manager, which never saves, refuses every
option that only shapes saves.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import inspect
import math
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..engine.save.options import SaveOptions
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

Seconds = float | datetime.timedelta
"""A duration: seconds, or a ``datetime.timedelta``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ManagerOptions:
    """Options of a ``CheckpointManager`` (the same names as its keyword arguments).

    Save decisions (``save_interval_steps``, ``save_on_steps``, ``save_interval_seconds``,
    ``initial_save``, a preemption signal) combine as "any of" (``save_policy``);
    retention (``max_to_keep``, ``keep_period``, ``keep_time_interval``, ``best_fn``)
    keeps what any of its rules keeps (``retention``). The way saves are written
    (``async_save``, ``max_staging_bytes``, ``compression``) applies to both tiers, and
    every combination of them works; ``incremental`` applies to the persistent tier
    (local steps stay whole, so that each one can be copied to a peer and restored on its
    own).
    """

    save_interval_steps: int | Literal["auto"] | None = 1
    """Save when ``step % save_interval_steps == 0``; None disables step-based saving
    (e.g. to save by time only); ``"auto"`` chooses the interval from the measured save
    cost and step time and ``expected_mtbf_seconds`` (Young/Daly, see ``interval``)."""

    save_on_steps: Iterable[int] = frozenset()
    """Steps that are always saved (any iterable of non-negative ints)."""

    save_interval_seconds: Seconds | None = None
    """Save when this many seconds have passed since the last save (or since the newest
    checkpoint was written, for a fresh manager)."""

    initial_save: bool = False
    """Save the first step asked about when the directory holds no checkpoint yet."""

    max_to_keep: int | None = None
    """Keep the newest this many checkpoints (the best this many, with ``best_fn``);
    None keeps all."""

    keep_period: int | None = None
    """Additionally keep every step divisible by this."""

    keep_time_interval: Seconds | None = None
    """Additionally keep one checkpoint per this many seconds."""

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
    """Host memory a save may stage into, for both tiers together (None: a copy of the
    whole state). A larger state streams through this many bytes while it is written, and
    ``save`` returns once the rest fits (see ``Checkpointer``); at least one 16 MiB staging
    unit (56 MiB with ``compression``: the budget also holds the blocks being coded). Needs
    a local directory (units are written as ranges)."""

    preemption_signals: Iterable[int] = ()
    """Signals that mean "save at the next step and exit" (not SIGKILL or SIGSTOP)."""

    read_only: bool = False
    """Never write, delete, lock or clean up (an evaluator next to a trainer). It restores
    from the local tier and peers too when they hold a newer step. Options that only
    shape saves are refused with it."""

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
    restart the first save writes everything. Local-tier steps stay whole."""

    local_directory: str | os.PathLike[str] | None = None
    """A fast directory on this node (e.g. ``/dev/shm/run``) for the local tier: each rank
    saves its own state there every ``local_save_interval_steps`` (see ``local_tier``),
    from the same staged copy as a persistent save of the same step. Survives process
    crashes, not the loss of the node."""

    local_save_interval_steps: int | None = None
    """Local saves when ``step % local_save_interval_steps == 0`` (needs ``local_directory``;
    default: every step that ``save`` is called for)."""

    local_max_to_keep: int = 2
    """Keep this many newest local checkpoints (and peer copies) per rank."""

    local_replication: bool = False
    """Also keep each rank's local checkpoint on a rank of another node, sent over a
    dedicated gloo group (see ``comm.p2p``), so a lost node's ranks restore from peers."""

    expected_mtbf_seconds: Seconds | None = None
    """Mean time between failures, for ``save_interval_steps="auto"``."""

    timeout: Seconds | None = None
    """Seconds a rank waits for the others in anything the manager does together: save
    decisions, saves and loads, retention, the restore agreement and peer copies (default
    ``SHARDSAFE_TIMEOUT``). A rank that stops calling the manager turns into
    ``CheckpointTimeoutError`` naming it on the ranks that did."""

    compression: Compression | None = None
    """Lossless compression of the saved tensors, on both tiers: None, ``"zstd"`` or
    ``"auto"`` (see ``shardsafe.save``). Pays where writing is slow or storage costs; costs
    CPU (in the background) and slows restores."""

    def __post_init__(self) -> None:
        # frozen: normalised values are written with object.__setattr__
        set_ = object.__setattr__
        if self.save_interval_steps != "auto":
            _positive_int("save_interval_steps", self.save_interval_steps)
        _positive_int("max_to_keep", self.max_to_keep)
        _positive_int("keep_period", self.keep_period)
        set_(self, "save_on_steps", _steps(self.save_on_steps))
        for name in ("save_interval_seconds", "keep_time_interval", "timeout"):
            set_(self, name, _seconds(name, getattr(self, name)))
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
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise ValueError(f"storage_options must be a mapping, got {self.storage_options!r}")
        self.save_options()  # the engine's rules (budget, compression)
        self._check_tiers()
        self._check_read_only()

    def save_options(self) -> SaveOptions:
        """The engine options of this manager's saves (validated by ``SaveOptions``)."""
        return SaveOptions(max_staging_bytes=self.max_staging_bytes, compression=self.compression)

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
            if "://" in str(self.local_directory):
                raise ValueError(f"local_directory must be a local path, got {self.local_directory!r}")
        elif self.local_save_interval_steps is not None or self.local_replication:
            raise ValueError("local_save_interval_steps and local_replication need local_directory")

    def _check_read_only(self) -> None:
        """A read-only manager never saves: options that only shape saves are refused."""
        if not self.read_only:
            return
        defaults = {f.name: f.default for f in dataclasses.fields(ManagerOptions)}
        set_ = [n for n in SAVE_ONLY if getattr(self, n) != defaults[n]]
        if set_:
            raise ValueError(f"a read_only manager never saves, so {', '.join(set_)} would have no "
                             f"effect: drop {'it' if len(set_) == 1 else 'them'} or read_only")


SAVE_ONLY = ("save_interval_steps", "save_on_steps", "save_interval_seconds", "initial_save", "max_to_keep",
             "keep_period", "keep_time_interval", "async_save", "max_staging_bytes", "preemption_signals",
             "incremental", "local_save_interval_steps", "local_max_to_keep", "expected_mtbf_seconds",
             "compression")
"""Options that only shape saves (and retention after a save)."""


def check_directory(opts: ManagerOptions, url: str) -> None:
    """The rules that depend on where the persistent checkpoints go.

    Raises:
        ValueError: ``max_staging_bytes`` with an object store (``scheme://``): its units
            are written as ranges, which object stores do not have.
    """
    if opts.max_staging_bytes is not None and "://" in url and not url.startswith("file://"):
        raise ValueError(f"max_staging_bytes streams a save through ranged writes, which the object "
                         f"store of {url!r} does not have: drop max_staging_bytes or save to a local "
                         f"directory")


def option_docs() -> dict[str, str]:
    """Each option's docstring (read from this module's source), by name; empty where the
    source is not available."""
    try:
        tree = ast.parse(inspect.getsource(ManagerOptions))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            out[node.target.id] = inspect.cleandoc(nxt.value.value)
    return out


def options_section() -> str:
    """The options and their docs as a docstring section (for ``help(CheckpointManager)``)."""
    docs = option_docs()
    lines = ["", "    Options (fields of ``ManagerOptions``):", ""]
    for f in dataclasses.fields(ManagerOptions):
        doc = " ".join(docs.get(f.name, "").split())
        lines.append(f"        {f.name} (default {f.default!r}): {doc}")
    return "\n".join(lines) + "\n"
