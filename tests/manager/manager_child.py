"""A training process driven by the fault-tolerance tests (run as a script, never imported).

Modes:
  steady   State is a pure function of the step (``expected_state``); saves every step and
           appends "committed N" to the progress file (fsynced) whenever a save of step N
           is known to be committed. The parent SIGKILLs it or reads alongside it.
  train    State evolves with torch's global RNG (captured by RNGState); resumes from the
           manager's newest step, handles SIGTERM as preemption, appends "step N" each
           step, "resumed N", "preempted N" and "final N <digest>".
  fsize    A file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored, so writes fail with EFBIG)
           stands in for a full disk where no small filesystem can be mounted; appends
           what it observed and exits 0 only if every check held.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time

import torch

import shardsafe
from shardsafe.manager.lock import LOCK_NAME

N_TENSORS = 4


def expected_state(step: int, numel: int) -> dict:
    """The steady-mode state at ``step`` (bit-exact, cheap to rebuild in the parent)."""
    base = torch.arange(numel, dtype=torch.float64)
    return {"model": {f"w{i}": base + (step * 1000 + i) for i in range(N_TENSORS)},
            "step": step, "tag": f"step-{step}"}


def fill_state(state: dict, step: int) -> None:
    for i in range(N_TENSORS):
        w = state["model"][f"w{i}"]
        torch.arange(w.numel(), dtype=torch.float64, out=w).add_(step * 1000 + i)
    state["step"], state["tag"] = step, f"step-{step}"


class Progress:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())
        os.fsync(self.fd)


def digest(state: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(state["model"]):
        h.update(state["model"][k].numpy().tobytes())
    h.update(torch.get_rng_state().numpy().tobytes())
    return h.hexdigest()[:16]


def steady(args: argparse.Namespace, progress: Progress) -> int:
    state = expected_state(0, args.numel)
    mgr = shardsafe.CheckpointManager(args.dir, max_to_keep=args.max_to_keep, keep_period=args.keep_period,
                                      async_save=bool(args.async_save))
    start = (mgr.latest_step() or -1) + 1
    progress.write("ready")
    for step in range(start, start + args.steps):
        fill_state(state, step)
        mgr.save(step, state)
        # one save in flight: once save(step) returned, save(step - 1) has committed
        progress.write(f"committed {step - 1}" if args.async_save else f"committed {step}")
        if args.sleep:
            time.sleep(args.sleep)
    mgr.close()
    progress.write(f"committed {start + args.steps - 1}")
    return 0


def train(args: argparse.Namespace, progress: Progress) -> int:
    torch.manual_seed(0)
    state = {"model": {f"w{i}": torch.zeros(args.numel) for i in range(N_TENSORS)},
             "rng": shardsafe.RNGState()}
    sigs = (signal.SIGTERM,) if args.preempt else ()
    with shardsafe.CheckpointManager(args.dir, save_interval_steps=args.interval,
                                     preemption_signals=sigs, max_to_keep=3) as mgr:
        restored = mgr.restore(state)
        if restored is not None:
            progress.write(f"resumed {restored}")
        for step in range((restored if restored is not None else -1) + 1, args.steps):
            for w in state["model"].values():
                w.add_(torch.randn(w.shape))  # stands in for an optimizer step
            mgr.save(step, state)
            progress.write(f"step {step}")
            if mgr.reached_preemption(step):
                mgr.wait_until_finished()
                progress.write(f"preempted {step}")
                return 0
            time.sleep(args.sleep)
    progress.write(f"final {args.steps - 1} {digest(state)}")
    return 0


def fsize(args: argparse.Namespace, progress: Progress) -> int:
    import resource

    small = {"w": torch.arange(1 << 16, dtype=torch.float64)}       # 512 KiB
    big = {"w": torch.arange(1 << 19, dtype=torch.float64)}         # 4 MiB
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, hard))
    with shardsafe.CheckpointManager(args.dir, async_save=bool(args.async_save)) as mgr:
        mgr.save(0, small)
        try:
            mgr.save(1, big)
            mgr.wait_until_finished()
        except shardsafe.CheckpointError as e:
            progress.write(f"failed {e}")
        assert mgr.all_steps() == [0], mgr.all_steps()
        assert not [n for n in os.listdir(args.dir) if n not in ("step_00000000", LOCK_NAME)], \
            os.listdir(args.dir)
        out = {"w": torch.zeros(1 << 16, dtype=torch.float64)}
        assert mgr.restore(out) == 0 and torch.equal(out["w"], small["w"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # "space was freed"
        assert mgr.save(1, big)
        mgr.wait_until_finished()
        out = {"w": torch.zeros(1 << 19, dtype=torch.float64)}
        assert mgr.restore(out) == 1 and torch.equal(out["w"], big["w"])
        progress.write("ok")
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["steady", "train", "fsize"])
    p.add_argument("dir")
    p.add_argument("progress")
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--numel", type=int, default=1 << 17)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--max-to-keep", type=int, default=2)
    p.add_argument("--keep-period", type=int, default=None)
    p.add_argument("--async-save", type=int, default=1)
    p.add_argument("--interval", type=int, default=10)
    p.add_argument("--preempt", action="store_true")
    args = p.parse_args()
    progress = Progress(args.progress)
    return {"steady": steady, "train": train, "fsize": fsize}[args.mode](args, progress)


if __name__ == "__main__":
    sys.exit(main())
