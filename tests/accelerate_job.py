"""One training process for tests/test_accelerate.py: a real Accelerator on the CPU.

``accelerate_job.py DIR STEPS MODE`` trains an MLP with dropout, AdamW, a LambdaLR
schedule, a shuffled stateful data loader (torchdata's RandomSampler) (epochs end mid-run) and an object registered
for checkpointing. MODE ``fresh`` starts from the seed; ``resume`` restores the newest
step of the CheckpointManager in DIR/ckpts first. It trains until step STEPS, saving at
every step divisible by 3 there, and writes its final parameters, optimizer state and the
batches it saw with ``torch.save`` (not through the library under test) to DIR/MODE-STEPS.pt.
"""

from __future__ import annotations

import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchdata.stateful_dataloader.sampler import RandomSampler

import shardsafe
from shardsafe.accelerate import training_state


class Counter:
    """A user object registered with ``register_for_checkpointing``."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = int(state["seen"])


def main(root: str, steps: int, mode: str) -> None:
    set_seed(0)  # the same script on every start, as a user would run it
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(70, 6, generator=g)
    ds = TensorDataset(torch.arange(70), x, x.sum(1, keepdim=True))
    # a stateful sampler with its own generator, and another for the loader's base-seed
    # draw, as in tests/resume_worker.py: then iter() after a resume draws nothing from
    # the global generator, which the checkpoint restored for dropout
    loader = DataLoader(ds, batch_size=8, sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(7)),
                        generator=torch.Generator().manual_seed(8))
    model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    state = training_state(acc)  # a single Stateful is a state too
    mgr = shardsafe.CheckpointManager(os.path.join(root, "ckpts"), save_interval_steps=3)
    step = mgr.restore(state) or 0 if mode == "resume" else 0
    seen = []
    it = iter(loader)
    while step < steps:
        try:
            idx, xb, yb = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        loss = nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        counter.seen += len(idx)
        seen.append(idx.tolist())
        step += 1
        mgr.save(step, state)
    mgr.close()
    torch.save({"params": {k: v.clone() for k, v in model.state_dict().items()},
                "optim": opt.state_dict(), "seen": seen, "counter": counter.seen,
                "lr": sched.get_last_lr(), "rng": torch.get_rng_state()},
               os.path.join(root, f"{mode}-{steps}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
