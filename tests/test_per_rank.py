"""PerRank in one process (world size 1); the multi-rank cases are in tests/distributed."""

from __future__ import annotations

import pytest
import torch

import shardsafe


def test_single_process_saves_rank_zero_and_restores_it(tmp_path) -> None:  # noqa: ANN001
    torch.manual_seed(3)
    path = str(tmp_path / "ck")
    shardsafe.save({"rng": shardsafe.PerRank(shardsafe.RNGState()),
                    "d": shardsafe.PerRank({"n": 1, "t": torch.arange(3)})}, path)
    want = torch.rand(2)
    assert sorted(shardsafe.load(path)["d"]) == ["0"]
    torch.manual_seed(4)
    d: dict = {"n": 0}
    shardsafe.load(path, {"rng": shardsafe.PerRank(shardsafe.RNGState()), "d": shardsafe.PerRank(d)})
    assert torch.equal(torch.rand(2), want)
    assert d["n"] == 1 and torch.equal(d["t"], torch.arange(3))


def test_missing_rank_raises_or_keeps() -> None:
    d = {"n": 5}
    with pytest.raises(shardsafe.StateMismatchError, match="not rank 0"):
        shardsafe.PerRank(d).load_state_dict({"1": {"n": 1}})
    shardsafe.PerRank(d, missing="keep").load_state_dict({"1": {"n": 1}})
    assert d == {"n": 5}
    with pytest.raises(ValueError):
        shardsafe.PerRank(d, missing="first")
    with pytest.raises(TypeError):
        shardsafe.PerRank(3)


def test_checkpoint_without_this_rank_is_a_mismatch_unless_kept(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ck")
    shardsafe.save({"d": {"1": {"n": 1}}}, path)  # as if saved by ranks 0..1 without rank 0
    with pytest.raises(shardsafe.StateMismatchError, match="missing in checkpoint: d.0"):
        shardsafe.load(path, {"d": shardsafe.PerRank({"n": 0})})
    d = {"n": 0}
    shardsafe.load(path, {"d": shardsafe.PerRank(d, missing="keep")})
    assert d == {"n": 0}
