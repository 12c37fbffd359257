"""Preemption signals: remember that one arrived, so the loop saves and exits cleanly.

The handler only sets a flag (nothing else is safe inside a signal handler: the training
thread may hold any lock). The manager turns the flag into "save at the next step".
A second delivery of the same signal behaves as if shardsafe were not installed (the
previous handler runs, or the default action happens), so a second Ctrl-C or an
operator's repeated SIGTERM still stops a stuck job.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Union

log = logging.getLogger("shardsafe")

_Handler = Union[Callable[[int, "FrameType | None"], Any], int, None]


class PreemptionWatcher:
    """Installs handlers for ``signals`` and records the first one received.

    Args:
        signals: Signals that announce a preemption (e.g. ``(signal.SIGTERM,)``).

    Raises:
        ValueError: Not called from the main thread (Python only allows handlers there).
    """

    def __init__(self, signals: Sequence[signal.Signals]) -> None:
        self._received: signal.Signals | None = None
        self._previous: dict[signal.Signals, _Handler] = {}
        if signals and threading.current_thread() is not threading.main_thread():
            raise ValueError("preemption_signals need the CheckpointManager to be created in the "
                             "main thread (Python installs signal handlers only there)")
        for s in signals:
            self._previous[s] = signal.signal(s, self._handle)

    @property
    def received(self) -> signal.Signals | None:
        """The first preemption signal received, or None."""
        return self._received

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._received is None:
            self._received = signal.Signals(signum)
            return
        # the job is still running after a second notice: stop caring about a clean save
        prev = self._previous.get(signal.Signals(signum), signal.SIG_DFL)
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def close(self) -> None:
        """Restores the handlers that were installed before (where ours is still in place)."""
        if not self._previous:
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("CheckpointManager closed outside the main thread: preemption signal "
                        "handlers for %s stay installed", [s.name for s in self._previous])
            return
        for s, prev in self._previous.items():
            if signal.getsignal(s) == self._handle:  # someone else's newer handler stays
                signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()
