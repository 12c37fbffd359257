"""Partial reads verified by checksum sub-blocks: a piece of a chunk reads only the
sub-blocks that hold it, checks each, and checks that the recorded sub-block checksums of
every block it touches combine to the block's checksum (docs/FORMAT.md section 15.7)."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import flip_byte

import shardsafe
from shardsafe.engine.commit import read_index
from shardsafe.engine.load.reader import ChunkReader, ReadJob
from shardsafe.format import INDEX_NAME
from shardsafe.format.checksum import crc32c
from shardsafe.format.index.versions import decode, encode_columnar
from shardsafe.format.sub_blocks import SUB_BLOCK_SIZE, SubBlocks
from shardsafe.storage.local import LocalStorage

DATA = "data-r00000-000.safetensors"
N = 5 << 20  # float32 elements: 20 MiB, two 16 MiB checksum blocks
SUB = SUB_BLOCK_SIZE // 4  # elements per sub-block


class CountingStorage(LocalStorage):
    """The local backend, counting the bytes of every ranged read."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes_read = 0

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        self.bytes_read += len(out)
        super().read_into(path, offset, out)


@pytest.fixture
def saved(tmp_path):
    big = torch.randn(N, generator=torch.Generator().manual_seed(3))
    path = str(tmp_path / "c")
    shardsafe.save({"big": big}, path)
    return path, big


def _read(path: str, lo: int, n: int) -> tuple[np.ndarray, int]:
    storage = CountingStorage()
    index = read_index(storage, path)
    entry = index.tensors[0]
    dest = np.zeros(n * 4, dtype=np.uint8)
    storage.bytes_read = 0
    ChunkReader(storage, path, index).run([ReadJob(entry, dest, (lo,), (n,))])
    return dest.view(np.float32), storage.bytes_read


def _rewrite_index(path: str, **sub: object) -> None:
    """Rewrites the checkpoint's index with its chunk table's sub-blocks replaced."""
    with open(os.path.join(path, INDEX_NAME), "rb") as f:
        ci, _ = decode(f.read())
    table = replace(ci.chunks, **sub)
    with open(os.path.join(path, INDEX_NAME), "wb") as f:
        f.write(encode_columnar(replace(ci, chunks=table)))


def test_a_save_records_sub_blocks(saved):
    path, _ = saved
    chunk = read_index(LocalStorage(), path).tensors[0].chunks[0]
    assert len(chunk.sub_checksums) == (N * 4) // SUB_BLOCK_SIZE
    with open(os.path.join(path, DATA), "rb") as f:
        f.seek(chunk.offset + 7 * SUB_BLOCK_SIZE)
        assert chunk.sub_checksums[7] == crc32c(f.read(SUB_BLOCK_SIZE))


def test_a_piece_reads_only_its_sub_blocks(saved):
    path, big = saved
    lo, n = 3 * SUB + 100, 2 * SUB  # spans three sub-blocks of the first block
    got, read = _read(path, lo, n)
    assert np.array_equal(got, big[lo : lo + n].numpy())
    assert read == 3 * SUB_BLOCK_SIZE
    assert read / (n * 4) <= 1.5


def test_a_flipped_byte_in_a_sub_block_read_is_caught(saved):
    path, _ = saved
    off = read_index(LocalStorage(), path).tensors[0].chunks[0].offset
    flip_byte(os.path.join(path, DATA), off + 4 * SUB_BLOCK_SIZE + 17, 0x40)
    with pytest.raises(shardsafe.CorruptCheckpointError) as e:
        _read(path, 3 * SUB + 100, 2 * SUB)
    assert e.value.file == DATA and e.value.key == "big" and "sub-block 4" in str(e.value)


def test_a_flipped_byte_outside_the_read_is_not_read_but_a_whole_load_catches_it(saved):
    path, big = saved
    off = read_index(LocalStorage(), path).tensors[0].chunks[0].offset
    flip_byte(os.path.join(path, DATA), off + 20 * SUB_BLOCK_SIZE + 5, 0x40)  # same block, not read
    got, read = _read(path, 3 * SUB + 100, 2 * SUB)
    assert np.array_equal(got, big[3 * SUB + 100 : 5 * SUB + 100].numpy()) and read == 3 * SUB_BLOCK_SIZE
    with pytest.raises(shardsafe.CorruptCheckpointError) as e:
        shardsafe.load(path)
    assert e.value.file == DATA and e.value.key == "big"


def test_a_forged_sub_block_checksum_is_refused(saved):
    """Damaged bytes with a sub-block checksum forged to match them: the forged column no
    longer combines to the block checksum, so the partial read refuses it."""
    path, _ = saved
    ci, _ = decode(open(os.path.join(path, INDEX_NAME), "rb").read())
    off = int(ci.chunks.offset[0])
    flip_byte(os.path.join(path, DATA), off + 4 * SUB_BLOCK_SIZE + 17, 0x40)
    with open(os.path.join(path, DATA), "rb") as f:
        f.seek(off + 4 * SUB_BLOCK_SIZE)
        forged = crc32c(f.read(SUB_BLOCK_SIZE))
    sums = ci.chunks.sub.checksums.copy()
    sums[4] = forged
    _rewrite_index(path, sub=SubBlocks(SUB_BLOCK_SIZE, sums, ci.chunks.sub.start))
    with pytest.raises(shardsafe.CorruptCheckpointError) as e:
        _read(path, 3 * SUB + 100, 2 * SUB)
    assert e.value.file == DATA and e.value.key == "big" and "do not combine" in str(e.value)


def test_a_checkpoint_without_sub_blocks_reads_whole_blocks(saved):
    path, big = saved
    _rewrite_index(path, sub=None)
    assert read_index(LocalStorage(), path).tensors[0].chunks[0].sub_checksums == ()
    lo, n = 3 * SUB + 100, 2 * SUB
    got, read = _read(path, lo, n)
    assert np.array_equal(got, big[lo : lo + n].numpy()) and read == 16 << 20


def test_a_piece_across_two_blocks_checks_both_blocks(saved):
    path, big = saved
    lo = (16 << 20) // 4 - 100
    got, read = _read(path, lo, 200)
    assert np.array_equal(got, big[lo : lo + 200].numpy()) and read == 2 * SUB_BLOCK_SIZE
