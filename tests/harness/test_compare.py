"""Bit-exact comparison of states and their fingerprints: every kind of difference is
named, a live state equals its checkpoint, a snapshot keeps its moment."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.harness.compare import differences, fingerprint, snapshot, summarize


def test_identical_states_have_no_differences_and_equal_fingerprints() -> None:
    a = {"w": torch.arange(6.0).reshape(2, 3), "n": float("nan"), "t": (1, "x"),
         "arr": np.arange(3, dtype=np.int16), "b": b"\x00"}
    b = {"w": torch.arange(6.0).reshape(2, 3), "n": float("nan"), "t": (1, "x"),
         "arr": np.arange(3, dtype=np.int16), "b": b"\x00"}
    assert differences(a, b) == []
    assert fingerprint(a) == fingerprint(b)


@pytest.mark.parametrize("change,expect", [
    (lambda s: s["w"].view(-1)[4].add_(1e-7), "w: values differ"),
    (lambda s: s.__setitem__("w", s["w"].double()), "w: float32[2, 3] vs float64[2, 3]"),
    (lambda s: s.__setitem__("t", [1, "x"]), "t: tuple of 2 vs list of 2"),
    (lambda s: s.__setitem__("i", 4), "i: 3 vs 4"),
    (lambda s: s.__setitem__("i", 3.0), "i: 3 vs 3.0"),
    (lambda s: s.pop("i"), "i: only in the first state"),
    (lambda s: s["rng"].__setitem__(5, 0), "rng: 1 of 20 values differ"),
])
def test_every_kind_of_difference_is_named(change, expect) -> None:
    def make() -> dict:
        return {"w": torch.linspace(0, 1, 6).reshape(2, 3), "t": (1, "x"), "i": 3,
                "rng": list(range(1, 21))}

    a, b = make(), make()
    change(b)
    diffs = differences(a, b)
    assert len(diffs) == 1 and diffs[0].startswith(expect), diffs
    assert fingerprint(a) != fingerprint(b)


def test_a_bit_flip_in_a_bfloat16_tensor_is_found() -> None:
    a = torch.ones(8, dtype=torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[3] ^= 1
    assert differences({"x": a}, {"x": b}) == ["x: values differ (max abs difference 0.00781)"]


def test_summarize_caps_the_list() -> None:
    assert summarize([str(i) for i in range(25)], limit=3) == ["0", "1", "2", "... and 22 more"]
    assert summarize(["a"], limit=3) == ["a"]


def test_live_state_and_its_checkpoint_have_the_same_fingerprint(tmp_path) -> None:
    # the demo trusts this to check, inside each worker, that the final save round-trips
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = {"model": model, "optim": opt, "rng": shardsafe.RNGState(), "step": 1, "x": math.pi}
    shardsafe.save(state, str(tmp_path / "c"))
    loaded = shardsafe.load(str(tmp_path / "c"))
    assert differences(state, loaded) == []
    assert fingerprint(state) == fingerprint(loaded)


def test_a_snapshot_keeps_the_state_of_its_moment() -> None:
    # RNGState reads the global generators: only a snapshot remembers the reference's RNG
    model = torch.nn.Linear(2, 2)
    state = {"model": model, "rng": shardsafe.RNGState(), "xs": [np.zeros(2)], "t": (1,)}
    snap = snapshot(state)
    assert differences(state, snap) == []
    torch.rand(1)
    with torch.no_grad():
        model.weight.add_(1)
    state["xs"][0][0] = 5
    diffs = differences(state, snap)
    assert {d.split(":")[0] for d in diffs} == {"model.weight", "rng.torch", "xs.0"}
    assert isinstance(snap["t"], tuple) and not isinstance(snap["rng"], shardsafe.RNGState)
