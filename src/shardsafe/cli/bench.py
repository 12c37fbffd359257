"""``shardsafe bench``: compare shardsafe with torch.save and DCP on this machine."""

from __future__ import annotations

import argparse
import sys
import textwrap


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``bench`` subcommand."""
    from .. import bench

    p = sub.add_parser("bench", help="benchmark shardsafe against torch.save and DCP",
                       description=description(bench.__doc__ or ""),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(p)
    p.set_defaults(func=_run)


def description(doc: str) -> str:
    """The help text of ``shardsafe bench``: the bench package's docstring up to its
    cases and method, as plain text (no reST markup, no line about how to run it)."""
    paragraphs = [" ".join(p.split()) for p in doc.replace("``", "").split("\n\n") if p.strip()]
    kept = [p for p in paragraphs if not p.startswith("Run ")]
    kept[0] = kept[0].removeprefix("shardsafe bench: ")
    return "\n\n".join(textwrap.fill(p, 79) for p in kept)


def _run(args: argparse.Namespace) -> int:
    from .. import bench

    argv = sys.argv[1:]
    args.argv = argv[argv.index("bench") + 1:] if "bench" in argv else []
    return bench.run(args)
