"""engine.detach: a step's references become hard links of its own, its index names them."""

from __future__ import annotations

import os

import pytest
from helpers import assert_same, incremental_steps

import shardsafe
from shardsafe.engine.commit import read_index
from shardsafe.engine.detach import detach
from shardsafe.errors import CorruptCheckpointError
from shardsafe.storage import LocalStorage

DATA = "data-r00000-000.safetensors"


def test_detached_step_loads_alone_and_shares_the_bytes(tmp_path) -> None:
    state = incremental_steps(tmp_path)
    step3 = tmp_path / "step_00000003"
    assert detach(LocalStorage(), str(step3)) == [f"step_00000001/{DATA}"]
    index = read_index(LocalStorage(), str(step3))
    assert [f.reference for f in index.files] == [None, None]
    linked = next(f.name for f in index.files if f.name.startswith("ref"))
    assert os.stat(step3 / linked).st_ino == os.stat(tmp_path / "step_00000001" / DATA).st_ino
    assert detach(LocalStorage(), str(step3)) == []  # nothing left to detach
    os.rename(step3, tmp_path.parent / "moved")
    got = shardsafe.load(str(tmp_path.parent / "moved"))
    assert_same(got, state)


def test_detach_again_after_a_crash_before_the_index(tmp_path) -> None:
    incremental_steps(tmp_path)
    step2 = tmp_path / "step_00000002"
    os.link(tmp_path / "step_00000001" / DATA, step2 / f"ref00001-{DATA}")  # a link made, then a crash
    detach(LocalStorage(), str(step2))
    assert shardsafe.load(str(step2))["head"][0] == 2


def test_detach_refuses_a_missing_or_resized_reference(tmp_path) -> None:
    incremental_steps(tmp_path)
    with open(tmp_path / "step_00000001" / DATA, "ab") as f:
        f.write(b"x")
    with pytest.raises(CorruptCheckpointError, match="bytes"):
        detach(LocalStorage(), str(tmp_path / "step_00000002"))
    os.remove(tmp_path / "step_00000001" / DATA)
    with pytest.raises(CorruptCheckpointError, match="missing"):
        detach(LocalStorage(), str(tmp_path / "step_00000002"))
