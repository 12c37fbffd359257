"""One rank of a torchtitan-style job (gloo on the CPU) checkpointed by
shardsafe.torchtitan.ShardsafeCheckpointManager, with torchtitan's own ModelWrapper (inside
the checkpointer), OptimizersContainer and LRSchedulersContainer around an FSDP2 model.

Usage: ``torchtitan_job.py ROOT PHASE ASYNC_MODE``.
- ``first``: the uninterrupted run (``full/``, STEPS steps, a model-only export at the end),
  then a run that is killed with SIGKILL during step KILL_AT (``split/``).
- ``resume``: a new job restores ``split/`` (load(step=-1)) and trains to STEPS; then the
  model-only export and an explicit ``load(step=...)``.
Each phase writes what the test compares to ``ROOT/<phase>-r<rank>.pt``.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig

from shardsafe.torchtitan import ShardsafeCheckpointManager

STEPS, INTERVAL, KILL_AT = 8, 2, 5


class TrainState:
    """The trainer's own state, as torchtitan's Trainer keeps it (step, tokens seen)."""

    def __init__(self) -> None:
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.ntokens_seen = sd["step"], sd["ntokens_seen"]


def build(root: str, folder: str, async_mode: str, **config: Any) -> tuple[Any, ...]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    fully_shard(model)
    optim = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                       optimizer_kwargs={"lr": 1e-2, "weight_decay": 0.1})],
        implementation="for-loop").build(model_parts=[model])
    sched = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optim, training_steps=STEPS)
    ts = TrainState()
    cfg = ShardsafeCheckpointManager.Config(enable=True, folder=folder, interval=INTERVAL, keep_latest_k=2,
                                            async_mode=async_mode, **config)
    ckpt = cfg.build(dataloader=None, model_parts=[model], optimizers=optim, lr_schedulers=sched,
                     states={"train_state": ts}, sd_adapter=None, base_folder=root)
    return model, optim, sched, ts, ckpt


def step(model: Any, optim: Any, sched: Any, ts: TrainState) -> None:
    g = torch.Generator().manual_seed(1000 * ts.step + dist.get_rank())  # the batch of this step
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optim.step()
    optim.zero_grad()
    sched.step()
    ts.step += 1
    ts.ntokens_seen += x.shape[0]


def snapshot(model: Any, optim: Any, sched: Any, ts: TrainState) -> dict[str, Any]:
    full = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    opt = {k: (v.full_tensor().clone() if hasattr(v, "full_tensor") else v)
           for k, v in optim.state_dict().items() if "exp_avg" in k or k.endswith("step")}
    return {"model": full, "optim": opt, "lr": sched.schedulers[0].get_last_lr(), "ts": ts.state_dict()}


def train(parts: tuple[Any, ...], until: int, kill_at: int | None = None) -> None:
    model, optim, sched, ts, ckpt = parts
    while ts.step < until:
        ckpt.maybe_wait_for_staging()
        step(model, optim, sched, ts)
        if kill_at is not None and ts.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-run, a save of step 4 maybe in flight
        ckpt.save(ts.step, last_step=ts.step == until)


def main() -> None:
    root, phase, async_mode = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = os.path.join(root, f"{phase}-r{rank}.pt")
    if phase == "first":
        parts = build(root, "full", async_mode, last_save_model_only=False)
        train(parts, STEPS)
        torch.save(snapshot(*parts[:4]), out)
        parts[4].close()
        split = build(root, "split", async_mode, last_save_model_only=False)
        assert split[4].load() is False  # a fresh start
        train(split, STEPS, kill_at=KILL_AT)
    else:
        parts = build(root, "split", async_mode, last_save_model_only=True, export_dtype="bfloat16")
        # step 4, or step 2 when the async write of step 4 was still in flight at the kill
        assert parts[4].load() is True and parts[3].step in (2, 4), parts[3].step
        resumed_at = parts[3].step
        train(parts, STEPS)  # the last step is a model-only bfloat16 export
        mgr = parts[4].manager
        result = snapshot(*parts[:4])
        result.update(resumed_at=resumed_at, steps=mgr.all_steps(), export_metrics=mgr.metrics(STEPS))
        parts[4].close()
        # a new job restores the newest step: the model-only export, model only
        again = build(root, "split", async_mode, last_save_model_only=True)
        assert again[4].load() is True and again[3].step == 0  # the train state was not touched
        result["export_model"] = {k: v.full_tensor().clone() for k, v in again[0].state_dict().items()}
        assert again[4].load(step=6) is True and again[3].step == 6  # an explicit step, in full
        again[4].close()
        torch.save(result, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
