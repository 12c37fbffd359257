"""load(..., cast=True): floating-point values saved in one dtype restore into a target of
another (as ``nn.Module.load_state_dict`` does); everything else is still refused, and a
skipped key is listed by its key path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import shardsafe


def _fp32_checkpoint(path: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4))
    shardsafe.save({"model": model, "step": torch.tensor(7), "z": torch.ones(2, dtype=torch.complex64)}, path)
    return model


def _bf16_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)).to(torch.bfloat16)


def test_a_dtype_change_is_refused_with_the_way_to_opt_in(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    _fp32_checkpoint(path)
    target = {"model": _bf16_model(), "step": torch.tensor(0), "z": torch.zeros(2, dtype=torch.complex64)}
    before = target["model"][0].weight.detach().clone()
    with pytest.raises(shardsafe.StateMismatchError) as info:
        shardsafe.load(path, target)
    assert ("model.0.weight: target bfloat16[8, 16], checkpoint float32[8, 16] (pass cast=True to "
            "convert floating-point values to the target's dtype)") in str(info.value)
    assert torch.equal(target["model"][0].weight, before)  # nothing was touched


def test_cast_converts_floats_like_load_state_dict(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    saved = _fp32_checkpoint(path)
    model = _bf16_model()
    reference = _bf16_model()
    reference.load_state_dict(saved.state_dict())  # what torch itself does with the dtype change
    result = shardsafe.load(path, {"model": model, "step": torch.tensor(0),
                                   "z": torch.zeros(2, dtype=torch.complex64)}, cast=True)
    assert result.mismatched == [] and result.problems == []
    for name, p in model.state_dict().items():
        assert p.dtype == torch.bfloat16
        assert torch.equal(p, reference.state_dict()[name]), name


def test_cast_is_bit_exact_where_the_dtype_matches(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    w = torch.randn(1000, dtype=torch.float32)
    w[:3] = torch.tensor([float("nan"), -0.0, float("inf")])
    shardsafe.save({"w": w, "h": torch.randn(10, dtype=torch.float16)}, path)
    target = {"w": torch.zeros(1000), "h": torch.zeros(10, dtype=torch.float32)}
    shardsafe.load(path, target, cast=True)
    assert target["w"].view(torch.int32).equal(w.view(torch.int32))
    assert target["h"].dtype == torch.float32


@pytest.mark.parametrize("saved, target", [
    (torch.arange(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int32)),      # integers never
    (torch.arange(4.0), torch.zeros(4, dtype=torch.int64)),                       # float -> int
    (torch.arange(4, dtype=torch.int32), torch.zeros(4, dtype=torch.float32)),     # int -> float
    (torch.ones(4, dtype=torch.complex64), torch.zeros(4, dtype=torch.complex128)),  # complex
    (torch.ones(4, dtype=torch.bool), torch.zeros(4, dtype=torch.uint8)),
])
def test_cast_never_crosses_kinds_nor_touches_integers(tmp_path, saved, target) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    shardsafe.save({"x": saved}, path)
    before = target.clone()
    with pytest.raises(shardsafe.StateMismatchError,
                       match=r"x: target .*\(cast=True converts only between floating-point dtypes\)"):
        shardsafe.load(path, {"x": target}, cast=True)
    assert torch.equal(target, before)


def test_strict_false_lists_key_paths_and_the_reasons_apart(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    _fp32_checkpoint(path)
    model = _bf16_model()
    before = model[1].bias.detach().clone()
    result = shardsafe.load(path, {"model": model, "step": torch.tensor(0), "extra": torch.zeros(1)},
                            strict=False)
    assert "model.0.weight" in result.mismatched
    assert result.mismatched == ["model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias"]
    assert result.missing == ["extra"] and result.unexpected == ["z"]
    assert len(result.problems) == 6
    assert "mismatch: model.1.bias: target bfloat16[4], checkpoint float32[4] (pass cast=True" \
        in "\n".join(result.problems)
    assert torch.equal(model[1].bias, before)


def test_numpy_targets_and_bfloat16_sources(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    w = torch.randn(5, 3)
    shardsafe.save({"w": w, "b": w.to(torch.bfloat16)}, path)
    target = {"w": np.zeros((5, 3), np.float16), "b": np.zeros((5, 3), np.float32)}
    shardsafe.load(path, target, cast=True)
    assert np.array_equal(target["w"], w.numpy().astype(np.float16))
    assert np.array_equal(target["b"], w.to(torch.bfloat16).float().numpy())


def test_cast_needs_a_torch_or_numpy_target(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.ones(2)}, path)
    with pytest.raises(ValueError, match="cast=True converts into the dtypes of a torch or numpy target"):
        shardsafe.load(path, cast=True)


def test_manager_restore_casts(tmp_path) -> None:  # noqa: ANN001
    saved = torch.randn(6, 2)
    with shardsafe.CheckpointManager(str(tmp_path / "run")) as mgr:
        mgr.save(3, {"w": saved})
    with shardsafe.CheckpointManager(str(tmp_path / "run"), read_only=True) as mgr:
        target = {"w": torch.zeros(6, 2, dtype=torch.bfloat16)}
        with pytest.raises(shardsafe.StateMismatchError, match="pass cast=True"):
            mgr.restore(target, 3)
        assert mgr.restore(target, cast=True) == 3
    assert torch.equal(target["w"], saved.to(torch.bfloat16))
