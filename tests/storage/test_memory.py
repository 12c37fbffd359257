"""Anonymous I/O memory: alignment, and faulting a range in with one call."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from shardsafe.storage.memory import HUGE, anonymous, populate


def _resident_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_anonymous_views_are_aligned():
    m, a = anonymous(3 * HUGE + 5)
    assert a.size == 3 * HUGE + 5 and a.ctypes.data % HUGE == 0
    m2, b = anonymous(10, huge=False)
    assert b.size == 10 and b.ctypes.data % 4096 == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux")
def test_populate_faults_the_range_in_and_keeps_it_zero():
    m, a = anonymous(64 << 20, huge=False)
    before = _resident_kib()
    if not populate(a[4096 : 48 << 20]):
        pytest.skip("the kernel has no MADV_POPULATE_WRITE (Linux before 5.14)")
    grown = _resident_kib() - before
    assert grown >= (48 << 20) // 1024 - 64  # about the populated range became resident
    assert not a.any()  # populated pages read as zeros, like fresh ones
    a[:] = 7
    assert (a == 7).all()
    assert populate(np.empty(0, dtype=np.uint8)) is False
