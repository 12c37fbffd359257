"""How the subcommands show things: local times, text tables, progress bars on stderr.

Nothing here prints; the subcommand modules do.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def local_time(ts: float | None) -> str:
    """Local ``YYYY-MM-DD HH:MM:SS`` for a POSIX time; ``-`` when unknown."""
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def table(rows: list[list[str]]) -> Iterator[str]:
    """Left-aligned text columns (the first row is the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        yield "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass

    @contextmanager
    def paused(self) -> Iterator[None]:
        yield


class _Progress:
    """A tqdm bar on stderr. ``paused()`` clears it while the command prints a result line
    to stdout (the same terminal), then draws it again below the line."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def update(self, n: int) -> None:
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()  # leave=False: the bar's line is cleared

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self._bar.external_write_mode(file=sys.stdout):
            yield
            sys.stdout.flush()



def progress(total: int, desc: str, quiet: bool = False) -> Any:
    """A byte progress bar on stderr when it is a terminal, tqdm is installed and not
    ``quiet``; else silent. Result lines printed while it runs go inside ``paused()``;
    ``close()`` clears it."""
    if quiet or not sys.stderr.isatty():
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return _Progress(tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                          file=sys.stderr, leave=False))
