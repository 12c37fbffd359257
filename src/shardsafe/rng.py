"""RNGState: a Stateful that captures and restores every random number generator."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np

from .values import torch as torch_values


log = logging.getLogger("shardsafe")


def _as_byte_tensor(x: Any) -> Any:
    """Generator states load as uint8 tensors, or numpy arrays where torch was absent at load."""
    torch = torch_values.torch
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x, dtype=np.uint8))


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
        # The key set is the same on every machine (absent generators are None / []), so a
        # checkpoint from a CPU box loads strictly on a GPU box, or in a numpy-only install.
        out["torch"], out["cuda"] = None, []
        if torch_values.HAVE_TORCH:
            torch = torch_values.torch
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
        if not torch_values.HAVE_TORCH:
            return
        torch = torch_values.torch
        if state.get("torch") is not None:
            torch.set_rng_state(_as_byte_tensor(state["torch"]))
        cuda = state.get("cuda") or []
        if cuda and torch.cuda.is_available():
            devices = torch.cuda.device_count()
            if len(cuda) != devices:
                # restoring on another device count cannot be exact; refusing would make the
                # checkpoint unloadable after everything else was restored, so restore the
                # devices both sides have and say so
                log.warning("checkpoint has %d CUDA generator states, this process sees %d devices; "
                            "restoring the first %d", len(cuda), devices, min(devices, len(cuda)))
            for i, gen in enumerate(cuda[:devices]):
                torch.cuda.set_rng_state(_as_byte_tensor(gen), i)
