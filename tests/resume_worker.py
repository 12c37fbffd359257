"""One training process of the exact-resume proof (run by tests/test_exact_resume.py).

Trains a small MLP with dropout, AdamW, a warmup+cosine LR schedule and a shuffled
StatefulDataLoader. It can start fresh or from a shardsafe checkpoint, train some
steps, save a shardsafe checkpoint, and write what it ended with (parameters,
optimizer state, the batch indices it trained on) to ``--out`` with ``torch.save`` so
the comparison does not go through the library under test.

``--skip`` names parts of the state to leave out of the restore (negative controls
that show the test notices a resume that forgot the RNG or the loader position).
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

import shardsafe

SAMPLES = 200  # not a multiple of the batch size: epochs end on a short batch
BATCH = 16
TOTAL_STEPS = 60  # the schedule's horizon (the uninterrupted run's length)


class Indexed(torch.utils.data.Dataset):
    """A synthetic regression set that also returns each sample's index."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(SAMPLES, 12, generator=g)
        self.y = torch.randn(SAMPLES, 3, generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


def build() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    warm = torch.optim.lr_scheduler.LinearLR(optim, start_factor=0.1, total_iters=5)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=TOTAL_STEPS - 5)
    sched = torch.optim.lr_scheduler.SequentialLR(optim, [warm, cos], milestones=[5])
    data = Indexed()
    # The sampler gets its own generator, and the loader a separate one for its per-epoch
    # base-seed draw. With ``shuffle=True, generator=g`` both share g, the base-seed draw
    # is not part of the sampler's saved generator state, and after a resume the *next*
    # epoch's order differs (torchdata 0.11); with no generator the draw hits the global
    # RNG instead and shifts dropout after a resume.
    sampler = RandomSampler(data, generator=torch.Generator().manual_seed(7))
    loader = StatefulDataLoader(data, batch_size=BATCH, sampler=sampler,
                                generator=torch.Generator().manual_seed(8))
    return {"model": model, "optim": optim, "sched": sched, "loader": loader,
            "rng": shardsafe.RNGState(), "step": 0}


def train(state: dict, steps: int) -> list[list[int]]:
    model, optim, sched, loader = state["model"], state["optim"], state["sched"], state["loader"]
    seen: list[list[int]] = []
    it = iter(loader)
    for _ in range(steps):
        try:
            x, y, idx = next(it)
        except StopIteration:  # next epoch: a fresh iterator reshuffles
            it = iter(loader)
            x, y, idx = next(it)
        loss = nn.functional.mse_loss(model(x), y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        sched.step()
        seen.append(idx.tolist())
        state["step"] += 1
    return seen


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--resume", help="shardsafe checkpoint to start from")
    p.add_argument("--save", help="shardsafe checkpoint to write at the end")
    p.add_argument("--out", required=True, help="torch.save file with the results")
    p.add_argument("--skip", action="append", default=[], help="state key not to restore")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    state = build()
    if args.resume:
        target = {k: v for k, v in state.items() if k not in args.skip}
        shardsafe.load(args.resume, target, strict=not args.skip)
        state.update(target)
    seen = train(state, args.steps)
    if args.save:
        shardsafe.save(state, args.save)
    torch.save({"step": state["step"],
                "params": state["model"].state_dict(),
                "optim": state["optim"].state_dict(),
                "sched": state["sched"].state_dict(),
                "batches": seen}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
