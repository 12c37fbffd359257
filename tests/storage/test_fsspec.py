"""``FsspecStorage``: ranged reads and multipart part uploads keep their slots busy, whatever
order the parts finish in."""

from __future__ import annotations

import asyncio
import threading

import fsspec
import numpy as np
import pytest

from shardsafe.storage import storage_for
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


def _s3_storage(s3, name: str, slots: int) -> tuple[FsspecStorage, str]:  # noqa: ANN001
    storage, root = storage_for(f"{s3.url}/{name}", s3.storage_options)
    return FsspecStorage(storage.fs, part_size=PART, max_concurrency=slots), root


def test_a_slow_part_upload_does_not_hold_back_the_parts_after_it(s3, monkeypatch) -> None:  # noqa: ANN001
    """Part 1 is stored only once the last part has been sent: with 2 slots, the other
    slot must upload every later part meanwhile (waiting for the oldest part first would
    leave part 1 waiting alone for its timeout). The parts finish out of order and the
    completed object holds the right bytes, in order."""
    monkeypatch.setenv("SHARDSAFE_HEDGE", "0")  # the slow part is not duplicated: only its slot waits
    storage, root = _s3_storage(s3, "slow-part", slots=2)
    data = np.random.default_rng(7).integers(0, 255, 6 * PART - 100, dtype=np.uint8).tobytes()
    last_sent = asyncio.Event()
    order: list[int] = []
    real = storage._afs._call_s3

    async def call_s3(method: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if method == "upload_part":
            n = kwargs["PartNumber"]
            order.append(n)
            if n == 6:
                last_sent.set()
            if n == 1:
                await asyncio.wait_for(last_sent.wait(), 10)  # TimeoutError: the later parts waited
        return await real(method, *args, **kwargs)

    monkeypatch.setattr(storage._afs, "_call_s3", call_s3)
    storage.write(f"{root}/f", [memoryview(data)])
    assert order[:2] == [1, 2] and sorted(order) == list(range(1, 7))
    monkeypatch.undo()
    assert storage.read(f"{root}/f") == data
    assert s3.filesystem().list_multipart_uploads(s3.bucket) == []


def test_a_failed_part_upload_aborts_the_upload_after_the_rest_stopped(s3, monkeypatch) -> None:  # noqa: ANN001
    """Part 3 fails for good while part 1 is still being sent: part 1 is cancelled and has
    stopped before the upload is aborted, and the error is part 3's."""
    monkeypatch.setenv("SHARDSAFE_HEDGE", "0")
    storage, root = _s3_storage(s3, "failed-part", slots=2)
    data = bytes(4 * PART)
    events: list[str] = []
    real = storage._afs._call_s3

    async def call_s3(method: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        n = kwargs.get("PartNumber")
        if method == "upload_part" and n == 1:
            try:
                await asyncio.sleep(30)
            finally:
                await asyncio.sleep(0.3)  # a connection that takes a while to close
                events.append("part 1 stopped")
        if method == "upload_part" and n == 3:
            raise FileNotFoundError("part 3: no such upload")
        if method == "abort_multipart_upload":
            events.append("abort")
        return await real(method, *args, **kwargs)

    monkeypatch.setattr(storage._afs, "_call_s3", call_s3)
    with pytest.raises(FileNotFoundError, match="part 3"):
        storage.write(f"{root}/f", [memoryview(data)])
    assert events == ["part 1 stopped", "abort"]
    monkeypatch.undo()
    assert s3.filesystem().list_multipart_uploads(s3.bucket) == []
    assert not storage.exists(f"{root}/f")


def test_a_stream_of_unknown_size_starts_its_upload_once_past_two_parts(s3) -> None:  # noqa: ANN001
    """A block file being coded: the multipart upload is created, and its first two parts
    sent, as soon as more than two parts have come, before the rest of the stream is
    coded; the object holds the stream's bytes in order."""
    storage, root = _s3_storage(s3, "unsized", slots=4)
    data = np.random.default_rng(9).integers(0, 255, 4 * PART + 7, dtype=np.uint8).tobytes()
    piece = 3 << 20
    seen_while_streaming: list[int] = []

    def pieces():  # noqa: ANN202
        for at in range(0, len(data), piece):
            if at > 3 * piece:  # the stream went past two parts two pieces ago
                seen_while_streaming.append(len(s3.filesystem().list_multipart_uploads(s3.bucket)))
            yield memoryview(data)[at:at + piece]

    storage.write_stream(f"{root}/f", None, pieces())
    assert seen_while_streaming and all(n == 1 for n in seen_while_streaming)
    assert storage.read(f"{root}/f") == data
    assert s3.filesystem().list_multipart_uploads(s3.bucket) == []


@pytest.mark.parametrize(("pieces", "sizes"), [
    ([17], [5, 5, 5, 2]),        # a piece of several parts
    ([11, 3, 1], [5, 5, 5]),
    ([4, 4, 4], [5, 5, 2]),
    ([10], [5, 5]),
    ([0, 3, 0], [3]),
])
def test_regroup_copies_pieces_into_parts_of_their_own(pieces: list[int], sizes: list[int]) -> None:
    """Each part is a copy that stays as it was when the caller reuses its buffer for the
    next piece (a retried request sends the same body again)."""
    from shardsafe.storage.fsspec import _regroup

    stream = bytes(range(256))[: sum(pieces)]
    reused = bytearray(max(pieces))  # one buffer for every piece, as the upload sink's caller does

    def feed():  # noqa: ANN202
        at = 0
        for n in pieces:
            reused[:n] = stream[at:at + n]
            yield memoryview(reused)[:n]
            reused[:] = b"\xff" * len(reused)  # the caller reuses its buffer
            at += n

    parts = list(_regroup(feed(), 5, len(stream), "p"))
    assert [len(p) for p in parts] == sizes and b"".join(parts) == stream
    with pytest.raises(ValueError, match="expected"):
        list(_regroup(feed(), 5, len(stream) + 1, "p"))
