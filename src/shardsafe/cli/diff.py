"""``shardsafe diff A B``: keys added, removed and changed, with the max abs difference per tensor.

Tensors of equal dtype and shape are read (one pair at a time) and compared bitwise
first; when the bytes differ the largest absolute difference is computed in float64
(complex: modulus of the difference). NaN equals NaN at the same position; a NaN
facing a number, or opposite infinities, count as an infinite difference.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import EXIT_FAILED, EXIT_OK
from .. import values
from ._args import add_command, add_quiet_option, open_checkpoint, storage_options
from ._output import progress
from ._summary import add_selection_options, groups, label, within
from ._tensors import Leaf, leaves, read_tensor
from ..engine.load.reader import ChunkReader
from ..values import torch as torch_values


@dataclass(frozen=True, slots=True)
class Change:
    """One line of the diff: ``op`` is ``+`` (only in B), ``-`` (only in A) or ``~`` (changed)."""

    op: str
    key: str
    a: str | None
    b: str | None
    max_abs_diff: float | None = None


@dataclass(frozen=True, slots=True)
class Diff:
    """The changes from A to B, and how many leaves are the same."""

    changes: list[Change]
    same: int


def _describe(leaf: Leaf) -> str:
    e = leaf.entry
    if e is not None:
        return f"{e.dtype}{list(e.shape)}"
    return f"{leaf.kind} {leaf.value()!r}"


# float4_e2m1fn_x2: each byte packs two E2M1 values (sign, 2 exponent bits, 1 mantissa
# bit), which torch cannot convert; these are the 16 values of a 4-bit code
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    t = value
    if t.dtype.is_complex:
        return t.to(torch_values.torch.complex128).numpy()
    if torch_values.torch_dtype_name(t.dtype) == "float4_e2m1fn_x2":
        codes = t.contiguous().view(torch_values.torch.uint8).numpy()
        return np.stack([_E2M1[codes & 15], _E2M1[codes >> 4]], axis=-1)
    return t.to(torch_values.torch.float64).numpy()  # covers bfloat16/float8 numpy lacks


def max_abs_diff(a: Any, b: Any) -> float:
    """Largest ``|a - b|`` of two same-shape tensors/arrays (0.0 when bitwise equal)."""
    x, y = _as_numpy(a), _as_numpy(b)
    if x.dtype.kind == "c" or y.dtype.kind == "c":
        x, y = x.astype(np.complex128), y.astype(np.complex128)
    else:
        x, y = x.astype(np.float64), y.astype(np.float64)
    if x.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(x - y)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    d = np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))
    return float(d.max())


def _bytes_equal(a: Any, b: Any) -> bool:
    return np.array_equal(values.host_bytes(a), values.host_bytes(b))


def compare(ra: ChunkReader, rb: ChunkReader, on_bytes: Any = None, only: str | None = None) -> Diff:
    """The changes from checkpoint A to B among the key paths under ``only`` (all without
    it), and the number of identical leaves there; nothing else is read."""
    la = {leaf.key: leaf for leaf in leaves(ra.index) if within(leaf.dotted, only)}
    lb = {leaf.key: leaf for leaf in leaves(rb.index) if within(leaf.dotted, only)}
    changes: list[Change] = []
    same = 0
    for key, a in la.items():
        change = _compare_leaf(ra, rb, a, lb.get(key), on_bytes)
        if change is None:
            same += 1
        else:
            changes.append(change)
    for key, b in lb.items():
        if key not in la:
            changes.append(Change("+", b.dotted, None, _describe(b)))
    return Diff(changes, same)


def _compare_leaf(ra: ChunkReader, rb: ChunkReader, a: Leaf, b: Leaf | None,
                  on_bytes: Any) -> Change | None:
    """The change from ``a`` to ``b`` (None: only in A), or None when they are the same."""
    if b is None:
        return Change("-", a.dotted, _describe(a), None)
    if a.entry is None or b.entry is None:  # typed nodes: 1 != 1.0 != True, nan == nan
        return None if a.node == b.node else Change("~", a.dotted, _describe(a), _describe(b))
    if (a.entry.dtype, a.entry.shape, a.entry.kind) != (b.entry.dtype, b.entry.shape, b.entry.kind):
        return Change("~", a.dotted, _describe(a), _describe(b))
    ta, tb = read_tensor(ra, a.entry), read_tensor(rb, b.entry)
    if on_bytes is not None:
        on_bytes(2 * a.entry.nbytes)
    if _bytes_equal(ta, tb):
        return None
    return Change("~", a.dotted, _describe(a), _describe(b), max_abs_diff(ta, tb))


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "diff", run, "compare two checkpoints",
                    "Keys only in A (-), only in B (+) and changed (~), with the max abs difference "
                    "per changed tensor: one line per top-level key (or per group, --depth) that "
                    "differs, every key with --all. Exits 0 when identical, 1 when they differ.",
                    ("a", "A", "first checkpoint"), ("b", "B", "second checkpoint"),
                    json_help="print JSON for machines (every change under --only)")
    add_quiet_option(p)
    add_selection_options(p)


def _line(c: Change) -> str:
    if c.op == "-":
        return f"- {c.key}  {c.a}"
    if c.op == "+":
        return f"+ {c.key}  {c.b}"
    if c.max_abs_diff is not None:
        return f"~ {c.key}  {c.a}  max abs diff {c.max_abs_diff:.6g}"
    return f"~ {c.key}  {c.a} -> {c.b}"


def run(args: argparse.Namespace) -> int:
    opts = storage_options(args)
    sa, pa, ia = open_checkpoint(args.a, opts)
    sb, pb, ib = open_checkpoint(args.b, opts)
    both = sum(t.nbytes for t in ia.tensors) + sum(t.nbytes for t in ib.tensors)
    bar = progress(both, "diff", args.quiet)
    try:
        d = compare(ChunkReader(sa, pa, ia), ChunkReader(sb, pb, ib), bar.update, args.only)
    finally:
        bar.close()
    if args.json:
        records = [asdict(c) for c in d.changes]
        for r in records:  # JSON has no infinity: write it as a string
            if r["max_abs_diff"] is not None and not np.isfinite(r["max_abs_diff"]):
                r["max_abs_diff"] = str(r["max_abs_diff"])
        print(json.dumps({"changes": records, "identical": d.same}, indent=2))
        return EXIT_FAILED if d.changes else EXIT_OK
    if args.all:
        for c in d.changes:
            print(_line(c))
    else:
        for prefix, members in groups([c.key for c in d.changes], args.only, args.depth).items():
            print(_group_line(prefix, [d.changes[i] for i in members]))
    print(f"{len(d.changes)} difference(s), {d.same} identical key(s)"
          + ("" if args.all or len(groups([c.key for c in d.changes], args.only, args.depth)) == len(d.changes)
             else "; --all lists every one"))
    return EXIT_FAILED if d.changes else EXIT_OK


def _group_line(prefix: str, changes: list[Change]) -> str:
    """One group's changes: the change itself when it is one, else how many of each kind
    and the largest max abs difference."""
    if len(changes) == 1:
        return _line(changes[0])
    counts = {op: sum(c.op == op for c in changes) for op in "-+~"}
    ops = "".join(op for op in "-~+" if counts[op])
    parts = [f"{counts['-']} only in A"] if counts["-"] else []
    parts += [f"{counts['~']} changed"] if counts["~"] else []
    parts += [f"{counts['+']} only in B"] if counts["+"] else []
    diffs = [c.max_abs_diff for c in changes if c.max_abs_diff is not None]
    worst = f", max abs diff {max(diffs):.6g}" if diffs else ""
    return f"{ops} {label(prefix, len(changes))}  {', '.join(parts)}{worst}"
