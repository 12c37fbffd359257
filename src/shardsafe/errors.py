"""Exceptions raised by shardsafe.

Hierarchy::

    CheckpointError                 base of everything shardsafe raises on purpose
    ├── CorruptCheckpointError      bad checksum, truncated/malformed file or index
    ├── CheckpointNotFoundError     no committed checkpoint at the path
    ├── StateMismatchError          checkpoint and target state disagree (keys, shapes, dtypes)
    ├── CheckpointTimeoutError      a save/load passed its deadline, or gave up waiting for other ranks
    └── StorageRequestError         a storage request kept failing until its retries ran out
                                    (also an OSError)

Unsupported values in a state raise the built-in ``TypeError`` naming the key path.
"""

from __future__ import annotations

from collections.abc import Sequence


class CheckpointError(Exception):
    """Base class of all checkpoint errors."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's bytes are damaged: checksum mismatch, truncated or malformed file.

    Attributes:
        file: The file (relative to the checkpoint) that is damaged, if known.
        key: The key path of the affected value, if known.
    """

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None) -> None:
        parts = [message]
        if file is not None:
            parts.append(f"file={file!r}")
        if key is not None:
            parts.append(f"key={key!r}")
        super().__init__(" | ".join(parts))
        self.message = message
        self.file = file
        self.key = key

    def __reduce__(self) -> tuple:
        # BaseException pickles as cls(*args); args holds the joined text, so rebuild from parts
        return _rebuild_corrupt, (type(self), self.message, self.file, self.key)


def _rebuild_corrupt(cls: type[CorruptCheckpointError], message: str, file: str | None,
                     key: str | None) -> CorruptCheckpointError:
    return cls(message, file=file, key=key)


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """There is no committed checkpoint at the given path."""


class StateMismatchError(CheckpointError):
    """The target state does not match the checkpoint.

    Attributes:
        problems: One human-readable line per offending key path.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        shown = "\n  ".join(self.problems[:200])
        more = "" if len(self.problems) <= 200 else f"\n  ... and {len(self.problems) - 200} more"
        super().__init__(f"{len(self.problems)} key path(s) do not match:\n  {shown}{more}")

    def __reduce__(self) -> tuple:
        return type(self), (self.problems,)


class CheckpointTimeoutError(CheckpointError, TimeoutError):
    """A save or load passed its deadline, or a collective operation waited longer than its
    timeout for other ranks.

    Attributes:
        rank: The rank whose request passed the deadline, if one did.
        file: The file that request concerned, if known.
        request: The request (e.g. ``PUT part 3/8``), if known.
    """

    def __init__(self, message: str, *, rank: int | None = None, file: str | None = None,
                 request: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.file = file
        self.request = request


class StorageRequestError(CheckpointError, OSError):
    """A request to the storage was throttled, reset, cut short or stalled on every one of
    its attempts (the per-request budget, ``SHARDSAFE_REQUEST_ATTEMPTS``).

    Attributes:
        rank: The rank that made the request, if known.
        file: The file the request concerned.
        request: The request (e.g. ``GET bytes 0-33554431``).
    """

    def __init__(self, message: str, *, rank: int | None = None, file: str | None = None,
                 request: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.file = file
        self.request = request
