"""shardsafe.dcp.Stager as dcp.async_save's async_stager: a training-safe copy in reused
buffers, with Writer and with DCP's own FileSystemWriter; the staging budget."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers import clone_state, mutate_state, same
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

import shardsafe
from shardsafe.dcp import Reader, Stager, Writer


def _state(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(256, 64, generator=g), "b": torch.randn(64, generator=g).to(torch.bfloat16),
                      "t": torch.randn(8, 16, generator=g).t(), "e": torch.zeros(0, 3)},
            "optim": {"state": {0: {"step": torch.tensor(3.0), "m": torch.randn(64, generator=g)}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
            "step": 7, "hist": [1, 2.5]}


@pytest.mark.parametrize("writer", ["shardsafe", "dcp"])
def test_async_save_with_the_stager_is_training_safe(tmp_path, writer: str) -> None:  # noqa: ANN001
    stager = Stager()
    for step in range(3):  # the same layout each time: the buffers are reused
        path = str(tmp_path / f"step{step}")
        sd = _state(step)
        want = clone_state(sd)
        w = Writer(path) if writer == "shardsafe" else FileSystemWriter(path)
        fut = dcp.async_save(sd, storage_writer=w, async_stager=stager)
        mutate_state(sd)  # at once: staging is complete when async_save returns
        fut.result()
        got = _state(99)
        dcp.load(got, storage_reader=Reader(path) if writer == "shardsafe" else FileSystemReader(path))
        assert same(got, want), step
    assert stager.allocations == 1 and stager.nbytes > 256 * 64 * 4
    stager.close()
    assert stager.nbytes == 0


def test_stage_returns_views_of_reused_memory() -> None:
    stager = Stager()
    sd = _state()
    staged = stager.stage(sd)
    assert same(staged, sd) and staged["model"]["w"].data_ptr() != sd["model"]["w"].data_ptr()
    assert staged["hist"] is not sd["hist"] and staged["optim"]["state"][0]["step"].shape == ()
    ptr = staged["model"]["w"].data_ptr()
    del staged  # the save that used it is done
    again = stager.stage(_state(1))
    assert again["model"]["w"].data_ptr() == ptr and same(again, _state(1))


def test_a_save_still_writing_gets_a_second_image_or_waits() -> None:
    sd = _state()
    stager = Stager()
    first = stager.stage(sd)
    second = stager.stage(_state(1))  # first is still held (being written): another image
    assert first["model"]["w"].data_ptr() != second["model"]["w"].data_ptr()
    assert same(first, sd) and stager.peak_nbytes == stager.nbytes
    one = stager.nbytes // 2
    tight = Stager(max_staging_bytes=one + 4096, timeout=5)
    held = tight.stage(sd)
    threading.Timer(0.3, lambda: held.clear()).start()  # the write ends, DCP drops its copy
    got = tight.stage(_state(2))  # waits for the buffers instead of exceeding the budget
    assert same(got, _state(2)) and tight.peak_nbytes <= one + 4096
    stuck = Stager(max_staging_bytes=one + 4096, timeout=0.2)
    keep = stuck.stage(sd)
    with pytest.raises(shardsafe.CheckpointTimeoutError, match="still used"):
        stuck.stage(sd)
    assert keep


def test_a_state_larger_than_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="more than max_staging_bytes=4096"):
        dcp.async_save(_state(), storage_writer=Writer("unused"), async_stager=Stager(max_staging_bytes=4096))
    with pytest.raises(ValueError, match="max_staging_bytes"):
        Stager(max_staging_bytes=0)
