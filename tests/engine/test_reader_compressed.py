"""Reading compressed chunks: whole chunks decode block by block into the target; a piece
(resharded load) decodes only the blocks that hold it; damage is named by file and key."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import flip_byte

import shardsafe
from shardsafe.engine.commit import read_index
from shardsafe.engine.save.units import BLOCK_SIZE
from shardsafe.engine.load.reader import ChunkReader, ReadJob
from shardsafe.plan.layout import block_file_name
from shardsafe.storage.local import LocalStorage

BLOCKS = block_file_name(0)
ROWS, COLS = 2560, 1024  # the tensor has 2 * ROWS rows of float32: 20 MiB, two 16 MiB blocks


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(2 * ROWS, COLS, generator=g) * 0.02).to(torch.float32)
    assert w.nbytes > BLOCK_SIZE
    path = str(tmp_path_factory.mktemp("c") / "ckpt")
    shardsafe.save({"w": w}, path, compression="auto")
    return path, w


def _read_rows(path: str, lo: int, hi: int) -> torch.Tensor:
    index = read_index(LocalStorage(), path)
    entry = index.tensors[0]
    out = torch.zeros(hi - lo, COLS)
    ChunkReader(LocalStorage(), path, index).run(
        [ReadJob(entry, out.view(-1).view(torch.uint8).numpy(), (lo, 0), (hi - lo, COLS))])
    return out


def test_whole_and_partial_reads_are_exact(saved) -> None:
    path, w = saved
    (c,) = read_index(LocalStorage(), path).tensors[0].chunks
    assert c.stored is not None and len(c.stored.sizes) == 2 and c.stored.nbytes < c.nbytes
    assert torch.equal(shardsafe.load(path)["w"], w)
    for lo, hi in [(0, 10), (4000, 5120), (100, 5000), (4095, 4097)]:
        assert torch.equal(_read_rows(path, lo, hi), w[lo:hi]), (lo, hi)


def test_a_piece_decodes_only_the_blocks_it_needs(saved, tmp_path) -> None:
    src, w = saved
    path = str(tmp_path / "copy")
    os.mkdir(path)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(path, name), "wb") as g:
            g.write(f.read())
    (c,) = read_index(LocalStorage(), path).tensors[0].chunks
    flip_byte(os.path.join(path, BLOCKS), c.offset + c.stored.sizes[0] // 2)  # damage block 0 only
    last_rows = (2 * ROWS - 100, 2 * ROWS)  # all in block 1 (rows from 4096 on)
    assert torch.equal(_read_rows(path, *last_rows), w[last_rows[0]:])
    with pytest.raises(shardsafe.CorruptCheckpointError, match="block 0") as e:
        _read_rows(path, 0, 10)
    assert (e.value.file, e.value.key) == (BLOCKS, "w")
    with pytest.raises(shardsafe.CorruptCheckpointError):
        shardsafe.load(path)


def test_read_of_a_missing_block_file_names_it(saved, tmp_path) -> None:
    src, _ = saved
    path = str(tmp_path / "copy")
    os.mkdir(path)
    for name in os.listdir(src):
        if name != BLOCKS:
            with open(os.path.join(src, name), "rb") as f, open(os.path.join(path, name), "wb") as g:
                g.write(f.read())
    with pytest.raises(shardsafe.CorruptCheckpointError) as e:
        shardsafe.load(path)
    assert (e.value.file, e.value.key) == (BLOCKS, "w")
