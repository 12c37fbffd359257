"""engine.save.incremental: exact change detection, references that never chain, round trips."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.api.checkpointer import Checkpointer
from shardsafe.engine.save.request import SaveRequest
from shardsafe.engine.commit import read_index
from shardsafe.engine.save import incremental
from shardsafe.engine.save.incremental import ALGORITHMS, PIECE, Baseline, algorithm, digests
from shardsafe.format.tree import render_path
from shardsafe.plan.flatten import flatten
from shardsafe.storage import LocalStorage

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8,
          torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn]


def _tensor(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype)[: n // 16 * 16 // dtype.itemsize]


def _files(path: str) -> list[str]:
    return [f.name for f in read_index(LocalStorage(), path).files]


@pytest.mark.parametrize("name", ALGORITHMS)
def test_digest_changes_with_any_byte_and_covers_pieces(monkeypatch, name: str) -> None:
    monkeypatch.setattr(incremental, "_chosen", [name])
    x = torch.zeros(PIECE // 4 + 3)  # two pieces
    _, items = flatten({"x": x})
    d0 = digests(items)[0]
    x[-1] = 1.0  # a byte in the second piece
    assert digests(items)[0] != d0
    x[-1] = 0.0
    assert digests(items)[0] == d0 and len(d0) == 32


def test_the_faster_algorithm_is_chosen_once() -> None:
    assert algorithm() in ALGORITHMS and algorithm() == algorithm()


def test_unchanged_chunks_are_referenced_changed_ones_written(tmp_path) -> None:
    state = {"base": torch.randn(256, 64), "head": torch.randn(8), "step": 0}
    b, c = Baseline(), Checkpointer()
    c._saver.submit(SaveRequest(state=state, path=str(tmp_path / "step_00000001"), baseline=b))
    assert b.source == "step_00000001"
    state["head"].add_(1.0)
    c._saver.submit(SaveRequest(state=state, path=str(tmp_path / "step_00000002"), baseline=b))
    assert _files(str(tmp_path / "step_00000002")) == [
        "data-r00000-000.safetensors", "step_00000001/data-r00000-000.safetensors"]
    assert os.path.getsize(tmp_path / "step_00000002" / "data-r00000-000.safetensors") < 8192
    c._saver.submit(SaveRequest(state=state, path=str(tmp_path / "step_00000003"), baseline=b))
    # nothing changed: every chunk is referenced where its bytes really are (no chains)
    assert sorted(_files(str(tmp_path / "step_00000003"))[1:]) == [
        "step_00000001/data-r00000-000.safetensors", "step_00000002/data-r00000-000.safetensors"]
    out = shardsafe.load(str(tmp_path / "step_00000003"))
    assert torch.equal(out["base"], state["base"]) and torch.equal(out["head"], state["head"])
    c.close()


@pytest.mark.parametrize("change", ["shape", "dtype", "same bytes other key"])
def test_only_the_same_chunk_is_referenced(tmp_path, change: str) -> None:
    x = torch.arange(64, dtype=torch.float32)
    b, c = Baseline(), Checkpointer()
    c._saver.submit(SaveRequest(state={"x": x}, path=str(tmp_path / "step_00000001"), baseline=b))
    state = {"shape": {"x": x.reshape(8, 8)}, "dtype": {"x": x.view(torch.int32)},
             "same bytes other key": {"y": x}}[change]
    c._saver.submit(SaveRequest(state=state, path=str(tmp_path / "step_00000002"), baseline=b))
    assert _files(str(tmp_path / "step_00000002")) == ["data-r00000-000.safetensors"]
    c.close()


def test_round_trip_every_dtype_in_place_and_new(tmp_path) -> None:
    state = {f"t{i}": _tensor(dt, 4096, i) for i, dt in enumerate(DTYPES)}
    state["np"] = np.arange(100, dtype=np.float64)
    state["empty"] = torch.empty(0, 3)
    b, c = Baseline(), Checkpointer()
    for step in range(1, 4):
        state["t0"].add_(1.0)  # one tensor changes, the others are referenced
        c._saver.submit(SaveRequest(state=state, path=str(tmp_path / f"step_{step:08d}"), baseline=b,
                                       staging="blocking")).handle.result()
    c.close()
    path = str(tmp_path / "step_00000003")
    # t0 is written anew each step; the rest stays where step 1 wrote it
    assert _files(path) == ["data-r00000-000.safetensors", "step_00000001/data-r00000-000.safetensors"]
    new = shardsafe.load(path)
    mapped = shardsafe.load(path, mmap=True)  # maps the referenced file of step 1 too
    assert torch.equal(mapped["t1"].view(torch.uint8), state["t1"].view(torch.uint8))
    target = {k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else np.zeros_like(v))
              for k, v in state.items()}
    shardsafe.load(path, target)
    for k, v in state.items():
        for got in (new[k], target[k]):
            if isinstance(v, torch.Tensor):
                assert got.dtype == v.dtype and torch.equal(got.view(torch.uint8), v.view(torch.uint8)), k
            else:
                assert np.array_equal(got, v), k


def test_reset_writes_everything(tmp_path) -> None:
    b, c = Baseline(), Checkpointer()
    c._saver.submit(SaveRequest(state={"x": torch.ones(10)}, path=str(tmp_path / "step_00000001"), baseline=b))
    b.reset()
    assert b.source is None and not b.files()
    c._saver.submit(SaveRequest(state={"x": torch.ones(10)}, path=str(tmp_path / "step_00000002"), baseline=b))
    assert _files(str(tmp_path / "step_00000002")) == ["data-r00000-000.safetensors"]
    c.close()


def test_keep_only_if_forgets_a_baseline_whose_step_is_gone(tmp_path) -> None:
    b, c = Baseline(), Checkpointer()
    c._saver.submit(SaveRequest(state={"x": torch.ones(10)}, path=str(tmp_path / "step_00000001"), baseline=b))
    c.close()
    assert not b.keep_only_if(["step_00000001", "step_00000000"]) and b.source == "step_00000001"
    assert b.keep_only_if(["step_00000000"]) and b.source is None and not b.files()


def test_a_save_into_another_directory_references_nothing(tmp_path) -> None:
    b, c = Baseline(), Checkpointer()
    c._saver.submit(SaveRequest(state={"x": torch.ones(10)}, path=str(tmp_path / "a" / "step_00000001"), baseline=b))
    c._saver.submit(SaveRequest(state={"x": torch.ones(10)}, path=str(tmp_path / "b" / "step_00000002"), baseline=b))
    assert _files(str(tmp_path / "b" / "step_00000002")) == ["data-r00000-000.safetensors"]
    c._saver.submit(SaveRequest(state={"x": torch.ones(10)}, path=str(tmp_path / "b" / "step_00000003"), baseline=b))
    assert len(_files(str(tmp_path / "b" / "step_00000003"))) == 2
    c.close()


def test_a_failed_save_does_not_advance_the_baseline(tmp_path) -> None:
    b, c = Baseline(), Checkpointer()
    c._saver.submit(SaveRequest(state={"x": torch.ones(10)}, path=str(tmp_path / "step_00000001"), baseline=b))
    (tmp_path / "step_00000002").mkdir()
    (tmp_path / "step_00000002" / "foreign").write_text("not ours")
    with pytest.raises(shardsafe.CheckpointError):
        c._saver.submit(SaveRequest(state={"x": torch.ones(10)}, path=str(tmp_path / "step_00000002"), baseline=b))
    assert b.source == "step_00000001"
    c.close()


def test_compressed_chunks_are_referenced_with_their_coding(tmp_path) -> None:
    """Baseline.split runs before split_coded: only changed chunks are coded; an unchanged compressed
    chunk is referenced in the block file of the step that wrote it, with its codecs,
    stored sizes and stored CRC32Cs (else reading it would fail its checksums)."""
    g = torch.Generator().manual_seed(1)
    state = {"base": (torch.randn(512, 256, generator=g) * 0.02).to(torch.bfloat16),
             "head": torch.arange(20_000, dtype=torch.float32), "small": torch.ones(4)}
    b, c = Baseline(), Checkpointer()
    c._saver.submit(SaveRequest(state=state, path=str(tmp_path / "step_00000001"), baseline=b, compression="auto"))
    state["head"].add_(1.0)
    c._saver.submit(SaveRequest(state=state, path=str(tmp_path / "step_00000002"), baseline=b, compression="auto"))
    index = read_index(LocalStorage(), str(tmp_path / "step_00000002"))
    assert sorted(f.name for f in index.files) == [
        "data-r00000-000.blocks", "data-r00000-000.safetensors", "step_00000001/data-r00000-000.blocks",
        "step_00000001/data-r00000-000.safetensors"]
    first = read_index(LocalStorage(), str(tmp_path / "step_00000001"))
    by_key = {render_path(t.key): t.chunks[0] for t in first.tensors}
    for t in index.tensors:
        ch = t.chunks[0]
        if render_path(t.key) == "head":
            assert ch.file == "data-r00000-000.blocks" and ch.stored is not None  # rewritten, coded
        else:  # referenced exactly as stored (offset, checksums, coding)
            assert ch.file == "step_00000001/" + by_key[render_path(t.key)].file
            assert (ch.offset, ch.checksums, ch.stored) == (by_key[render_path(t.key)].offset, by_key[render_path(t.key)].checksums,
                                                            by_key[render_path(t.key)].stored)
    assert index.tensors[0].chunks[0].stored is not None  # "base" is compressed
    out = shardsafe.load(str(tmp_path / "step_00000002"))
    assert all(torch.equal(out[k], v) for k, v in state.items())
    c.close()
