"""The state of the multi-process JAX tests: arrays whose values any process (or the test
itself) computes from a seed, so each checks what it restored without the others."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# the saved layout, then layouts to restore onto (SPECS[2] fits a mesh with tp = 1)
SPECS = [
    {"w": P("dp", "tp"), "b": P(), "e": P("dp", None), "m": P(None, "tp")},
    {"w": P("tp", "dp"), "b": P("dp"), "e": P(None, "dp"), "m": P()},
    {"w": P(None, "dp"), "b": P(), "e": P("dp", None), "m": P("dp", None)},
]


def expected(seed: int, big: bool = False) -> dict[str, Any]:
    """The host values of the state for ``seed``: random bit patterns of each dtype."""
    rng = np.random.default_rng(seed)
    rows = 262144 if big else 64  # big: 32 MiB

    def bits(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dt = np.dtype(dtype)
        return rng.integers(0, 256, int(np.prod(shape)) * dt.itemsize, dtype=np.uint8).view(dt).reshape(shape)

    params = {"w": bits((rows, 32), np.float32), "b": bits((32,), ml_dtypes.bfloat16),
              "e": bits((128, 16), ml_dtypes.bfloat16), "m": bits((16, 8), np.int32)}
    return {"params": params, "step": 100 + seed}


def state_on(mesh: Any, seed: int, big: bool = False) -> dict[str, Any]:
    """The state for ``seed`` as global arrays on ``mesh``, laid out as ``SPECS[0]``: every
    process builds its own shards only (``make_array_from_callback``)."""
    import jax

    want = expected(seed, big)
    params = {k: jax.make_array_from_callback(v.shape, NamedSharding(mesh, SPECS[0][k]), lambda i, v=v: v[i])
              for k, v in want["params"].items()}
    return {"params": params, "step": want["step"]}
