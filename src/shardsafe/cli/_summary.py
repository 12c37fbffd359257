"""Which keys ``info`` and ``diff`` show, and how they are grouped.

A training state holds thousands of leaves (the RNG state alone: ~630), so both commands
show one line per group of key paths by default: the leaves whose dotted key paths share
their first ``--depth`` components (1: the top-level keys, ``model``, ``optim``,
``rng``...; 2: ``model.layers``, ``model.embed``...) below ``--only`` (the subtree asked
for; the whole tree by default). A group of a single leaf is shown as that leaf.
``--all`` lists every leaf.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence



def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """``--all``, ``--only PREFIX`` and ``--depth N``."""
    parser.add_argument("--all", action="store_true", help="list every key path, not one line per group")
    parser.add_argument("--only", metavar="PREFIX", default=None,
                        help="only the key paths under PREFIX (a dotted key path, e.g. 'model.layers.0')")
    parser.add_argument("--depth", metavar="N", type=_positive, default=1,
                        help="group key paths by their first N keys (below --only; default 1)")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def within(dotted: str, only: str | None) -> bool:
    """Whether the dotted key path ``dotted`` lies under the prefix ``only`` (always without one)."""
    return not only or dotted == only or dotted.startswith(only + ".")


def groups(dotted: Sequence[str], only: str | None, depth: int) -> dict[str, list[int]]:
    """The indices of the dotted key paths under ``only``, grouped by their first ``depth``
    dotted components below it (a module's ``layers.0.weight`` counts as three), in order
    of first appearance."""
    base = len(only.split(".")) if only else 0
    out: dict[str, list[int]] = {}
    for i, key in enumerate(dotted):
        if within(key, only):
            out.setdefault(".".join(key.split(".")[:base + depth]), []).append(i)
    return out


def label(prefix: str, members: int) -> str:
    """A group's name: its key path, with ``.*`` when it stands for several leaves."""
    text = prefix or "(root)"
    return text if members == 1 else f"{text}.*"


__all__ = ["add_selection_options", "groups", "label", "within"]
