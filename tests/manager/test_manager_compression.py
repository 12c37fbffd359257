"""CheckpointManager(..., compression=...): saves compressed, restores, refuses bad values;
with incremental=True, unchanged compressed chunks are referenced with their coding."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import flip_byte

import shardsafe
from shardsafe.cli import main as cli_main
from shardsafe.format.blockfile import MAGIC
from shardsafe.manager.lock import LOCK_NAME
from shardsafe.plan.layout import block_file_name

BLOCKS = block_file_name(0)


def test_manager_saves_compressed_and_restores(tmp_path) -> None:
    state = {"w": (torch.randn(300, 200) * 0.02).to(torch.bfloat16), "step": 0}
    with shardsafe.CheckpointManager(tmp_path / "run", compression="auto") as mgr:
        mgr.save(1, state)
        mgr.wait_until_finished()
        assert os.path.exists(tmp_path / "run" / "step_00000001" / BLOCKS)
        target = {"w": torch.zeros(300, 200, dtype=torch.bfloat16), "step": -1}
        assert mgr.restore(target) == 1
    assert torch.equal(target["w"], state["w"]) and target["step"] == 0
    with pytest.raises(ValueError, match="compression"):
        shardsafe.CheckpointManager(tmp_path / "run2", compression="lz4")


def _state(step: int, base: torch.Tensor, frozen_small: torch.Tensor) -> dict:
    """A frozen compressible base (block file), a changing adapter large enough to be
    compressed too, and a small frozen tensor that stays raw in the safetensors file."""
    return {"base": base, "small": frozen_small, "step": step,
            "adapter": torch.arange(32_768, dtype=torch.float32) * (step + 1)}


def _files_of(path) -> list[str]:  # noqa: ANN001
    from shardsafe.engine.commit import read_index
    from shardsafe.storage import LocalStorage
    return [f.name for f in read_index(LocalStorage(), str(path)).files]


def _disk_bytes(root) -> int:  # noqa: ANN001
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs
               if f != LOCK_NAME)


@pytest.mark.parametrize("async_save", [False, True])
def test_incremental_references_compressed_chunks(tmp_path, async_save: bool) -> None:
    g = torch.Generator().manual_seed(5)
    base = (torch.randn(2048, 1024, generator=g) * 0.02).to(torch.bfloat16)  # 4 MiB raw
    small = torch.arange(100)
    shardsafe.save({"base": base}, str(tmp_path / "alone"), compression="auto")
    coded_base = os.path.getsize(tmp_path / "alone" / BLOCKS)
    assert coded_base < 0.9 * base.nbytes  # the base really is stored compressed
    run = tmp_path / "run"
    with shardsafe.CheckpointManager(run, max_to_keep=3, incremental=True, compression="auto",
                                     async_save=async_save) as mgr:
        for step in range(10):
            mgr.save(step, _state(step, base, small))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [7, 8, 9]
    # the compressed base is stored once (in step 0's block file), not once per kept step
    assert _disk_bytes(run) < 1.25 * coded_base
    assert os.path.exists(run / "step_00000000" / BLOCKS)
    for step in (7, 8, 9):
        path = run / f"step_{step:08d}"
        names = _files_of(path)
        assert f"step_00000000/{BLOCKS}" in names  # the base: referenced, with its coding
        assert "step_00000000/data-r00000-000.safetensors" in names  # the small frozen tensor
        assert BLOCKS in names  # this step's adapter: written, compressed
        out = shardsafe.load(str(path))  # bit-exact, every block checked before and after decoding
        assert torch.equal(out["base"], base) and torch.equal(out["small"], small)
        assert torch.equal(out["adapter"], _state(step, base, small)["adapter"]) and out["step"] == step
    assert cli_main(["verify", str(run)]) == 0
    # a flipped byte in the referenced block file is caught when loading a later step
    flip_byte(run / "step_00000000" / BLOCKS, len(MAGIC) + 1000, 0x01)
    with pytest.raises(shardsafe.CorruptCheckpointError, match="checksum"):
        shardsafe.load(str(run / "step_00000009"))
    assert cli_main(["verify", str(run / "step_00000008")]) == 1


def test_retention_keeps_referenced_block_files(tmp_path) -> None:
    base = (torch.randn(512, 256) * 0.02).to(torch.bfloat16)
    small = torch.arange(10)
    run = tmp_path / "run"
    with shardsafe.CheckpointManager(run, max_to_keep=1, incremental=True, compression="auto") as mgr:
        for step in range(3):
            mgr.save(step, _state(step, base, small))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [2]
        # step 0 is no checkpoint any more, but step 2 references both of its data files
        assert sorted(os.listdir(run / "step_00000000")) == sorted([BLOCKS, "data-r00000-000.safetensors"])
        assert not os.path.exists(run / "step_00000001")
        assert torch.equal(shardsafe.load(str(run / "step_00000002"))["base"], base)
        mgr.delete(2)  # the baseline's step is gone: the next save writes everything again
        mgr.save(3, _state(3, base, small))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [3]
    # steps 1 and 2 referenced step 0's block file; step 3 wrote its own, so sweeps removed all
    assert [n for n in os.listdir(run) if n != LOCK_NAME] == ["step_00000003"]
    assert sorted(os.listdir(run / "step_00000003")) == sorted(_files_of(run / "step_00000003") + ["index.json"])
    out = shardsafe.load(str(run / "step_00000003"))
    assert torch.equal(out["base"], base) and out["step"] == 3


def test_incremental_compressed_memory_round_trip() -> None:
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://incr-compress-{os.getpid()}/run"
    base = (torch.randn(512, 256) * 0.02).to(torch.bfloat16)
    try:
        with shardsafe.CheckpointManager(url, max_to_keep=2, incremental=True, compression="zstd") as mgr:
            for step in range(4):
                mgr.save(step, _state(step, base, torch.arange(3)))
            mgr.wait_until_finished()
        root = url.split("://", 1)[1]
        assert sorted(p.rsplit("/", 1)[1] for p in fs_ls(fsspec, f"{root}/step_00000000")) == sorted(
            [BLOCKS, "data-r00000-000.safetensors"])
        out = shardsafe.load(f"{url}/step_00000003")
        assert torch.equal(out["base"], base) and out["step"] == 3
    finally:
        fsspec.filesystem("memory").rm(url.split("://", 1)[1].split("/")[0], recursive=True)


def fs_ls(fsspec, path: str) -> list[str]:  # noqa: ANN001
    return fsspec.filesystem("memory").ls(path, detail=False)
