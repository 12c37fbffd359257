"""One training process of the demo: ``python -m shardsafe.demo.worker [options]``.

It restores the newest checkpoint under ``--dir`` when asked, trains to ``--steps``
with a checkpoint every ``--every`` steps, saves its final state to ``--final``, and
reports progress as one JSON object per line on stdout (the parent reads them live to
decide when to SIGKILL it):

    {"event": "start", "step": 0, "resumed_from": null, "pid": 123}
    {"event": "step", "step": 1}
    {"event": "save", "step": 25, "blocked_s": 0.004, "nbytes": 1234567}
    {"event": "done", "step": 300, "fingerprint": "<sha256 of the final state>"}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import torch

import shardsafe

from .checkpointer import StepCheckpointer
from .compare import fingerprint
from .train import TrainConfig, Trainer


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shardsafe.demo.worker")
    p.add_argument("--dir", required=True, help="directory of the step checkpoints")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--every", type=int, default=0, help="checkpoint interval (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="start from the newest checkpoint")
    p.add_argument("--final", help="save the final state here")
    p.add_argument("--forget-rng", action="store_true",
                   help="after restoring, reseed torch's RNG (a deliberately wrong resume)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one training process; returns its exit code."""
    args = parse_args(argv)
    # torchdata's StatefulDataLoader warns about a deprecated torch call on every iterator
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    torch.set_num_threads(1)  # same arithmetic in every process; the machine is shared
    trainer = Trainer(TrainConfig(steps=args.steps, seed=args.seed))
    ckpt = StepCheckpointer(args.dir, args.every)
    resumed_from = ckpt.restore(trainer.state) if args.resume else None
    if args.forget_rng:
        torch.manual_seed(12345)
    _emit("start", step=trainer.step, resumed_from=resumed_from, pid=os.getpid())

    def on_step(step: int, state: dict[str, Any]) -> bool:
        _emit("step", step=step)
        rec = ckpt.maybe_save(step, state)
        if rec is not None:
            _emit("save", step=rec.step, blocked_s=rec.blocked_s, nbytes=rec.nbytes)
        return False

    trainer.run(args.steps, on_step)
    if args.final:
        shardsafe.save(trainer.state, args.final)
    _emit("done", step=trainer.step, fingerprint=fingerprint(trainer.state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
