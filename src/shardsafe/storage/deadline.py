"""The deadline of one save or load, as the storage requests made for it see it.

A ``Deadline`` is made when a save or load starts (``timeout`` seconds from then,
default ``SHARDSAFE_TIMEOUT``) and travels with the backend of that call
(``storage_for(..., deadline=...)``). Every request checks it before each attempt and
is abandoned when it passes; the error names the rank, the file and the request, so
that a rank whose upload is stuck fails on its own and tells the others through the
save's abort path instead of holding them in a barrier.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .. import knobs
from ..errors import CheckpointTimeoutError


class Deadline:
    """A point in time (monotonic clock) by which a save or load must be done.

    Args:
        seconds: Time from now.
        rank: The rank whose call this is (named in the error).
        what: The call, in words (``"save to s3://b/ckpt"``).
    """

    def __init__(self, seconds: float, *, rank: int = 0, what: str = "save") -> None:
        if seconds <= 0:
            raise ValueError(f"a deadline must be in the future, got {seconds} s")
        self.seconds = float(seconds)
        self.rank = rank
        self.what = what
        self.at = time.monotonic() + self.seconds

    @classmethod
    def for_call(cls, timeout: float | None, rank: int, what: str) -> Deadline:
        """The deadline of a save or load called with ``timeout`` (None: ``SHARDSAFE_TIMEOUT``)."""
        return cls(knobs.timeout() if timeout is None else float(timeout), rank=rank, what=what)

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return self.remaining() <= 0

    def error(self, request: str, file: str, failures: Sequence[str] = (), *,
              retry_in: float | None = None) -> CheckpointTimeoutError:
        """The error of ``request`` on ``file``, unfinished when the deadline passed (or,
        with ``retry_in``, due for a retry that would start too late)."""
        tried = f" (earlier attempts: {', '.join(failures)})" if failures else ""
        when = (f"passed its deadline of {self.seconds:g} s during" if retry_in is None else
                f"has {max(0.0, self.remaining()):.1f} s left of its deadline of {self.seconds:g} s, "
                f"too little to retry (in {retry_in:.1f} s)")
        return CheckpointTimeoutError(f"rank {self.rank}: the {self.what} {when} {request} of {file}{tried}",
                                      rank=self.rank, file=file, request=request)


__all__ = ["Deadline"]
