"""Tied and aliased tensors are stored once and come back tied (new dict, mmap, in place)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

import shardsafe
from shardsafe.api.load import read_checkpoint_index


class TiedLM(nn.Module):
    def __init__(self, tied: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.body = nn.Linear(16, 16)
        self.lm_head = nn.Linear(16, 50, bias=False)
        if tied:
            self.lm_head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.body(self.embed(x))))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 50, (8, 5), generator=g)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, 50), x.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _trained(seed: int = 0) -> tuple[TiedLM, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TiedLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, 3, seed)
    return model, opt


def _data_bytes(path: str) -> int:
    return sum(f.size - f.data_start for f in read_checkpoint_index(path).files)


def test_tied_weights_are_stored_once(tmp_path) -> None:
    model, opt = _trained()
    path = str(tmp_path / "ckpt")
    shardsafe.save({"model": model, "optim": opt}, path)
    index = read_checkpoint_index(path)
    keys = [t.key for t in index.tensors]
    assert ("model", "embed.weight") in keys and ("model", "lm_head.weight") not in keys
    model_node = index.tree["v"][index.tree["k"].index("model")]
    head = model_node["v"][model_node["k"].index("lm_head.weight")]
    assert head == {"t": "alias", "id": keys.index(("model", "embed.weight"))}
    # the same state untied holds the weight twice
    untied = {k: v.clone() for k, v in model.state_dict().items()}
    shardsafe.save({"model": untied, "optim": opt}, str(tmp_path / "untied"))
    assert _data_bytes(str(tmp_path / "untied")) - _data_bytes(path) == 50 * 16 * 4


@pytest.mark.parametrize("mmap", [False, True])
def test_load_as_new_dict_returns_one_tensor_at_both_paths(tmp_path, mmap: bool) -> None:
    model, opt = _trained()
    path = str(tmp_path / "ckpt")
    shardsafe.save({"model": model, "optim": opt}, path)
    got = shardsafe.load(path, mmap=mmap)
    assert got["model"]["lm_head.weight"] is got["model"]["embed.weight"]
    assert torch.equal(got["model"]["embed.weight"], model.embed.weight.detach())
    # and it can be saved again, still once
    shardsafe.save(got, str(tmp_path / "again"))
    assert _data_bytes(str(tmp_path / "again")) == _data_bytes(path)


def test_in_place_into_a_tied_model_then_training_continues_exactly(tmp_path) -> None:
    model, opt = _trained(seed=1)
    path = str(tmp_path / "ckpt")
    shardsafe.save({"model": model, "optim": opt}, path)
    want = _train(model, opt, 3, seed=7)

    torch.manual_seed(99)  # different initial weights
    fresh = TiedLM()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    weight = fresh.embed.weight
    shardsafe.load(path, {"model": fresh, "optim": fresh_opt})
    assert fresh.embed.weight is weight and fresh.lm_head.weight is weight  # still tied, same memory
    assert _train(fresh, fresh_opt, 3, seed=7) == want
    assert torch.equal(fresh.embed.weight, model.embed.weight)


def test_in_place_into_an_untied_model_fills_both(tmp_path) -> None:
    model, _ = _trained()
    path = str(tmp_path / "ckpt")
    shardsafe.save({"model": model}, path)
    target = TiedLM(tied=False)
    shardsafe.load(path, {"model": target})
    assert target.lm_head.weight is not target.embed.weight
    assert torch.equal(target.lm_head.weight, model.embed.weight)
    assert torch.equal(target.embed.weight, model.embed.weight)


def test_an_untied_checkpoint_loads_into_a_tied_model_only_if_the_values_agree(tmp_path) -> None:
    # the checkpoint's two tensors are both read into the one shared weight: the last wins,
    # as with load_state_dict; equal values (a tied model saved untied) give the exact result
    model, _ = _trained()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    shardsafe.save({"model": sd}, str(tmp_path / "ckpt"))
    target = TiedLM()
    shardsafe.load(str(tmp_path / "ckpt"), {"model": target})
    assert torch.equal(target.embed.weight, model.embed.weight) and target.lm_head.weight is target.embed.weight


def test_only_identical_views_are_aliases(tmp_path) -> None:
    base = torch.arange(12.0)
    arr = np.arange(6)
    state = {"a": base, "b": base.view(12), "c": base.view(3, 4), "d": base[2:], "e": base.view(torch.int32),
             "conj": torch.ones(2, dtype=torch.complex64), "n": arr, "n2": arr[:], "n3": arr.reshape(2, 3),
             "empty1": torch.empty(0), "empty2": torch.empty(0)}
    state["conj2"] = state["conj"].conj()
    path = str(tmp_path / "ckpt")
    shardsafe.save(state, path)
    got = shardsafe.load(path)
    assert got["b"] is got["a"] and got["n2"] is got["n"]
    for k in ("c", "d", "e", "conj2", "n3", "empty2"):
        assert got[k] is not got[{"n3": "n", "conj2": "conj", "empty2": "empty1"}.get(k, "a")], k
    assert torch.equal(got["conj2"], state["conj2"].resolve_conj())
    assert [k for (k,) in (t.key for t in read_checkpoint_index(path).tensors)] == [
        "a", "c", "d", "e", "conj", "n", "n3", "empty1", "empty2", "conj2"]


def test_a_forged_alias_to_no_tensor_is_refused(tmp_path) -> None:
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "format"))
    from forge_index import read_raw, write_raw

    path = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.ones(2), "x": 1}, path)
    for bad in ({"t": "alias", "id": 1}, {"t": "alias", "id": -1}, {"t": "alias", "id": True},
                {"t": "alias"}):
        raw = read_raw(path)
        raw["tree"]["v"][1] = bad
        write_raw(path, raw)
        with pytest.raises(shardsafe.CorruptCheckpointError):
            shardsafe.load(path)
