"""``storage.batch``: how a long read is cut into parts, and which requests of a batch are
draining (the rest of the batch waits for them)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from shardsafe.storage.batch import SMALLEST_PART, as_completed, split
from shardsafe.storage.runner import Pending, Request

MiB = 1 << 20


@pytest.mark.parametrize(("start", "end", "part", "window"), [
    (0, 1024 * MiB, 32 * MiB, 8), (7, 1024 * MiB + 7, 32 * MiB, 8), (0, 96 * MiB, 32 * MiB, 8),
    (0, 40 * MiB, 32 * MiB, 8), (100, 100 + 33 * MiB + 5, 32 * MiB, 2), (0, 3 * MiB, 32 * MiB, 8),
    (0, 30 * MiB - 100, 5 * MiB, 2), (0, 1, 32 * MiB, 8),
])
def test_the_parts_cover_the_read_once_in_order_and_shrink_towards_its_end(start: int, end: int, part: int,
                                                                           window: int) -> None:
    parts = split(start, end, part, window)
    assert parts[0][0] == start and parts[-1][1] == end
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous, in order
    sizes = [e - s for s, e in parts]
    assert max(sizes) <= part
    smallest = min(SMALLEST_PART, part)
    # shrinking: no part larger than one before it, but the last may take a small remainder
    assert all(a >= b for a, b in zip(sizes, sizes[1:-1]))
    if end - start <= window * part:  # one round: full parts, the last one what is left
        assert sizes[:-1] == [part] * (len(sizes) - 1)
    elif len(parts) > 1:
        assert min(sizes[:-1]) >= smallest and sizes[-1] >= smallest // 2


def test_a_long_read_ends_in_small_parts() -> None:
    sizes = [e - s for s, e in split(0, 1024 * MiB, 32 * MiB, 8)]
    assert sizes[:16] == [32 * MiB] * 16          # full parts while more than 2 x 8 of them remain
    # the last round of 8 in flight: the smallest parts (the last one with the remainder)
    assert all(SMALLEST_PART <= size < SMALLEST_PART * 3 // 2 for size in sizes[-8:])
    assert len(sizes) < 64                          # far fewer requests than in 16 MiB parts


def test_a_read_of_one_round_keeps_its_full_parts() -> None:
    assert [e - s for s, e in split(0, 128 * MiB, 32 * MiB, 8)] == [32 * MiB] * 4
    assert [e - s for s, e in split(0, 256 * MiB, 32 * MiB, 8)] == [32 * MiB] * 8
    assert len(split(0, 257 * MiB, 32 * MiB, 8)) > 9  # two rounds: the parts shrink


def test_a_read_shorter_than_the_smallest_part_is_one_request() -> None:
    assert split(10, 10 + 3 * MiB, 32 * MiB, 8) == [(10, 10 + 3 * MiB)]


def test_parts_smaller_than_the_smallest_stay_as_they_are() -> None:
    assert [e - s for s, e in split(0, 4 * MiB, MiB, 8)] == [MiB] * 4


class _Runner:
    """Answers every request at once, except the one keyed ``slow``, which it answers once
    the batch has marked it draining (or fails the test after 10 s)."""

    def __init__(self) -> None:
        self.draining_when_answered: dict[str, bool] = {}

    def submit(self, request: Request, make: Any) -> Pending[str]:
        pending: Pending[str] = Pending()
        key = request.detail
        if key != "slow":
            self.draining_when_answered[key] = pending.draining
            pending.future.set_result(key)
            return pending

        def answer_when_draining() -> None:
            end = time.monotonic() + 10
            while not pending.draining and time.monotonic() < end:
                time.sleep(0.01)
            self.draining_when_answered[key] = pending.draining
            pending.future.set_result(key)

        threading.Thread(target=answer_when_draining, daemon=True).start()
        return pending


def test_requests_left_in_flight_when_nothing_is_left_to_send_are_draining() -> None:
    runner = _Runner()
    calls = [(k, Request("GET", "b/k", k), None) for k in ("slow", "a", "b", "c")]
    done = [key for key, _ in as_completed(runner, calls, window=2)]  # type: ignore[arg-type]
    assert done == ["a", "b", "c", "slow"]
    assert runner.draining_when_answered == {"a": False, "b": False, "c": False, "slow": True}
