"""One training process of the demo: ``python -m shardsafe.demo.worker [options]``.

This is the training script a user would write: it opens a ``CheckpointManager`` on
``--dir`` (a checkpoint every ``--every`` steps, the newest ``--keep`` kept, async saves,
SIGTERM as the preemption signal), restores the newest committed step if there is one,
and trains to ``--steps``. The demo runs it three times: one run is killed with
SIGKILL, the next is preempted with SIGTERM (it saves the step it is at, waits for the
write and exits 0), the last one finishes and saves the final step.

It reports progress as one JSON object per line on stdout (the parent reads them live
to decide when to send its signals):

    {"event": "start", "step": 0, "resumed_from": null, "pid": 123}
    {"event": "step", "step": 1}
    {"event": "save", "step": 25, "stall_s": 0.0009, "reason": "schedule"}
    {"event": "durable", "step": 25, "after_s": 0.012}
    {"event": "preempted", "step": 262, "signal": "SIGTERM", "wait_s": 0.01}
    {"event": "done", "step": 300, "fingerprint": "<sha256 of the final state>"}
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import torch

import shardsafe

from ..harness.compare import fingerprint
from .hook import CheckpointHook, CommitClock
from .train import DemoTrainer, TrainConfig, deterministic_process


def _emit(event: str, **fields: Any) -> None:
    # one write per line: the manager's thread never prints, but keep lines whole anyway
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shardsafe.demo.worker")
    p.add_argument("--dir", required=True, help="the CheckpointManager directory")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--every", type=int, required=True, help="checkpoint interval in steps")
    p.add_argument("--keep", type=int, default=None, help="max_to_keep (default: keep all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sync", action="store_true", help="save synchronously (async_save=False)")
    p.add_argument("--wait-for-go", action="store_true",
                   help="start up, then wait for a line 'go' on stdin before opening --dir "
                        "(the demo starts the next process while the current one trains)")
    p.add_argument("--forget-rng", action="store_true",
                   help="after restoring, reseed torch's RNG (a deliberately wrong resume)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one training process; returns its exit code (0 also after a preemption)."""
    args = parse_args(argv)
    deterministic_process()
    clock = CommitClock.install()
    trainer = DemoTrainer(TrainConfig(steps=args.steps, seed=args.seed))
    # the manager removes leftovers of unfinished saves when it opens the directory, so a
    # process started early must not open it while the previous process still writes
    if args.wait_for_go and sys.stdin.readline().strip() != "go":
        return 1
    with shardsafe.CheckpointManager(args.dir, save_interval_steps=args.every,
                                     max_to_keep=args.keep, async_save=not args.sync,
                                     preemption_signals=(signal.SIGTERM,)) as mgr:
        resumed_from = mgr.restore(trainer.state)  # the newest committed step, or None
        if args.forget_rng:
            torch.manual_seed(12345)
        _emit("start", step=trainer.step, resumed_from=resumed_from, pid=os.getpid())
        hook = CheckpointHook(mgr, _emit, clock)
        step = trainer.run(args.steps, hook)
        if hook.preempted_at is not None:
            # the step is saved (or being written): wait until it is durable, then exit 0
            waited = hook.wait()
            _emit("preempted", step=hook.preempted_at, signal="SIGTERM", wait_s=waited)
            return 0
        hook.finish(step, trainer.state)
    _emit("done", step=trainer.step, fingerprint=fingerprint(trainer.state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
