"""A rank loading part of a tensor reads only the checksum blocks that hold it."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardsafe
from shardsafe.api import save as save_mod
from shardsafe.engine.commit import read_index
from shardsafe.engine.reader import Reader, ReadJob
from shardsafe.errors import CorruptCheckpointError
from shardsafe.storage import LocalStorage


class CountingStorage(LocalStorage):
    """The real local backend, recording every byte range it reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int, int]] = []

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        self.reads.append((offset, len(out)))
        super().read_into(path, offset, out)


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(save_mod, "BLOCK_SIZE", 4096)  # 4 KiB checksum blocks


def read_rows(path: str, lo: int, hi: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    storage = CountingStorage()
    index = read_index(storage, path)
    entry = index.tensors[0]
    out = np.zeros((hi - lo, 256), dtype=np.float32)
    Reader(storage, path, index).run([ReadJob(entry, out.reshape(-1).view(np.uint8), (lo, 0),
                                              (hi - lo, 256))])
    return out, storage.reads


def test_row_slab_reads_only_its_blocks(tmp_path, small_blocks) -> None:  # noqa: ANN001
    x = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)  # 1 KiB rows, 16 blocks
    path = str(tmp_path / "ck")
    shardsafe.save({"x": x}, path)
    got, reads = read_rows(path, 9, 13)  # bytes [9 KiB, 13 KiB) -> blocks 2 and 3
    assert np.array_equal(got, x[9:13])
    assert [n for _, n in reads] == [2 * 4096]
    got, reads = read_rows(path, 0, 64)  # everything: one read of the whole chunk
    assert np.array_equal(got, x) and [n for _, n in reads] == [x.nbytes]


def test_partial_reads_still_verify_what_they_read(tmp_path, small_blocks) -> None:  # noqa: ANN001
    x = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    path = str(tmp_path / "ck")
    shardsafe.save({"x": x}, path)
    index = read_index(LocalStorage(), path)
    c = index.tensors[0].chunks[0]
    with open(os.path.join(path, c.file), "r+b") as f:  # flip a byte in block 3
        f.seek(c.offset + 3 * 4096 + 5)
        b = f.read(1)
        f.seek(c.offset + 3 * 4096 + 5)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CorruptCheckpointError, match="block 3"):
        read_rows(path, 9, 13)
    got, _ = read_rows(path, 0, 8)  # blocks 0-1 are intact and are all that is read
    assert np.array_equal(got, x[0:8])
