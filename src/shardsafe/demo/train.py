"""The demo's training job: a small MLP with dropout, AdamW, warmup + cosine LR, shuffled data.

Everything that influences the result lives in ``DemoTrainer.state`` (model, optimizer,
scheduler, data loader position, every RNG, the step counter and a running digest of
the batches trained on), so saving that one mapping is enough to resume exactly.
The loop knows nothing about checkpoints: after each step it calls a hook, which is
where ``hook.CheckpointHook`` asks a ``CheckpointManager`` to save.
"""

from __future__ import annotations

import random
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

import shardsafe

StepHook = Callable[[int, dict[str, Any]], bool]
"""Called after every step with ``(step, state)``; returning True stops the loop early."""


def deterministic_process() -> None:
    """Makes this process compute exactly like every other process of the demo.

    One intra-op thread: a matmul split over a different number of threads may sum in a
    different order, and the reference run must be comparable bit for bit (the machine
    is shared anyway). Also silences a torchdata warning printed on every iterator.
    """
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*set_vital.*")


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """The demo job, on one process or many. Every process of one demo uses the same values.

    Attributes:
        steps: Total training steps (also the LR schedule's horizon).
        seed: Seeds the data, the initial weights and every generator.
        samples: Size of the synthetic data set (not a multiple of ``batch_size``, so
            epochs end on a short batch and runs cross many epoch boundaries).
        features: Input width.
        hidden: Width of the two hidden layers.
        classes: Number of labels.
        batch_size: Samples per step.
        dropout: Dropout probability (makes the result depend on the RNG state).
        nproc: Ranks of the job; above 1 the model is sharded by FSDP2 and each rank has
            its own data loader (``shardsafe.demo.distributed``).
    """

    steps: int = 300
    seed: int = 0
    samples: int = 1000
    features: int = 32
    hidden: int = 256
    classes: int = 10
    batch_size: int = 64
    dropout: float = 0.1
    nproc: int = 1

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.samples < 1 or self.nproc < 1:
            raise ValueError("steps, batch_size, samples and nproc must be positive")

    def describe(self) -> str:
        """One line naming the model and training setup (for the report)."""
        model = f"MLP {self.features}-{self.hidden}-{self.hidden}-{self.classes} with dropout"
        if self.nproc > 1:
            return (f"{model}, sharded by FSDP2 over {self.nproc} ranks (gloo, CPU), AdamW, warmup "
                    f"LR, per-rank StatefulDataLoader (DistributedSampler, batch {self.batch_size})")
        return (f"{model}, AdamW, warmup+cosine LR, shuffled StatefulDataLoader ({self.samples} "
                f"samples, batch {self.batch_size})")


class SyntheticClassification(torch.utils.data.Dataset):
    """Gaussian inputs labelled by a fixed random linear teacher; items carry their index."""

    def __init__(self, cfg: TrainConfig) -> None:
        g = torch.Generator().manual_seed(cfg.seed)
        self.x = torch.randn(cfg.samples, cfg.features, generator=g)
        teacher = torch.randn(cfg.features, cfg.classes, generator=g)
        self.y = (self.x @ teacher).argmax(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


def build_state(cfg: TrainConfig) -> dict[str, Any]:
    """A fresh, complete training state for ``cfg`` (step 0); seeds every global RNG."""
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = nn.Sequential(
        nn.Linear(cfg.features, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden, cfg.classes),
    )
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warmup = max(1, cfg.steps // 10)
    sched = torch.optim.lr_scheduler.SequentialLR(optim, [
        torch.optim.lr_scheduler.LinearLR(optim, start_factor=0.1, total_iters=warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=max(1, cfg.steps - warmup)),
    ], milestones=[warmup])
    data = SyntheticClassification(cfg)
    # The sampler owns its generator (saved in the loader's state); the loader gets a
    # separate one for its per-epoch base-seed draw. Sharing one generator
    # (``shuffle=True, generator=g``) makes the epoch after a resume shuffle differently,
    # and no generator at all lets that draw shift the global RNG (and so dropout).
    sampler = RandomSampler(data, generator=torch.Generator().manual_seed(cfg.seed + 1))
    loader = StatefulDataLoader(data, batch_size=cfg.batch_size, sampler=sampler,
                                generator=torch.Generator().manual_seed(cfg.seed + 2))
    return {"model": model, "optim": optim, "sched": sched, "loader": loader,
            "rng": shardsafe.RNGState(), "step": 0, "data_digest": 0}


class DemoTrainer:
    """Runs the demo job on one process.

    Restore a checkpoint into ``trainer.state`` *before* the first ``run`` call: the
    data loader picks up its restored position when its first iterator is created.

    Args:
        cfg: The job.
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.state = build_state(cfg)
        self._batches: Any = None  # the loader's current iterator (one per epoch)

    @property
    def step(self) -> int:
        """Number of steps completed."""
        return int(self.state["step"])

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._batches is None:
            self._batches = iter(self.state["loader"])
        try:
            return next(self._batches)
        except StopIteration:  # epoch over: a new iterator reshuffles
            self._batches = iter(self.state["loader"])
            return next(self._batches)

    def train_step(self) -> float:
        """One optimizer step; returns the loss."""
        s = self.state
        x, y, idx = self._next_batch()
        s["model"].train()
        loss = nn.functional.cross_entropy(s["model"](x), y)
        s["optim"].zero_grad(set_to_none=True)
        loss.backward()
        s["optim"].step()
        s["sched"].step()
        # a running digest of the sample order: equal digests mean the same batches
        s["data_digest"] = zlib.crc32(idx.numpy().tobytes(), s["data_digest"])
        s["step"] += 1
        return float(loss.detach())

    def run(self, until: int, on_step: StepHook | None = None) -> int:
        """Trains until ``until`` steps are done (or ``on_step`` asks to stop); returns the step."""
        while self.step < until:
            self.train_step()
            if on_step is not None and on_step(self.step, self.state):
                break
        return self.step
