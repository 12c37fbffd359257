"""RNGState: a Stateful that captures and restores every random number generator."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from . import tensors


class RNGState:
    """Captures Python ``random``, NumPy's global generator and torch's CPU/CUDA generators.

    Put it in the saved state (``{"rng": shardsafe.RNGState(), ...}``); ``state_dict()``
    snapshots the generators at save time and ``load_state_dict()`` restores them, so
    dropout masks, shuffles and augmentation continue exactly as without the restart.
    """

    def state_dict(self) -> dict[str, Any]:
        """Returns a snapshot of all generators (plain values and uint8 tensors/arrays)."""
        version, internal, gauss = random.getstate()
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        out: dict[str, Any] = {
            "python": {"version": version, "state": list(internal), "gauss": gauss},
            "numpy": {"name": name, "keys": np.asarray(keys).copy(), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        }
        if tensors.HAVE_TORCH:
            torch = tensors.torch
            out["torch"] = torch.get_rng_state()
            if torch.cuda.is_available():
                out["cuda"] = list(torch.cuda.get_rng_state_all())
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the generators from ``state`` (as produced by ``state_dict``)."""
        py = state["python"]
        random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
        n = state["numpy"]
        np.random.set_state((n["name"], np.asarray(n["keys"], dtype=np.uint32), n["pos"],
                             n["has_gauss"], n["cached_gaussian"]))
        if tensors.HAVE_TORCH and "torch" in state:
            torch = tensors.torch
            torch.set_rng_state(state["torch"])
            cuda = state.get("cuda")
            if cuda is not None and torch.cuda.is_available():
                if len(cuda) != torch.cuda.device_count():
                    raise ValueError(f"checkpoint has {len(cuda)} CUDA generator states, this process "
                                     f"sees {torch.cuda.device_count()} devices")
                torch.cuda.set_rng_state_all(cuda)
