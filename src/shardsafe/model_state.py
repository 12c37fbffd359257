"""``ModelOptimizerState``: one Stateful value for "this model and its optimizer".

It goes through ``torch.distributed.checkpoint.state_dict.get_state_dict`` /
``set_state_dict``, which understand FSDP2 (``fully_shard``), tensor parallel and
plain modules alike: keys are fully qualified parameter names (stable across wrapping
and world sizes) and sharded values are DTensors, which shardsafe saves as chunks and
reloads onto any other sharding. A never-stepped optimizer gets its state initialised
first (DCP does a zero-learning-rate step), so a fresh job can restore into it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)


class ModelOptimizerState:
    """Stateful wrapper of a model and (optionally) its optimizer(s).

    Usage::

        state = {"app": shardsafe.ModelOptimizerState(model, optimizer), "step": step}
        shardsafe.save(state, path)      # every rank, under torchrun
        shardsafe.load(path, state)      # any world size, any sharding

    Args:
        model: The module (FSDP2-sharded, tensor-parallel or plain).
        optimizer: An optimizer, a list of optimizers over the model's parameters, or
            None to checkpoint only the model.
        options: Passed to DCP's state-dict functions (defaults keep values sharded).
    """

    def __init__(self, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
                 *, options: StateDictOptions | None = None) -> None:
        self.model = model
        if isinstance(optimizer, torch.optim.Optimizer):
            self.optimizers: tuple[torch.optim.Optimizer, ...] = (optimizer,)
        else:
            self.optimizers = tuple(optimizer or ())
        self.options = options

    def state_dict(self) -> dict[str, Any]:
        """``{"model": ..., "optim": ...}`` with DTensor values for sharded parameters."""
        if not self.optimizers:
            return {"model": get_model_state_dict(self.model, options=self.options)}
        msd, osd = get_state_dict(self.model, self.optimizers, options=self.options)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a dict produced by ``state_dict`` (possibly saved under another sharding)."""
        if not self.optimizers:
            set_model_state_dict(self.model, state_dict["model"], options=self.options)
            return
        set_state_dict(self.model, self.optimizers, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"], options=self.options)
