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
from .. import tensors
from ._common import add_command, add_quiet_option, open_checkpoint, progress, storage_options
from ._tensors import Leaf, leaves, read_tensor
from ..engine.load.reader import ChunkReader


@dataclass(frozen=True, slots=True)
class Change:
    """One line of the diff: ``op`` is ``+`` (only in B), ``-`` (only in A) or ``~`` (changed)."""

    op: str
    key: str
    a: str | None
    b: str | None
    max_abs_diff: float | None = None


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
        return t.to(tensors.torch.complex128).numpy()
    if tensors.torch_dtype_name(t.dtype) == "float4_e2m1fn_x2":
        codes = t.contiguous().view(tensors.torch.uint8).numpy()
        return np.stack([_E2M1[codes & 15], _E2M1[codes >> 4]], axis=-1)
    return t.to(tensors.torch.float64).numpy()  # covers bfloat16/float8 numpy lacks


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
    return np.array_equal(tensors.host_bytes(a), tensors.host_bytes(b))


def compare(ra: ChunkReader, rb: ChunkReader, on_bytes: Any = None) -> tuple[list[Change], int]:
    """The changes from checkpoint A to B, and the number of identical leaves."""
    la = {leaf.key: leaf for leaf in leaves(ra.index)}
    lb = {leaf.key: leaf for leaf in leaves(rb.index)}
    changes: list[Change] = []
    same = 0
    for key, a in la.items():
        b = lb.get(key)
        if b is None:
            changes.append(Change("-", a.dotted, _describe(a), None))
            continue
        if a.entry is None or b.entry is None:
            if a.node == b.node:  # typed nodes: 1 != 1.0 != True, nan == nan
                same += 1
            else:
                changes.append(Change("~", a.dotted, _describe(a), _describe(b)))
            continue
        if (a.entry.dtype, a.entry.shape, a.entry.kind) != (b.entry.dtype, b.entry.shape, b.entry.kind):
            changes.append(Change("~", a.dotted, _describe(a), _describe(b)))
            continue
        ta, tb = read_tensor(ra, a.entry), read_tensor(rb, b.entry)
        if on_bytes is not None:
            on_bytes(2 * a.entry.nbytes)
        if _bytes_equal(ta, tb):
            same += 1
        else:
            changes.append(Change("~", a.dotted, _describe(a), _describe(b), max_abs_diff(ta, tb)))
    changes += [Change("+", b.dotted, None, _describe(b)) for key, b in lb.items() if key not in la]
    return changes, same


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "diff", run, "compare two checkpoints",
                "List keys only in A (-), only in B (+) and changed (~), with the max abs "
                "difference per changed tensor. Exits 0 when identical, 1 when they differ.",
                ("a", "A", "first checkpoint"), ("b", "B", "second checkpoint"),
                json_help="print JSON for machines")
    add_quiet_option(p)


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
        changes, same = compare(ChunkReader(sa, pa, ia), ChunkReader(sb, pb, ib), bar.update)
    finally:
        bar.close()
    if args.json:
        records = [asdict(c) for c in changes]
        for r in records:  # JSON has no infinity: write it as a string
            if r["max_abs_diff"] is not None and not np.isfinite(r["max_abs_diff"]):
                r["max_abs_diff"] = str(r["max_abs_diff"])
        print(json.dumps({"changes": records, "identical": same}, indent=2))
    else:
        for c in changes:
            print(_line(c))
        print(f"{len(changes)} difference(s), {same} identical key(s)")
    return EXIT_FAILED if changes else EXIT_OK
