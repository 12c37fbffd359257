"""Measuring helpers: timers, peak RSS of one operation, page-cache dropping, medians."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field


def _status() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:  # not Linux: peak RSS is reported as unknown
        pass
    return out


def reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS mark (VmHWM) to the current RSS; False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class PeakRSS:
    """Extra peak resident memory (bytes) of the code run inside ``track()``; None if unknown."""

    extra: int | None = None

    @contextmanager
    def track(self) -> Iterator[None]:
        ok = reset_peak_rss()
        before = _status().get("VmRSS")
        yield
        hwm = _status().get("VmHWM")
        self.extra = hwm - before if ok and hwm is not None and before is not None else None


def drop_cache(path: str, *, system: bool = False) -> None:
    """Evicts ``path``'s files (a file or a directory tree) from the page cache.

    Uses ``posix_fadvise(DONTNEED)`` on each file (its pages are clean after fsync, so
    they are dropped); with ``system`` also writes ``/proc/sys/vm/drop_caches`` when
    permitted (root), which drops every clean page of the machine.
    """
    files = [path] if os.path.isfile(path) else [
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if system:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1")
        except OSError:  # not root, or a container: the per-file eviction above still applies
            pass


def settle() -> None:
    """Flushes all pending filesystem work before a timed operation.

    Deleting a checkpoint leaves work for the next journal commit (on a filesystem
    mounted with ``discard`` it even issues the discards then); without this, the next
    system's first fsync would pay for the previous system's cleanup.
    """
    os.sync()


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


@dataclass
class Samples:
    """Repeated measurements of one operation: metric name -> values."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, **metrics: float | None) -> None:
        for k, v in metrics.items():
            if v is not None:
                self.values.setdefault(k, []).append(float(v))

    def median(self, key: str) -> float | None:
        return median(self.values.get(key))


def median(samples: Sequence[float] | None) -> float | None:
    """The median of ``samples``; None when there are none."""
    return statistics.median(samples) if samples else None


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def warm_cache(path: str) -> None:
    """Reads ``path``'s files once so the next load finds them in the page cache."""
    files = [path] if os.path.isfile(path) else [
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    buf = bytearray(16 << 20)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
