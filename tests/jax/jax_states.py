"""Sharded JAX states for the tests: every value kind and dtype, bit patterns that a
wrong byte order, box or dtype would change."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

DTYPES = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
          "float8_e5m2fnuz", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e8m0fnu",
          "float4_e2m1fn", "int4", "uint4", "int8", "uint8", "int16", "int32", "uint32", "bool",
          "complex64"]


class Adam(NamedTuple):
    mu: Any
    nu: Any
    count: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: Any
    opt: Adam
    step: Any


def bits(n: int, dtype: str, seed: int) -> np.ndarray:
    """``n`` values of ``dtype`` from random bytes (every bit pattern the type stores)."""
    dt = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    raw = np.random.default_rng(seed).integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    if dtype in ("int4", "uint4", "float4_e2m1fn"):
        raw &= 0x0F  # one value per byte, in the low 4 bits
    if dtype == "bool":
        raw &= 1
    return raw.view(dt)


def put(a: np.ndarray, mesh: Any, spec: P) -> jax.Array:
    return jax.device_put(a, NamedSharding(mesh, spec))


def train_state(mesh: Any, seed: int = 0) -> TrainState:
    """A small model's state: sharded 2-D weights, replicated biases, a NamedTuple and a
    registered dataclass, a scalar step."""
    w = bits(64 * 32, "float32", seed).reshape(64, 32)
    params = {"dense": {"kernel": put(w, mesh, P("dp", "tp")),
                        "bias": put(bits(32, "bfloat16", seed + 1), mesh, P())},
              "embed": put(bits(128 * 16, "bfloat16", seed + 2).reshape(128, 16), mesh, P("dp", None))}
    mu = jax.tree_util.tree_map(lambda x: x * 0 + 1 if x.dtype != jnp.bfloat16 else x, params)
    nu = jax.tree_util.tree_map(lambda x: x + x, params)
    return TrainState(params, Adam(mu, nu, jnp.asarray(7, jnp.int32)), jnp.asarray(3, jnp.int32))


def same(a: Any, b: Any) -> bool:
    """Bit-exact equality of two leaves (arrays by their bytes, dtype and shape)."""
    if isinstance(a, (jax.Array, np.ndarray)) or isinstance(b, (jax.Array, np.ndarray)):
        x, y = np.asarray(a), np.asarray(b)
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    return type(a) is type(b) and a == b


def assert_same_tree(a: Any, b: Any) -> None:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, f"{ta} != {tb}"
    for i, (x, y) in enumerate(zip(la, lb)):
        assert same(x, y), f"leaf {i}: {x!r} != {y!r}"
