"""Hugging Face Accelerate integration: an Accelerator's whole training state as one Stateful.

Usage::

    from shardsafe.accelerate import training_state
    model, opt, sched, loader = accelerator.prepare(model, opt, sched, loader)
    state = {"train": training_state(accelerator)}
    mgr = shardsafe.CheckpointManager("ckpts", save_interval_steps=100)
    start = mgr.restore(state) or 0                 # a new process continues bit-exactly
    for step in range(start + 1, steps + 1):
        ...
        mgr.save(step, state)

``training_state(accelerator)`` holds what ``accelerator.save_state`` writes: the
prepared models (unwrapped, so a checkpoint of a DDP job loads on one process), the
optimizers, the schedulers, the state of stateful data loaders
(``DataLoaderConfiguration(use_stateful_dataloader=True)``) and of seedable samplers,
the objects passed to ``register_for_checkpointing``, the grad scaler and each rank's
random generators, with no pickling. Needs the extra ``shardsafe[accelerate]``;
importing this module does not import Accelerate (the accelerator passed in has).
"""

from __future__ import annotations

from typing import Any

from .per_rank import PerRank
from .plan.flatten import is_stateful
from .rng import RNGState


class _SamplerState:
    """The position of Accelerate's SeedableRandomSampler: its epoch and seed."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": int(self.sampler.epoch), "initial_seed": int(self.sampler.initial_seed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.set_epoch(int(state["epoch"]))
        self.sampler.initial_seed = int(state["initial_seed"])


def _loader_state(loader: Any) -> Any:
    """What of a prepared data loader can be saved: all of it, its sampler's seed, or nothing."""
    if getattr(loader, "use_stateful_dataloader", False):
        return loader
    get_sampler = getattr(loader, "get_sampler", None)
    sampler = get_sampler() if get_sampler is not None else None
    if sampler is not None and hasattr(sampler, "initial_seed") and hasattr(sampler, "set_epoch"):
        return _SamplerState(sampler)
    return {}


class AcceleratorTrainingState:
    """Stateful view of an Accelerator's training state (see ``training_state``).

    The objects are looked up at every ``state_dict()`` call, so objects prepared or
    registered after this was created are included.
    """

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self._rng = PerRank(RNGState())  # every rank's generators (collective under DDP)

    def _parts(self) -> dict[str, Any]:
        acc = self.accelerator
        for i, obj in enumerate(acc._custom_objects):
            if not is_stateful(obj):
                raise TypeError(f"object {i} registered for checkpointing ({type(obj).__name__}) "
                                f"has no state_dict/load_state_dict")
        parts: dict[str, Any] = {
            "models": [acc.unwrap_model(m) for m in acc._models],
            "optimizers": list(acc._optimizers),
            "schedulers": list(acc._schedulers),
            "dataloaders": [_loader_state(d) for d in acc._dataloaders],
            "custom": list(acc._custom_objects),
            "rng": self._rng,
        }
        if acc.scaler is not None:
            parts["scaler"] = acc.scaler
        return parts

    def state_dict(self) -> dict[str, Any]:
        """The training state; its Stateful parts are captured by ``shardsafe.save``."""
        return {**self._parts(), "step": int(self.accelerator.step)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the Accelerator's own counters (its parts are restored in place first)."""
        self.accelerator.step = int(state["step"])


def training_state(accelerator: Any) -> AcceleratorTrainingState:
    """A Stateful holding everything ``accelerator.save_state`` would write.

    Put it in the state given to ``shardsafe.save``/``load`` or a ``CheckpointManager``
    (``{"train": training_state(accelerator)}``). Under several processes the save is
    collective like any shardsafe save (every rank calls it); each rank's random
    generators are kept apart (``PerRank``), so the load needs the same number of ranks.
    """
    return AcceleratorTrainingState(accelerator)


__all__ = ["AcceleratorTrainingState", "training_state"]
