"""``FsspecStorage.read_into``: ranged reads keep their slots busy, whatever order the parts arrive in."""

from __future__ import annotations

import asyncio
import threading

import fsspec
import numpy as np
import pytest

from shardsafe.storage.fsspec import FsspecStorage

PART = 5 << 20  # the smallest part the store accepts


def _storage(parts: int, slots: int) -> tuple[FsspecStorage, str, bytes]:
    fs = fsspec.filesystem("memory")
    path = f"/reads-{parts}-{slots}/f"
    data = np.random.default_rng(parts).integers(0, 255, parts * PART - 100, dtype=np.uint8).tobytes()
    fs.pipe_file(path, data)
    return FsspecStorage(fs, part_size=PART, max_concurrency=slots), path, data


def test_a_slow_part_does_not_hold_back_the_parts_after_it() -> None:
    """Part 0 answers only once the last part has been asked for: with 2 slots, the other
    slot must serve every later part meanwhile (waiting for the oldest part first would
    leave part 0 waiting alone for its timeout)."""
    storage, path, data = _storage(parts=6, slots=2)
    last_asked = threading.Event()
    order: list[int] = []
    real = storage._get_range

    async def get_range(p: str, start: int, end: int) -> bytes:
        k = start // PART
        order.append(k)
        if k == 5:
            last_asked.set()
        if k == 0:
            assert await asyncio.get_running_loop().run_in_executor(None, last_asked.wait, 10), \
                "the later parts were not asked for while part 0 was slow"
        return await real(p, start, end)

    storage._get_range = get_range  # type: ignore[method-assign]
    out = bytearray(len(data))
    storage.read_into(path, 0, memoryview(out))
    assert bytes(out) == data
    assert order[:2] == [0, 1] and sorted(order) == list(range(6))


@pytest.mark.parametrize("offset, length", [(0, 6 * PART - 100), (PART // 2, 3 * PART), (5 * PART, 100)])
def test_every_part_lands_at_its_own_range(offset: int, length: int) -> None:
    storage, path, data = _storage(parts=6, slots=3)
    real = storage._get_range

    async def get_range(p: str, start: int, end: int) -> bytes:
        await asyncio.sleep(0.02 * ((start // PART) % 3 == 0))  # every third part late
        return await real(p, start, end)

    storage._get_range = get_range  # type: ignore[method-assign]
    out = bytearray(length)
    storage.read_into(path, offset, memoryview(out))
    assert bytes(out) == data[offset : offset + length]


def test_a_failed_part_fails_the_read_and_the_rest_are_abandoned() -> None:
    storage, path, data = _storage(parts=6, slots=2)
    real = storage._get_range
    asked: list[int] = []

    async def get_range(p: str, start: int, end: int) -> bytes:
        asked.append(start // PART)
        if start // PART == 2:
            raise FileNotFoundError(p)
        return await real(p, start, end)

    storage._get_range = get_range  # type: ignore[method-assign]
    with pytest.raises(FileNotFoundError):
        storage.read_into(path, 0, memoryview(bytearray(len(data))))
    assert 2 in asked and len(asked) <= 6
