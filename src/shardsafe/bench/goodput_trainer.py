"""The trainer process of the goodput benchmark (started by ``goodput_run``, not by hand).

``python -m shardsafe.bench.goodput_trainer CONFIG_JSON``: imports torch, builds the model
and the optimizer, prints ``ready`` and waits for a line ``go`` on stdin (the supervisor
keeps such warm standby trainers, so a restart costs what the checkpoint strategy costs,
not Python's start-up). Then it restores with its strategy, prints
``restored STEP TIER T``, and trains the remaining steps, printing ``step S T_END BLOCKED``
after each (times from ``time.monotonic()``, the machine-wide clock the supervisor reads
too; ``BLOCKED``: seconds that step spent in the strategy's save call). At the end it
waits for saves in flight and prints ``done``.

Each step is a real forward/backward/AdamW step of a small MLP on the CPU, padded with
sleep to ``step_s`` seconds: the padding stands for the accelerator's compute, during
which a GPU job's host is idle and background checkpoint work can run. Batches are a
function of the step index, so a resumed run computes the same steps as an uninterrupted one.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

from .goodput_strategies import Intervals, make_strategy


@dataclass(frozen=True)
class TrainerConfig:
    """What one trainer process runs.

    Attributes:
        strategy: One of ``goodput_strategies.STRATEGIES``.
        intervals: Directories and save intervals.
        steps: Total steps of the job.
        step_s: The step time the compute is padded to (seconds).
        width: Hidden width of the MLP (the state is about ``3 * 4 * (2 * width**2)`` bytes
            with AdamW's two moments).
        batch: Batch size.
    """

    strategy: str
    intervals: Intervals
    steps: int
    step_s: float
    width: int
    batch: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        d = json.loads(text)
        return cls(**{**d, "intervals": Intervals(**d["intervals"])})


def build_model(width: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model and its AdamW optimizer, identically initialised in every process."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def state_bytes(width: int) -> int:
    """Bytes of the checkpointed state: parameters plus AdamW's two moments (fp32)."""
    params = 2 * (width * width + width)
    return 3 * 4 * params


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, batch: int) -> None:
    """One deterministic optimizer step (the batch depends only on ``step``)."""
    g = torch.Generator().manual_seed(step)
    width = model[0].in_features
    x = torch.randn(batch, width, generator=g)
    loss = (model(x) - x.roll(1, dims=1)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(cfg: TrainerConfig) -> None:
    """Waits for ``go``, restores, trains to ``cfg.steps`` (see the module docstring)."""
    torch.set_num_threads(1)
    model, opt = build_model(cfg.width)
    train_step(model, opt, 0, 1)  # warms the kernels up; the restore overwrites its effect
    model, opt = build_model(cfg.width)
    _say("ready")
    if sys.stdin.readline().strip() != "go":
        return
    strategy = make_strategy(cfg.strategy, model, opt, cfg.intervals)
    start, tier = strategy.restore()
    _say(f"restored {start} {tier} {time.monotonic():.6f}")
    for step in range(start + 1, cfg.steps + 1):
        t = time.monotonic()
        train_step(model, opt, step, cfg.batch)
        pad = cfg.step_s - (time.monotonic() - t)
        if pad > 0:
            time.sleep(pad)
        b = time.monotonic()
        strategy.after_step(step)
        end = time.monotonic()
        _say(f"step {step} {end:.6f} {end - b:.6f}")
    strategy.finish()
    _say("done")


if __name__ == "__main__":
    run(TrainerConfig.from_json(sys.argv[1]))
