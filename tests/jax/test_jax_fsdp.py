"""A JAX checkpoint loads into an FSDP2 model and DTensors on 2 gloo ranks, and what they
save loads back into sharded JAX arrays, bit-exactly both ways."""

from __future__ import annotations

import os

import jax
import numpy as np
import torch
from dist_harness import run_script
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_dtypes
from jax_states import put
from safetensors.torch import load_file

import shardsafe

HERE = os.path.dirname(os.path.abspath(__file__))


def bits(n: int, dtype: str, seed: int) -> np.ndarray:
    """Finite values (doubling them is exact in both frameworks)."""
    return np.random.default_rng(seed).standard_normal(n).astype(getattr(ml_dtypes, dtype, None) or dtype)


def test_jax_to_fsdp2_and_back(mesh42, tmp_path) -> None:
    state = {"model": {"0": {"weight": put(bits(16 * 8, "float32", 0).reshape(16, 8), mesh42, P("dp", "tp")),
                             "bias": put(bits(16, "float32", 1), mesh42, P("dp"))},
                       "1": {"weight": put(bits(7 * 16, "float32", 2).reshape(7, 16), mesh42, P(None, "tp")),
                             "bias": put(bits(7, "float32", 3), mesh42, P())}},
             "cols": put(bits(6 * 10, "bfloat16", 4).reshape(6, 10), mesh42, P("tp", None)),
             "step": 4}
    jpath, tpath = str(tmp_path / "jax"), str(tmp_path / "torch")
    shardsafe.save(state, jpath)
    run_script(os.path.join(HERE, "fsdp_worker.py"), 2, jpath, tpath, str(tmp_path), timeout=240)
    leaves = {"0.weight": state["model"]["0"]["weight"], "0.bias": state["model"]["0"]["bias"],
              "1.weight": state["model"]["1"]["weight"], "1.bias": state["model"]["1"]["bias"],
              "cols": state["cols"]}
    for r in range(2):
        got = load_file(str(tmp_path / f"loaded-r{r}.safetensors"))
        for k, x in leaves.items():
            assert got[k].view(torch.uint8).numpy().tobytes() == np.asarray(x).tobytes(), (r, k)
    assert len(shardsafe.api.load.read_checkpoint_index(tpath).files) == 2  # both ranks wrote
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    specs = {"0.weight": P("b", "a"), "0.bias": P("b"), "1.weight": P(None, "b"), "1.bias": P(), "cols": P("a")}
    sds = {k: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, specs[k])) for k, x in leaves.items()}
    target = {"model": {"0": {"weight": sds["0.weight"], "bias": sds["0.bias"]},
                        "1": {"weight": sds["1.weight"], "bias": sds["1.bias"]}}, "cols": sds["cols"], "step": 0}
    back = shardsafe.load(tpath, target)
    assert back["step"] == 5
    for k, x in leaves.items():
        got = back["cols"] if k == "cols" else back["model"][k[0]][k[2:]]
        want = np.asarray(x) * np.asarray(2, np.asarray(x).dtype)
        assert np.asarray(got).tobytes() == want.tobytes(), k
        assert got.sharding == sds[k].sharding
