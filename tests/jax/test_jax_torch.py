"""One format across frameworks: a JAX checkpoint loads into PyTorch and a PyTorch one
into JAX, bit-exactly, nested JAX names meeting flat state_dict names."""

from __future__ import annotations

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax_states import bits, put

import shardsafe
from shardsafe.jax import state_dict_names


class Dense(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.nn.Parameter(torch.zeros(64, 32))
        self.bias = torch.nn.Parameter(torch.zeros(32, dtype=torch.bfloat16))


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = Dense()
        self.embed = torch.nn.Parameter(torch.zeros(128, 16, dtype=torch.bfloat16))
        self.register_buffer("scale", torch.zeros(4, dtype=torch.float8_e4m3fn))


def _jax_params(mesh):
    return {"dense": {"kernel": put(bits(64 * 32, "float32", 0).reshape(64, 32), mesh, P("dp", "tp")),
                      "bias": put(bits(32, "bfloat16", 1), mesh, P())},
            "embed": put(bits(128 * 16, "bfloat16", 2).reshape(128, 16), mesh, P("dp", None)),
            "scale": put(bits(4, "float8_e4m3fn", 3), mesh, P())}


def _bytes(x) -> bytes:
    if isinstance(x, torch.Tensor):
        return x.detach().contiguous().view(torch.uint8).numpy().tobytes()
    return np.asarray(x).tobytes()


def test_jax_checkpoint_loads_into_a_torch_module_and_a_plain_dict(mesh42, tmp_path) -> None:
    params = _jax_params(mesh42)
    shardsafe.save({"params": params, "step": 4}, str(tmp_path / "j"))
    model = Model()
    state = {"params": model, "step": 0}
    shardsafe.load(str(tmp_path / "j"), state)
    assert state["step"] == 4
    sd = model.state_dict()
    names = state_dict_names({"params": params})
    assert sorted(names) == sorted(f"params.{k}" for k in sd)
    for name, leaf in zip(names, jax.tree_util.tree_leaves({"params": params})):
        assert _bytes(sd[name.removeprefix("params.")]) == _bytes(leaf), name
    nested = {"params": {"dense": {"kernel": torch.empty(64, 32), "bias": torch.empty(32, dtype=torch.bfloat16)},
                         "embed": torch.empty(128, 16, dtype=torch.bfloat16),
                         "scale": torch.empty(4, dtype=torch.float8_e4m3fn)}, "step": 0}
    shardsafe.load(str(tmp_path / "j"), nested)
    assert _bytes(nested["params"]["dense"]["kernel"]) == _bytes(params["dense"]["kernel"])


def test_torch_checkpoint_loads_into_sharded_jax_arrays(mesh42, tmp_path) -> None:
    model = Model()
    with torch.no_grad():
        for i, t in enumerate(model.state_dict().values()):
            raw = t.view(torch.uint8).view(-1)
            raw.copy_(torch.from_numpy(bits(raw.numel(), "uint8", i)))
    shardsafe.save({"params": model, "step": 9}, str(tmp_path / "t"))
    want = _jax_params(mesh42)
    target = {"params": jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), want), "step": 0}
    restored = shardsafe.load(str(tmp_path / "t"), target)
    assert restored["step"] == 9
    sd = model.state_dict()
    for name, leaf in zip(state_dict_names(restored), jax.tree_util.tree_leaves(restored)):
        if name != "step":
            assert _bytes(leaf) == _bytes(sd[name.removeprefix("params.")]), name
    k = restored["params"]["dense"]["kernel"]
    assert k.sharding == NamedSharding(mesh42, P("dp", "tp")) and len(k.addressable_shards) == 8
