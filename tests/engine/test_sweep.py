"""engine.sweep: mark and sweep keeps every file a committed checkpoint names."""

from __future__ import annotations

import os

import torch
from helpers import incremental_steps

import shardsafe
from shardsafe.engine.commit import uncommit
from shardsafe.engine.sweep import marked, plan_sweep, retire, sweep
from shardsafe.storage import LocalStorage

DATA = "data-r00000-000.safetensors"


def test_marks_own_files_and_references(tmp_path) -> None:
    incremental_steps(tmp_path)
    m = marked(LocalStorage(), str(tmp_path))
    assert m["step_00000001"] == {"index.json", DATA}
    assert m["step_00000003"] == {"index.json", DATA}


def test_retiring_a_referenced_step_keeps_only_its_referenced_file(tmp_path) -> None:
    state = incremental_steps(tmp_path)
    (tmp_path / "step_00000001" / "stray.tmp").write_bytes(b"x")
    retire(LocalStorage(), str(tmp_path / "step_00000001"))
    assert sorted(os.listdir(tmp_path / "step_00000001")) == [DATA]  # steps 2 and 3 use it
    out = shardsafe.load(str(tmp_path / "step_00000003"))
    assert torch.equal(out["base"], state["base"])
    for s in (2, 3):  # once nothing references it, it goes
        retire(LocalStorage(), str(tmp_path / f"step_{s:08d}"))
    sweep(LocalStorage(), str(tmp_path), ["step_00000001"])
    assert os.listdir(tmp_path) == []


def test_pinned_files_survive(tmp_path) -> None:
    incremental_steps(tmp_path)
    for s in (1, 2, 3):
        uncommit(LocalStorage(), str(tmp_path / f"step_{s:08d}"))
    names = ["step_00000001", "step_00000002", "step_00000003"]
    sweep(LocalStorage(), str(tmp_path), names, pinned=[f"step_00000001/{DATA}"])
    assert os.listdir(tmp_path) == ["step_00000001"]


def test_a_damaged_index_marks_nothing_and_committed_dirs_are_not_swept(tmp_path) -> None:
    incremental_steps(tmp_path)
    (tmp_path / "step_00000003" / "index.json").write_bytes(b"garbage")
    uncommit(LocalStorage(), str(tmp_path / "step_00000002"))
    plan = plan_sweep(LocalStorage(), str(tmp_path), ["step_00000001", "step_00000002", "step_00000003"])
    assert plan == {"step_00000002": ([DATA], [])}  # step 1 and 3 are still committed


def test_dry_run_plan_treats_ignored_checkpoints_as_retired(tmp_path) -> None:
    incremental_steps(tmp_path)
    names = ["step_00000001", "step_00000002"]
    plan = plan_sweep(LocalStorage(), str(tmp_path), names, ignore=names)
    assert plan["step_00000001"] == (["index.json"], [DATA])
    assert plan["step_00000002"] == ([DATA, "index.json"], [])  # step 3 wrote its own head
    assert sorted(os.listdir(tmp_path / "step_00000001")) == [DATA, "index.json"]  # read only
