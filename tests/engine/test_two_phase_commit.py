"""The store-based two-phase commit refuses parts that do not cover every tensor.

The save runs through the real phases (``pipeline.prepare``, ``begin``, ``FileWrite`` to
disk, ``pipeline.commit_save``) with a store channel, so the commit goes through
``engine.two_phase_commit`` exactly as a collective save's coordinator does; only the
plan of this rank's data file is cut short, as a planner bug would leave it.
"""

from __future__ import annotations

import os

import pytest
import torch

import shardsafe
from shardsafe.comm import LocalChannel
from shardsafe.engine import pipeline
from shardsafe.engine.commit import is_committed
from shardsafe.engine.prepared import BLOCK_SIZE, UNIT_SIZE, PreparedSave
from shardsafe.engine.staging import host_sources
from shardsafe.engine.units import FileUnits
from shardsafe.engine.writer import FileWrite
from shardsafe.errors import CheckpointError
from shardsafe.plan.layout import data_file_name, plan_file


def _state() -> dict:
    return {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, 5, dtype=torch.int64)}


def _collective_save(path: str, *, drop_last_item: bool) -> PreparedSave:
    """Saves ``_state()`` through the store-based commit; optionally loses tensor "b"."""
    prep = pipeline.prepare(_state(), path)
    prep.channel, prep.timeout = LocalChannel(), 10.0  # the coordinator's side of the store
    if drop_last_item:
        items = prep.plans[0].items
        prep.plans = [plan_file(data_file_name(0), items[:-1])]
    pipeline.begin(prep)
    sums = []
    for plan in prep.plans:
        fw = FileWrite(FileUnits(plan, UNIT_SIZE, BLOCK_SIZE), prep.storage, prep.file_path(plan),
                       sources=host_sources(plan, device=False))
        fw.start()
        fw.all_ready()
        sums.append(fw.finish())
    try:
        pipeline.commit_save(prep, sums)
    except BaseException as e:
        pipeline.abort(prep, e)
        raise
    return prep


def test_complete_parts_commit(tmp_path) -> None:
    path = str(tmp_path / "ok")
    prep = _collective_save(path, drop_last_item=False)
    assert is_committed(prep.storage, path)
    got = shardsafe.load(path)
    assert torch.equal(got["a"], _state()["a"]) and torch.equal(got["b"], _state()["b"])


def test_a_tensor_without_chunks_is_never_committed(tmp_path) -> None:
    path = str(tmp_path / "lost")
    with pytest.raises(CheckpointError, match=r"chunks of 'b' hold 0 elements.*needs 15"):
        _collective_save(path, drop_last_item=True)
    assert not os.path.exists(path)  # neither committed nor left half-written at the final path
    assert os.listdir(tmp_path) == []  # the working directory is gone too
