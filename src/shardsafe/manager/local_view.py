"""A rank's own view of a training state: DTensors as their local shards.

The local tier saves each rank's state alone (``collective=False``), and a DTensor whose
mesh spans several ranks cannot be saved that way. ``LocalView(state)`` is a Stateful
value whose ``state_dict()`` is ``state`` with every Stateful object replaced by its
state dict and every DTensor by ``to_local()`` (the same memory, no copy). A load
writes into those local tensors in place, so the DTensors already hold the loaded
values; ``load_state_dict`` then puts the plain values back into ``state``'s containers
and hands each Stateful object its original state dict (DTensors included) again.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from ..plan.flatten import is_stateful
from ..values import torch as torch_values
from ..values.dtensor import is_dtensor


class LocalView:
    """Stateful wrapper saving and loading ``state`` as this rank's local shards.

    Args:
        state: The caller's state: a mapping or a single Stateful object (loaded into
            in place).
    """

    def __init__(self, state: MutableMapping[str, Any] | Any) -> None:
        self.state = state
        self._originals: dict[int, Any] = {}  # id(Stateful) -> the state dict it gave out
        self._plain: tuple[type, ...] = ()  # plain tensor types: leaves, decided first

    def state_dict(self) -> Any:
        """The state with Stateful objects resolved and DTensors as local tensors."""
        self._originals.clear()
        self._plain = torch_values.PLAIN_TENSOR_TYPES
        return self._localize(self.state)

    def _localize(self, x: Any) -> Any:
        if type(x) in self._plain:  # the common leaf (20,000 of them in a large state)
            return x
        if is_stateful(x):
            sd = x.state_dict()
            self._originals[id(x)] = sd
            return self._localize(sd)
        if is_dtensor(x):
            return x.to_local()
        if isinstance(x, Mapping):
            return {k: self._localize(v) for k, v in x.items()}
        if isinstance(x, list):
            return [self._localize(v) for v in x]
        if isinstance(x, tuple):
            return tuple(self._localize(v) for v in x)
        return x

    def load_state_dict(self, loaded: Mapping[str, Any]) -> None:
        """Writes the loaded values back into ``state`` (see the module docstring)."""
        self._plain = torch_values.PLAIN_TENSOR_TYPES
        self._write_back(self.state, loaded)

    def _write_back(self, orig: Any, new: Any) -> Any:
        if type(orig) in self._plain:  # loaded in place: ``new`` is the same tensor
            return new
        if is_stateful(orig):
            sd = self._originals.get(id(orig))
            orig.load_state_dict(self._write_back(sd, new) if sd is not None else new)
            return orig
        if is_dtensor(orig):
            return orig  # its local tensor was loaded into in place
        if isinstance(orig, MutableMapping) and isinstance(new, Mapping):
            for k, v in new.items():
                orig[k] = self._write_back(orig.get(k), v)
            return orig
        if isinstance(orig, list) and isinstance(new, (list, tuple)) and len(orig) == len(new):
            for i, v in enumerate(new):
                orig[i] = self._write_back(orig[i], v)
            return orig
        if isinstance(orig, tuple) and isinstance(new, (list, tuple)) and len(orig) == len(new):
            return tuple(self._write_back(o, v) for o, v in zip(orig, new))
        return new


__all__ = ["LocalView"]
