"""The outcome of one save: ``SaveHandle`` for its caller, ``SaveProgress`` for the engine.

The engine marks a save staged and settles it (committed, or failed with an error)
through its ``SaveProgress``; the caller sees the same outcome through the
``SaveHandle`` the save returned, which only waits and reports. An error nobody has
seen is never only logged: the handle's ``result()`` raises it, else the next save of
the same Checkpointer, else ``close()``, else the exit hook logs it.
"""

from __future__ import annotations

import logging
import threading
import time

from ..._numbers import transfer
from ...errors import CheckpointError, CheckpointTimeoutError

log = logging.getLogger("shardsafe")


def summary(nbytes: int, timings: dict[str, float]) -> str:
    """A committed save for a log line: ``'1.2 GiB in 0.84 s (1.4 GiB/s), blocked 0.05 s'``
    (blocked: the staging of an async save, which held the caller)."""
    staged = timings.get("staged")
    blocked = f", blocked {staged:.2f} s" if staged is not None else ""
    return f"{transfer(nbytes, timings.get('durable', 0.0))}{blocked}"


class SaveProgress:
    """The engine's side of one save: staged, settled, and whether its error was seen.

    Attributes:
        path: The checkpoint path being written.
        nbytes: Bytes this process stages and writes for it.
        timings: Seconds from the start to ``"staged"`` and ``"durable"``.
        handle: The caller's view of this save.
        label: What the progress tracks, for log lines (``"the async save to <path>"``;
            other background work, such as a manager tier's work after a save, names
            itself, and its success is not logged as a save).
    """

    def __init__(self, path: str, nbytes: int = 0, label: str | None = None) -> None:
        self.path = path
        self.nbytes = nbytes
        self.label = label or f"the async save to {path!r}"
        self._is_save = label is None
        self.timings: dict[str, float] = {}
        self._t0 = time.perf_counter()
        self.staged = threading.Event()
        self.settled = threading.Event()
        self.error: BaseException | None = None
        self.collected = False
        self.handle = SaveHandle(self)

    def mark_staged(self) -> None:
        """The state has been copied: ``wait_staged()`` returns from now on."""
        if "staged" not in self.timings:
            self.timings["staged"] = self._elapsed()
            log.debug("staged the save to %s: %s", self.path, transfer(self.nbytes, self.timings["staged"]))
        self.staged.set()

    def settle(self, error: BaseException | None = None) -> None:
        """The save committed (``error`` None) or failed with ``error``; wakes every waiter."""
        if error is None:
            self.timings["durable"] = self._elapsed()
            if self._is_save:
                log.info("saved %s: %s", self.path, summary(self.nbytes, self.timings))
        self.error = error
        self.staged.set()
        self.settled.set()

    def take_failure(self) -> BaseException | None:
        """The failure nobody has seen yet, now marked seen (None when none or already seen)."""
        err = None if self.collected else self.error
        self.collected = True
        return err

    def orphan_in_child(self) -> None:
        """In a forked child: this save runs in the parent, whose threads the child lacks.

        Settles the child's copy with an error (fresh events: a parent thread may have held
        the old ones' locks at the fork), so ``result()`` in the child raises instead of
        waiting forever; marked collected, the child never reports it as its own failure.
        """
        if self.settled.is_set():
            return
        self.error = CheckpointError(
            f"{self.label} belongs to the parent process; it is not finished in this forked "
            "child (call result() in the parent)")
        self.collected = True
        self.staged, self.settled = threading.Event(), threading.Event()
        self.staged.set()
        self.settled.set()

    def _elapsed(self) -> float:
        return time.perf_counter() - self._t0


class SaveHandle:
    """Tracks one ``async_save``: staging, then writing and committing in the background.

    Errors of the background work are never only logged: ``result()`` re-raises them,
    and if nobody does, the next save of the same Checkpointer raises them.
    """

    __slots__ = ("_p",)

    def __init__(self, progress: SaveProgress) -> None:
        self._p = progress

    @property
    def path(self) -> str:
        """The checkpoint path being written."""
        return self._p.path

    @property
    def nbytes(self) -> int:
        """Bytes this process stages and writes."""
        return self._p.nbytes

    @property
    def timings(self) -> dict[str, float]:
        """Seconds from the ``async_save`` call to ``"staged"`` and ``"durable"`` (filled in
        as the save progresses; for benchmarks and logs)."""
        return self._p.timings

    def wait_staged(self, timeout: float | None = None) -> None:
        """Blocks until the state has been copied; the caller may then mutate its tensors.

        Raises:
            CheckpointTimeoutError: ``timeout`` seconds passed first.
            BaseException: staging failed (the same error ``result()`` raises).
        """
        p = self._p
        if not p.staged.wait(timeout):
            raise CheckpointTimeoutError(f"staging of {p.path!r} not finished after {timeout} s")
        if p.error is not None and not p.settled.is_set():
            p.settled.wait()  # a staging failure also ends the save; report it once settled
        if p.error is not None and "staged" not in p.timings:
            p.collected = True
            raise p.error

    def result(self, timeout: float | None = None) -> None:
        """Blocks until the checkpoint is committed and durable; re-raises any failure.

        Raises:
            CheckpointTimeoutError: ``timeout`` seconds passed first (the save goes on).
            BaseException: the error that made the save fail.
        """
        p = self._p
        if not p.settled.wait(timeout):
            raise CheckpointTimeoutError(f"async save to {p.path!r} not finished after {timeout} s")
        if p.error is not None:
            p.collected = True
            raise p.error

    def done(self) -> bool:
        """True once the save has committed or failed (``result()`` then returns at once)."""
        return self._p.settled.is_set()

    @property
    def failed(self) -> bool:
        """True once the save has failed (without marking its error as seen)."""
        return self._p.settled.is_set() and self._p.error is not None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Waits like ``result()`` and returns the error instead of raising it (None on success)."""
        p = self._p
        if not p.settled.wait(timeout):
            raise CheckpointTimeoutError(f"async save to {p.path!r} not finished after {timeout} s")
        p.collected = True
        return p.error

    def __repr__(self) -> str:
        p = self._p
        state = "failed" if p.error else "done" if self.done() else \
            "writing" if p.staged.is_set() else "staging"
        return f"SaveHandle({p.path!r}, {state})"


def settled_handle(path: str, error: BaseException | None = None) -> SaveHandle:
    """The handle of a save that already ended (with ``error``, or committed)."""
    p = SaveProgress(path)
    p.settle(error)
    return p.handle


__all__ = ["SaveHandle", "SaveProgress", "settled_handle"]
