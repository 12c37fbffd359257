"""``save_interval_steps="auto"``: the checkpoint interval from the failure rate (Young/Daly).

With checkpoints costing ``C`` seconds of blocked training each and failures arriving on
average every ``M`` seconds (the MTBF), the interval that loses the least time is, to
first order (Young 1974, Daly 2006)::

    T_opt = sqrt(2 * C * M)        seconds of training between checkpoints
    interval_steps = max(1, round(T_opt / step_seconds))

``young_daly_steps`` is that formula (pure). ``AutoInterval`` measures ``C`` (the time
``save`` blocked the caller, per persistent save) and the step time (between
``save`` calls, minus blocking), keeps exponential averages, and decides whether a step
is due: ``step - last_saved >= interval``. With several ranks, rank 0's measured
interval is broadcast the call after each save (``agree``), so every rank uses the same
interval and makes the same decisions; between saves no communication is needed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

_SMOOTHING = 0.5  # weight of the newest measurement in the running averages


def young_daly_steps(cost_s: float, step_s: float, mtbf_s: float) -> int:
    """Steps between checkpoints by Young/Daly: ``max(1, round(sqrt(2*C*M) / step))``."""
    if cost_s < 0 or step_s <= 0 or mtbf_s <= 0:
        raise ValueError(f"need cost >= 0, step time > 0, MTBF > 0 (got {cost_s}, {step_s}, {mtbf_s})")
    return max(1, round(math.sqrt(2.0 * cost_s * mtbf_s) / step_s))


class AutoInterval:
    """Measures save cost and step time; answers whether a step is due.

    Args:
        mtbf_s: Expected mean time between failures, in seconds.
        agree: Makes the ranks agree on a value (rank 0's wins); identity on one rank.
        clock: Monotonic clock (tests pass their own).
    """

    def __init__(self, mtbf_s: float, agree: Callable[[int], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.mtbf_s = mtbf_s
        self._agree = agree
        self._clock = clock
        self.cost_s: float | None = None
        self.step_s: float | None = None
        self.interval: int | None = None  # agreed; None until the first measurements
        self._last_saved: int | None = None
        self._last_call: float | None = None
        self._last_step: int | None = None
        self._blocked = 0.0  # blocking since the last call (not training time)
        self._stale = False

    def due(self, step: int) -> bool:
        """Called once per ``save`` call; True when ``step`` should be saved."""
        now = self._clock()
        if self._last_call is not None and self._last_step is not None and step > self._last_step:
            per_step = max(now - self._last_call - self._blocked, 1e-9) / (step - self._last_step)
            self.step_s = per_step if self.step_s is None else \
                _SMOOTHING * per_step + (1 - _SMOOTHING) * self.step_s
        self._last_call, self._last_step, self._blocked = now, step, 0.0
        if self._last_saved is None:
            return True  # the first save measures the cost
        if self._stale and self.step_s is not None and self.cost_s is not None:
            self.interval = self._agree(young_daly_steps(self.cost_s, self.step_s, self.mtbf_s))
            self._stale = False
        return self.interval is not None and step - self._last_saved >= self.interval

    def saved(self, step: int, blocked_s: float) -> None:
        """Records a save of ``step`` that blocked the caller ``blocked_s`` seconds."""
        self.cost_s = blocked_s if self.cost_s is None else \
            _SMOOTHING * blocked_s + (1 - _SMOOTHING) * self.cost_s
        self._last_saved = step
        self._last_call = self._clock()  # the step time is counted from the save's end
        self._blocked = 0.0
        self._stale = True


__all__ = ["AutoInterval", "young_daly_steps"]
