"""Block files: coded in a bounded window on the I/O pool, split into parts once large."""

from __future__ import annotations

import os

import pytest
import torch

import shardsafe
from shardsafe.engine import block_writer
from shardsafe.engine.commit import read_index
from shardsafe.plan.layout import block_file_name
from shardsafe.storage.local import LocalStorage


def _state() -> dict:
    g = torch.Generator().manual_seed(2)
    return {f"w{i}": (torch.randn(256, 256, generator=g) * 0.02).to(torch.bfloat16) for i in range(3)}


@pytest.mark.parametrize("how", ["sync", "async"])
def test_large_block_files_are_written_in_parts(tmp_path, monkeypatch, how) -> None:
    monkeypatch.setattr(block_writer, "PART_BYTES", 1)  # every item closes its part
    monkeypatch.setattr(block_writer, "WINDOW_PER_THREAD", 1)
    state, path = _state(), str(tmp_path / "ckpt")
    if how == "sync":
        shardsafe.save(state, path, compression="zstd")
    else:
        shardsafe.async_save(state, path, compression="zstd").result()
    index = read_index(LocalStorage(), path)
    parts = [block_file_name(0, k) for k in range(3)]
    assert sorted(f.name for f in index.files if f.name.endswith(".blocks")) == parts
    assert sorted(t.chunks[0].file for t in index.tensors) == parts
    got = shardsafe.load(path)
    assert all(torch.equal(got[k], v) for k, v in state.items())
    assert sorted(os.listdir(path)) == sorted(parts + ["data-r00000-000.safetensors", "index.json"])


def test_a_failing_write_leaves_no_checkpoint(tmp_path, monkeypatch) -> None:
    def refuse(self, path, buffers):  # noqa: ANN001
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(LocalStorage, "write", refuse)
    path = str(tmp_path / "ckpt")
    with pytest.raises(OSError, match="No space left") as e:
        shardsafe.save(_state(), path, compression="zstd")
    assert block_file_name(0) in str(e.value)
    assert not os.path.exists(path)
