"""``shardsafe demo``: SIGKILL a training run, resume it, and check the result is bit-identical."""

from __future__ import annotations

import argparse
import sys

from . import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo", help="crash a small training run with SIGKILL, resume it, verify it is exact",
        description="Trains a small model on the CPU with periodic checkpoints, kills the "
                    "training process with SIGKILL mid-run, resumes from the newest committed "
                    "checkpoint in a new process, and checks that the final state is "
                    "bit-identical to an uninterrupted run. Exits 1 if it is not.")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--every", type=int, default=25, help="checkpoint every N steps (default 25)")
    p.add_argument("--dir", default=None,
                   help="new or empty directory to keep the checkpoints in (default: a temporary "
                        "directory, removed at the end)")
    p.add_argument("--seed", type=int, default=0, help="seeds the job and the crash point")
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks per training job (default 1); 2 or more run an FSDP2 job on that "
                        "many processes (gloo on the CPU) and kill the whole job")
    # for tests: resume deliberately wrong, so the report must say DIFFERENT
    p.add_argument("--corrupt-resume", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Runs the demo and prints its report; 0 when the states are identical."""
    try:  # torch and torchdata are needed here only, so import them late
        from ..demo.report import report
        from ..demo.run import DemoError, DemoOptions, run_demo
    except ImportError as e:
        print(f"shardsafe demo needs torch and torchdata ({e}); "
              f"pip install 'shardsafe[torch,dev]'", file=sys.stderr)
        return EXIT_FAILED
    try:
        opts = DemoOptions(steps=args.steps, every=args.every, seed=args.seed,
                           directory=args.dir, corrupt_resume=args.corrupt_resume)
    except ValueError as e:
        print(f"shardsafe demo: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.nproc > 1:  # the distributed mode lives in its own module
        from ..demo.distributed import report as report_distributed
        from ..demo.distributed import run_distributed_demo

        run_it, show = (lambda: run_distributed_demo(opts, args.nproc)), report_distributed
    elif args.nproc < 1:
        print(f"shardsafe demo: --nproc must be at least 1, got {args.nproc}", file=sys.stderr)
        return EXIT_USAGE
    else:
        run_it, show = (lambda: run_demo(opts)), report
    try:
        result = run_it()
    except DemoError as e:
        print(f"shardsafe demo: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(show(result))
    return EXIT_OK if result.identical else EXIT_FAILED
