"""SaveHandle: the future of one asynchronous save."""

from __future__ import annotations

import threading
import time

from ..errors import CheckpointError, CheckpointTimeoutError


class SaveHandle:
    """Tracks one ``async_save``: staging, then writing and committing in the background.

    Errors of the background work are never only logged: ``result()`` re-raises them,
    and if nobody does, the next save of the same Checkpointer raises them.

    Attributes:
        path: The checkpoint path being written.
        nbytes: Bytes this process stages and writes.
        timings: Seconds from the ``async_save`` call to ``"staged"`` and ``"durable"``
            (filled in as the save progresses; for benchmarks and logs).
    """

    def __init__(self, path: str, nbytes: int = 0) -> None:
        self.path = path
        self.nbytes = nbytes
        self.timings: dict[str, float] = {}
        self._t0 = time.perf_counter()
        self._staged = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._collected = False

    # ----------------------------------------------------------------- public
    def wait_staged(self, timeout: float | None = None) -> None:
        """Blocks until the state has been copied; the caller may then mutate its tensors.

        Raises:
            CheckpointTimeoutError: ``timeout`` seconds passed first.
            BaseException: staging failed (the same error ``result()`` raises).
        """
        if not self._staged.wait(timeout):
            raise CheckpointTimeoutError(f"staging of {self.path!r} not finished after {timeout} s")
        if self._error is not None and not self._done.is_set():
            self._done.wait()  # a staging failure also ends the save; report it once settled
        if self._error is not None and "staged" not in self.timings:
            self._collected = True
            raise self._error

    def result(self, timeout: float | None = None) -> None:
        """Blocks until the checkpoint is committed and durable; re-raises any failure.

        Raises:
            CheckpointTimeoutError: ``timeout`` seconds passed first (the save goes on).
            BaseException: the error that made the save fail.
        """
        if not self._done.wait(timeout):
            raise CheckpointTimeoutError(f"async save to {self.path!r} not finished after {timeout} s")
        if self._error is not None:
            self._collected = True
            raise self._error

    def done(self) -> bool:
        """True once the save has committed or failed (``result()`` then returns at once)."""
        return self._done.is_set()

    @property
    def failed(self) -> bool:
        """True once the save has failed (without marking its error as seen)."""
        return self._done.is_set() and self._error is not None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Waits like ``result()`` and returns the error instead of raising it (None on success)."""
        if not self._done.wait(timeout):
            raise CheckpointTimeoutError(f"async save to {self.path!r} not finished after {timeout} s")
        self._collected = True
        return self._error

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self.done() else \
            "writing" if self._staged.is_set() else "staging"
        return f"SaveHandle({self.path!r}, {state})"

    # ----------------------------------------------------------------- engine side
    # Called by the Checkpointer that runs the save, not by users.

    def mark_staged(self) -> None:
        """The state has been copied: ``wait_staged()`` returns from now on."""
        self.timings.setdefault("staged", self._elapsed())
        self._staged.set()

    def settle(self, error: BaseException | None = None) -> None:
        """The save committed (``error`` None) or failed with ``error``; wakes every waiter."""
        if error is None:
            self.timings["durable"] = self._elapsed()
        self._error = error
        self._staged.set()
        self._done.set()

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Waits until ``settle`` was called (at most ``timeout`` s); True if it was."""
        return self._done.wait(timeout)

    def take_failure(self) -> BaseException | None:
        """The failure nobody has seen yet, now marked seen (None when none or already seen)."""
        err = None if self._collected else self._error
        self._collected = True
        return err

    def mark_collected(self) -> None:
        """The caller got this save's failure another way (raised to it directly)."""
        self._collected = True

    def orphan_in_child(self) -> None:
        """In a forked child: this save runs in the parent, whose threads the child lacks.

        Settles the child's copy with an error (fresh events: a parent thread may have held
        the old ones' locks at the fork), so ``result()`` in the child raises instead of
        waiting forever; marked collected, the child never reports it as its own failure.
        """
        if self._done.is_set():
            return
        self._error = CheckpointError(
            f"the async save to {self.path!r} belongs to the parent process; it is not "
            "finished in this forked child (call result() in the parent)")
        self._collected = True
        self._staged, self._done = threading.Event(), threading.Event()
        self._staged.set()
        self._done.set()

    def _elapsed(self) -> float:
        return time.perf_counter() - self._t0
