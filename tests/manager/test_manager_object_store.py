"""The manager on an object-store-like backend (fsspec ``memory://``: no atomic rename):
retention, restore, cleanup of an uncommitted prefix, and a corrupt step deleted rather
than moved aside."""

from __future__ import annotations

import uuid

import pytest
import torch

import fsspec

from shardsafe import CheckpointManager
from shardsafe.api.load import read_checkpoint_index


def state(step: int) -> dict:
    return {"w": torch.full((1000,), float(step)), "b": torch.arange(10) * step, "step": step}


@pytest.fixture
def root() -> str:
    url = f"memory://shardsafe-manager-{uuid.uuid4().hex[:8]}/ckpt"
    yield url
    fsspec.filesystem("memory").rm(url.split("://", 1)[1].split("/")[0], recursive=True)


def test_save_retain_restore(root) -> None:
    with CheckpointManager(root, max_to_keep=2) as mgr:
        for s in range(4):
            mgr.save(s, state(s), metrics={"loss": 1.0 / (s + 1)})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [2, 3] and mgr.metrics(3) == {"loss": 0.25}
        out = state(0)
        assert mgr.restore(out) == 3 and torch.equal(out["w"], state(3)["w"]) and out["step"] == 3


def test_uncommitted_prefix_is_cleaned_and_corrupt_step_dropped(root, caplog) -> None:
    fs = fsspec.filesystem("memory")
    with CheckpointManager(root) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
    base = root.split("://", 1)[1]
    fs.pipe(f"{base}/step_00000003/data-r00000-000.safetensors", b"half an upload")
    with CheckpointManager(root) as mgr:
        assert not fs.exists(f"{base}/step_00000003")  # a crashed upload, removed at start
        index = read_checkpoint_index(f"{root}/step_00000002")
        chunk = index.tensors[0].chunks[0]
        path = f"{base}/step_00000002/{chunk.file}"
        data = bytearray(fs.cat(path))
        data[chunk.offset + 3] ^= 0xFF
        fs.pipe(path, bytes(data))
        out = state(0)
        assert mgr.restore(out) == 1 and torch.equal(out["w"], state(1)["w"])
        assert mgr.all_steps() == [1]  # no rename on object stores: the corrupt step is deleted
        assert mgr.save(2, state(2))
