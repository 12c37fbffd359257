"""``shardsafe bench``: compare shardsafe with torch.save and DCP on this machine."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``bench`` subcommand."""
    from .. import bench

    p = sub.add_parser("bench", help="benchmark shardsafe against torch.save and DCP",
                       description=bench.__doc__.split("\n\n")[0])
    bench.add_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from .. import bench

    argv = sys.argv[1:]
    args.argv = argv[argv.index("bench") + 1:] if "bench" in argv else []
    return bench.run(args)
