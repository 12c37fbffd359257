"""``shardsafe diff``: added/removed/changed keys and the max abs difference per tensor."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from shardsafe.cli.diff import max_abs_diff  # noqa: E402


def test_diff_of_identical_checkpoints_exits_0(cli, tmp_path) -> None:  # noqa: ANN001
    state = {"w": torch.randn(3), "n": float("nan"), "x": torch.tensor([float("nan"), 1.0])}
    shardsafe.save(state, str(tmp_path / "a"))
    shardsafe.save(state, str(tmp_path / "b"))
    proc = cli("diff", tmp_path / "a", tmp_path / "b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "0 difference(s), 3 identical key(s)"


def test_diff_lists_added_removed_and_changed(cli, tmp_path) -> None:  # noqa: ANN001
    w = torch.zeros(4, 4)
    a = {"model": {"w": w, "gone": torch.ones(2), "cast": torch.ones(3)}, "step": 1, "same": torch.ones(2)}
    w2 = w.clone()
    w2[1, 2] = -0.25
    w2[3, 3] = 0.125
    b = {"model": {"w": w2, "new": torch.ones(5, dtype=torch.int8), "cast": torch.ones(3, dtype=torch.float16)},
         "step": 1.0, "same": torch.ones(2)}
    shardsafe.save(a, str(tmp_path / "a"))
    shardsafe.save(b, str(tmp_path / "b"))
    proc = cli("diff", tmp_path / "a", tmp_path / "b")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert "~ model.w  float32[4, 4]  max abs diff 0.25" in lines
    assert "- model.gone  float32[2]" in lines
    assert "+ model.new  int8[5]" in lines
    assert "~ model.cast  float32[3] -> float16[3]" in lines
    assert "~ step  int 1 -> float 1.0" in lines  # types matter: 1 and 1.0 differ
    assert lines[-1] == "5 difference(s), 1 identical key(s)"
    d = json.loads(cli("diff", tmp_path / "a", tmp_path / "b", "--json").stdout)
    by_key = {c["key"]: c for c in d["changes"]}
    assert by_key["model.w"]["max_abs_diff"] == 0.25 and by_key["model.new"]["op"] == "+"
    assert d["identical"] == 1


@pytest.mark.parametrize("a, b, want", [
    ([1.0, 2.0], [1.0, 2.5], 0.5),
    ([float("nan"), 1.0], [float("nan"), 1.0], 0.0),
    ([float("nan"), 1.0], [0.0, 1.0], math.inf),
    ([float("inf")], [float("inf")], 0.0),
    ([float("inf")], [float("-inf")], math.inf),
    ([], [], 0.0),
])
def test_max_abs_diff_table(a, b, want) -> None:  # noqa: ANN001
    assert max_abs_diff(torch.tensor(a), torch.tensor(b)) == want
    assert max_abs_diff(np.array(a), np.array(b)) == want


def test_max_abs_diff_of_bf16_ints_and_complex() -> None:
    assert max_abs_diff(torch.tensor([1.0, 2.0], dtype=torch.bfloat16),
                        torch.tensor([1.0, 3.0], dtype=torch.bfloat16)) == 1.0
    assert max_abs_diff(torch.tensor([5, -3]), torch.tensor([5, 4])) == 7.0
    assert max_abs_diff(torch.tensor([1 + 1j]), torch.tensor([1 + 4j])) == 3.0
