"""``shardsafe demo``: crash and preempt a training run, resume it, check it is bit-identical.

``--nproc N`` with N > 1 hands over to ``shardsafe.demo.distributed``, whose seam mirrors
the single-process demo: ``run_demo(opts: DemoOptions)`` returns a result with an ``ok``
property (raising ``DemoError`` when a process fails), and ``report(result) -> str``
renders it; this module prints and picks the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import EXIT_FAILED, EXIT_OK, EXIT_USAGE

_DISTRIBUTED = "shardsafe.demo.distributed"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo", help="crash and preempt a small training run, resume it, verify it is exact",
        description="Trains a small model on the CPU with a CheckpointManager (async saves, "
                    "max_to_keep), kills the training process with SIGKILL mid-run, resumes "
                    "from the newest committed step in a new process, preempts that one with "
                    "SIGTERM (it saves the step it is at and exits 0), resumes from exactly "
                    "that step, and checks that the final state is bit-identical to an "
                    "uninterrupted run. Exits 1 if it is not. Then restores a state from the "
                    "local tier (/dev/shm) and from a cold persistent directory, to show how "
                    "much faster a recovery from the local tier is.")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--every", type=int, default=25, help="checkpoint every N steps (default 25)")
    p.add_argument("--keep", type=int, default=3,
                   help="checkpoints to keep, max_to_keep (default 3)")
    p.add_argument("--dir", default=None,
                   help="new or empty directory to keep the checkpoints in, a CheckpointManager "
                        "directory (default: a temporary directory, removed at the end)")
    p.add_argument("--seed", type=int, default=0, help="seeds the job and the interruptions")
    p.add_argument("--sync", action="store_true",
                   help="save synchronously (async_save=False), to compare the time blocked")
    p.add_argument("--nproc", type=int, default=1,
                   help="training processes per run (default 1; more runs the distributed demo)")
    # for tests: resume deliberately wrong, so the report must say DIFFERENT
    p.add_argument("--corrupt-resume", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Runs the demo and prints its report; 0 when the states are identical."""
    try:  # torch and torchdata are needed here only, so import them late
        from ..demo import report as single
        from ..demo.run import DemoError, DemoOptions, run_demo
    except ImportError as e:
        print(f"shardsafe demo needs torch and torchdata ({e}); "
              f"pip install 'shardsafe[torch,dev]'", file=sys.stderr)
        return EXIT_FAILED
    try:
        opts = DemoOptions(steps=args.steps, every=args.every, keep=args.keep, seed=args.seed,
                           directory=args.dir, sync=args.sync, nproc=args.nproc,
                           corrupt_resume=args.corrupt_resume)
    except ValueError as e:
        print(f"shardsafe demo: {e}", file=sys.stderr)
        return EXIT_USAGE
    runner, render = run_demo, single.report
    if opts.nproc > 1:
        dist = importlib.import_module(_DISTRIBUTED)  # late: it imports torch.distributed
        runner, render = dist.run_demo, dist.report
    try:
        result = runner(opts)
    except DemoError as e:
        print(f"shardsafe demo: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(render(result))
    if opts.nproc == 1:
        from ..bench.tiers import local_tier_section

        print()
        print(local_tier_section())
    return EXIT_OK if result.ok else EXIT_FAILED
