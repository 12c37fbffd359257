"""The checkpoint strategies the goodput benchmark compares, as the trainer runs them.

Each strategy restores the newest state it can find when a trainer starts and is told
after every completed step that the step is done (it saves when its interval says so).
Steps count completed optimizer steps: a checkpoint of step ``s`` holds the state after
``s`` steps, and a restored step ``s`` resumes with step ``s + 1``; 0 means "start over".

- ``none``: never saves; every failure restarts from step 0.
- ``torch.save``: synchronous: ``torch.save`` into a temporary file, ``fsync``, rename,
  ``fsync`` of the directory; restore with ``torch.load(weights_only=True)``.
- ``dcp.async_save``: ``torch.distributed.checkpoint.async_save`` (no process group
  needed in one process); the previous save is awaited before the next one starts;
  restore with ``dcp.load`` from the newest directory holding DCP's ``.metadata``.
- ``shardsafe``: an asynchronous ``CheckpointManager`` on the persistent directory.
- ``shardsafe+local``: the same manager with a local tier (frequent local saves).

Every strategy but ``none`` keeps two persistent checkpoints.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

STRATEGIES = ("none", "torch.save", "dcp.async_save", "shardsafe", "shardsafe+local")
KEEP = 2


@dataclass(frozen=True)
class Intervals:
    """Where and how often a strategy saves.

    Attributes:
        persistent_dir: The persistent tier (a directory on disk).
        local_dir: The local tier (a directory in ``/dev/shm`` where there is one).
        every: Persistent saves every this many steps (the same for every strategy).
        local_every: Local saves every this many steps (``shardsafe+local`` only).
    """

    persistent_dir: str
    local_dir: str
    every: int
    local_every: int


class Strategy(Protocol):
    def restore(self) -> tuple[int, str]:
        """Loads the newest checkpoint into the model and optimizer; (step, tier)."""

    def after_step(self, step: int) -> None:
        """Called after each completed step; saves when due (the time spent here blocks)."""

    def finish(self) -> None:
        """Waits for saves in flight and releases resources."""


def _full_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def _newest(directory: str, pattern: str) -> list[tuple[int, str]]:
    """``(step, path)`` of the entries of ``directory`` matching ``pattern``, newest first."""
    rx = re.compile(pattern)
    found = [(int(m.group(1)), os.path.join(directory, n))
             for n in os.listdir(directory) if (m := rx.fullmatch(n))]
    return sorted(found, reverse=True)


class NoCheckpoint:
    def restore(self) -> tuple[int, str]:
        return 0, "none"

    def after_step(self, step: int) -> None:
        pass

    def finish(self) -> None:
        pass


class TorchSave:
    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, iv: Intervals) -> None:
        self.model, self.opt, self.iv = model, opt, iv

    def restore(self) -> tuple[int, str]:
        for step, path in _newest(self.iv.persistent_dir, r"step_(\d+)\.pt"):
            sd = torch.load(path, weights_only=True)
            self.model.load_state_dict(sd["model"])
            self.opt.load_state_dict(sd["optim"])
            return step, "persistent"
        return 0, "none"

    def after_step(self, step: int) -> None:
        if step % self.iv.every:
            return
        d = self.iv.persistent_dir
        final = os.path.join(d, f"step_{step}.pt")
        with open(final + ".tmp", "wb") as f:
            torch.save(_full_state(self.model, self.opt), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(final + ".tmp", final)
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        for _, old in _newest(d, r"step_(\d+)\.pt")[KEEP:]:
            os.remove(old)

    def finish(self) -> None:
        pass


def _dcp() -> Any:
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    import torch.distributed.checkpoint as dcp

    return dcp


class DcpAsync:
    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, iv: Intervals) -> None:
        self.model, self.opt, self.iv = model, opt, iv
        self.dcp = _dcp()
        self.pending: Any = None

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.opt)  # creates the optimizer's state if new
        return {"model": msd, "optim": osd}

    def restore(self) -> tuple[int, str]:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        for step, path in _newest(self.iv.persistent_dir, r"step_(\d+)"):
            if not os.path.exists(os.path.join(path, ".metadata")):
                continue  # a save the failure interrupted
            sd = self._state()
            self.dcp.load(sd, checkpoint_id=path)
            set_state_dict(self.model, self.opt, model_state_dict=sd["model"],
                           optim_state_dict=sd["optim"])
            return step, "persistent"
        return 0, "none"

    def _collect(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None
            for _, old in _newest(self.iv.persistent_dir, r"step_(\d+)")[KEEP:]:
                shutil.rmtree(old)

    def after_step(self, step: int) -> None:
        if step % self.iv.every:
            return
        self._collect()
        path = os.path.join(self.iv.persistent_dir, f"step_{step}")
        fut = self.dcp.async_save(self._state(), checkpoint_id=path)
        self.pending = getattr(fut, "upload_completion", fut)

    def finish(self) -> None:
        self._collect()


class Shardsafe:
    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, iv: Intervals,
                 local: bool) -> None:
        import shardsafe

        opts: dict[str, Any] = dict(save_interval_steps=iv.every, max_to_keep=KEEP, async_save=True)
        if local:
            # one process is one node: there is no other node to hold a peer copy
            opts.update(local_directory=iv.local_dir, local_save_interval_steps=iv.local_every,
                        local_max_to_keep=KEEP, local_replication=False)
        self.local = local
        self.state = {"model": model, "optim": opt}
        self.mgr = shardsafe.CheckpointManager(iv.persistent_dir, **opts)

    def restore(self) -> tuple[int, str]:
        step = self.mgr.restore(self.state)
        if step is None:
            return 0, "none"
        info = getattr(self.mgr, "last_restore", None)
        return int(step), (info.tier if info is not None else "persistent")

    def after_step(self, step: int) -> None:
        self.mgr.save(step, self.state)

    def finish(self) -> None:
        self.mgr.close()


def make_strategy(name: str, model: nn.Module, opt: torch.optim.Optimizer,
                  iv: Intervals) -> Strategy:
    """The strategy called ``name`` (one of ``STRATEGIES``) for this model and optimizer."""
    if name == "none":
        return NoCheckpoint()
    if name == "torch.save":
        return TorchSave(model, opt, iv)
    if name == "dcp.async_save":
        return DcpAsync(model, opt, iv)
    if name in ("shardsafe", "shardsafe+local"):
        return Shardsafe(model, opt, iv, local=name == "shardsafe+local")
    raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
