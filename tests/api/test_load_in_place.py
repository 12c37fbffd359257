"""load(path, state): restores into the live objects (same tensors, same memory) and Statefuls."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_same
from torchdata.stateful_dataloader import StatefulDataLoader

import shardsafe

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


def _path(tmp_path) -> str:
    return os.path.join(tmp_path, "ckpt")


def test_load_without_state_returns_a_new_dict(tmp_path) -> None:
    state = {"t": torch.ones(2), "a": np.zeros(3), "n": 1}
    shardsafe.save(state, _path(tmp_path))
    got = shardsafe.load(_path(tmp_path))
    assert type(got) is dict and got is not state
    assert got["t"] is not state["t"] and got["t"].device.type == "cpu"


def test_tensors_and_arrays_are_restored_into_the_same_memory(tmp_path) -> None:
    state = {"w": torch.randn(4, 3), "t": torch.randn(3, 4).t(), "a": np.arange(6.0).reshape(2, 3),
             "f": np.asfortranarray(np.arange(6.0).reshape(2, 3)), "s": torch.tensor(3),
             "nested": {"list": [torch.zeros(2, dtype=torch.bfloat16)], "tup": (torch.ones(1),)},
             "step": 10, "name": "run"}
    saved = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    shardsafe.save(state, _path(tmp_path))
    objs = {k: state[k] for k in ("w", "t", "a", "f", "s")}
    ptrs = {k: (v.data_ptr() if isinstance(v, torch.Tensor) else v.ctypes.data) for k, v in objs.items()}
    inner, tup_t = state["nested"]["list"][0], state["nested"]["tup"][0]
    for v in (*objs.values(), inner, tup_t):
        v[...] = 0
    state["step"], state["name"] = 0, ""
    result = shardsafe.load(_path(tmp_path), state)
    assert result == shardsafe.LoadResult()
    for k, v in objs.items():
        assert state[k] is v
        assert (v.data_ptr() if isinstance(v, torch.Tensor) else v.ctypes.data) == ptrs[k]
    assert torch.equal(state["w"], saved["w"]) and torch.equal(state["t"], saved["t"])
    assert not state["t"].is_contiguous()  # restored through a copy, still the same object
    np.testing.assert_array_equal(state["a"], np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(state["f"], np.arange(6.0).reshape(2, 3))
    assert state["s"].item() == 3
    assert state["nested"]["list"][0] is inner and torch.equal(inner, torch.zeros(2, dtype=torch.bfloat16))
    assert state["nested"]["tup"][0] is tup_t and tup_t.item() == 1.0
    assert (state["step"], state["name"]) == (10, "run")


def test_plain_containers_take_the_checkpoint_value(tmp_path) -> None:
    shardsafe.save({"history": [1.0, 2.0, 3.0], "cfg": {"lr": 0.1}, "pair": (1, 2)}, _path(tmp_path))
    state: dict[str, Any] = {"history": [], "cfg": {"lr": 0.5}, "pair": (0, 0)}
    shardsafe.load(_path(tmp_path), state)
    assert state == {"history": [1.0, 2.0, 3.0], "cfg": {"lr": 0.1}, "pair": (1, 2)}


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.2),
                               torch.nn.Linear(8, 2))


def test_module_parameters_and_buffers_restored_in_place(tmp_path) -> None:
    src = _model(0)
    src.train()
    src(torch.randn(5, 4)).sum().backward()  # moves BatchNorm running stats
    shardsafe.save({"model": src}, _path(tmp_path))
    dst = _model(1)
    params = {n: (p, p.data_ptr()) for n, p in dst.state_dict(keep_vars=True).items()}
    shardsafe.load(_path(tmp_path), {"model": dst})
    for n, t in dst.state_dict(keep_vars=True).items():
        assert t is params[n][0] and t.data_ptr() == params[n][1], n
        assert torch.equal(t, src.state_dict()[n]), n


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(6, 4, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None:
            if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sched.step(loss.item())
            else:
                sched.step()


def _make_opt(kind: str, model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    sched_kinds = {
        "adamw+onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=50),
        "sgd+step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
        "sgd+plateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0),
        "adam+cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=3),
        "adamw+sequential": lambda o: torch.optim.lr_scheduler.SequentialLR(
            o, [torch.optim.lr_scheduler.LinearLR(o, 0.1, total_iters=2),
                torch.optim.lr_scheduler.ExponentialLR(o, 0.9)], milestones=[2]),
        "rmsprop+lambda": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.9**s),
    }
    params = model.parameters()
    opt = {"adamw": lambda: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
           "sgd": lambda: torch.optim.SGD(params, lr=0.01, momentum=0.9, nesterov=True),
           "adam": lambda: torch.optim.Adam(params, lr=0.01, amsgrad=True),
           "rmsprop": lambda: torch.optim.RMSprop(params, lr=0.01, momentum=0.5)}[kind.split("+")[0]]()
    return opt, sched_kinds[kind](opt)


KINDS = ["adamw+onecycle", "sgd+step", "sgd+plateau", "adam+cosine", "adamw+sequential", "rmsprop+lambda"]


@pytest.mark.parametrize("kind", KINDS)
def test_never_stepped_optimizer_and_scheduler_restore_fully(tmp_path, kind: str) -> None:
    model = _model(0)
    opt, sched = _make_opt(kind, model)
    _train(model, opt, sched, 5, seed=1)
    shardsafe.save({"model": model, "opt": opt, "sched": sched}, _path(tmp_path))
    model2 = _model(7)
    opt2, sched2 = _make_opt(kind, model2)  # fresh: optimizer state is empty
    assert opt2.state_dict()["state"] == {}
    result = shardsafe.load(_path(tmp_path), {"model": model2, "opt": opt2, "sched": sched2})
    assert result == shardsafe.LoadResult()
    assert_same(opt2.state_dict(), opt.state_dict())
    assert_same(sched2.state_dict(), sched.state_dict())
    # the optimizer state now belongs to model2's parameters
    assert all(p in opt2.state for p in model2.parameters())
    # and training continues bit-identically
    for m, o, s in ((model, opt, sched), (model2, opt2, sched2)):
        torch.manual_seed(3)  # dropout draws from the global generator
        _train(m, o, s, 3, seed=2)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    assert_same(opt2.state_dict(), opt.state_dict())


def test_grad_scaler(tmp_path) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        scaler.scale(model(torch.ones(1, 2)).sum()).backward()
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 8192.0
    shardsafe.save({"scaler": scaler}, _path(tmp_path))
    fresh = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=1)
    shardsafe.load(_path(tmp_path), {"scaler": fresh})
    assert fresh.state_dict() == scaler.state_dict()
    assert fresh.get_scale() == 8192.0


def _loader() -> StatefulDataLoader:
    return StatefulDataLoader(list(range(50)), batch_size=4, shuffle=True,
                              generator=torch.Generator().manual_seed(0))


def test_stateful_dataloader_resumes_mid_epoch(tmp_path) -> None:
    dl = _loader()
    it = iter(dl)
    seen = [next(it) for _ in range(3)]
    shardsafe.save({"data": dl}, _path(tmp_path))
    rest = [b.tolist() for b in it]
    dl2 = _loader()
    shardsafe.load(_path(tmp_path), {"data": dl2})
    resumed = [b.tolist() for b in dl2]
    assert resumed == rest
    assert sorted(sum((b.tolist() for b in seen), []) + sum(resumed, [])) == list(range(50))


class Box:
    """A user Stateful with a nested, growing state."""

    def __init__(self) -> None:
        self.items: dict[int, torch.Tensor] = {}
        self.loaded: list[dict] = []

    def state_dict(self) -> dict[str, Any]:
        return {"items": self.items, "count": len(self.items)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.loaded.append(sd)
        self.items = dict(sd["items"])


def test_user_stateful_receives_materialised_state(tmp_path) -> None:
    b = Box()
    b.items = {0: torch.ones(2), 5: torch.zeros(3)}
    shardsafe.save({"box": b}, _path(tmp_path))
    fresh = Box()
    shardsafe.load(_path(tmp_path), {"box": fresh})
    assert len(fresh.loaded) == 1 and fresh.loaded[0]["count"] == 2
    assert list(fresh.items) == [0, 5] and torch.equal(fresh.items[5], torch.zeros(3))


def test_load_state_must_be_a_mapping_or_a_stateful(tmp_path) -> None:
    shardsafe.save({"w": torch.ones(1)}, _path(tmp_path))
    with pytest.raises(TypeError, match="mapping"):
        shardsafe.load(_path(tmp_path), (torch.ones(1),))  # type: ignore[arg-type]
    # a module is a target (tests/api/test_stateful_root.py), matched by its keys
    with pytest.raises(shardsafe.StateMismatchError, match="missing in checkpoint: weight"):
        shardsafe.load(_path(tmp_path), torch.nn.Linear(1, 1))


class Plain:
    def state_dict(self) -> dict[str, Any]:
        return {"x": [1.0], "y": [2.0], "table": {"a": 5, "b": torch.ones(2)}}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        raise AssertionError("not loaded into")


class Aliased:
    """state_dict() hands out live internals and one list under two keys (like SequentialLR)."""

    def __init__(self) -> None:
        self.shared = [0.0]
        self.table: dict[str, Any] = {"a": 1, "b": torch.zeros(2)}
        self.got: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"x": self.shared, "y": self.shared, "table": self.table}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.got = sd


def test_stateful_internals_are_not_mutated_behind_its_back(tmp_path) -> None:
    shardsafe.save({"s": Plain()}, _path(tmp_path))
    target = Aliased()
    b = target.table["b"]
    shardsafe.load(_path(tmp_path), {"s": target})
    assert target.got is not None
    assert target.got["x"] == [1.0] and target.got["y"] == [2.0]
    assert target.got["table"]["a"] == 5 and target.got["table"]["b"] is b  # tensors still in place
    assert torch.equal(b, torch.ones(2))
    assert target.shared == [0.0] and target.table["a"] == 1  # only load_state_dict decides


def test_inference_mode_targets(tmp_path) -> None:
    shardsafe.save({"c": torch.ones(3), "t": torch.arange(6.0).reshape(2, 3)}, _path(tmp_path))
    with torch.inference_mode():
        c, t = torch.zeros(3), torch.zeros(3, 2).t()  # t is restored through a copy
    shardsafe.load(_path(tmp_path), {"c": c, "t": t})
    assert torch.equal(c, torch.ones(3)) and torch.equal(t, torch.arange(6.0).reshape(2, 3))
