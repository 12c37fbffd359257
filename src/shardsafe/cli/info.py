"""``shardsafe info CKPT``: format version, writers, files and the tree of keys.

For compressed tensors it also shows the bytes they take in the checkpoint and their
codecs (``stored_bytes`` and ``codecs`` in ``--json``; every tensor has them)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import EXIT_OK
from .._numbers import human_bytes
from ._args import CKPT, add_command, open_checkpoint, storage_options
from ._listing import own_bytes, referenced_bytes
from ._output import local_time, table
from ._summary import add_selection_options, groups, label, within
from ._tensors import Leaf, leaves
from ..format.index.objects import Index, TensorEntry

_VALUE_WIDTH = 60  # plain values longer than this are shortened in the table


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "info", run, "show what a checkpoint holds",
                    "Show a checkpoint's format version, the ranks that wrote it, its files, and its "
                    "keys: one line per top-level key (or per group, --depth) with its tensors, bytes "
                    "and other values; with --all every key with dtype, shape, bytes and number of "
                    "chunks (plain values with their type and value).",
                    CKPT, json_help="print JSON for machines (every key path under --only)")
    add_selection_options(p)


def _leaf_record(leaf: Leaf) -> dict[str, Any]:
    rec: dict[str, Any] = {"key": list(leaf.key), "path": leaf.dotted, "type": leaf.kind}
    e = leaf.entry
    if e is not None:
        rec.update(kind=e.kind, dtype=e.dtype, shape=list(e.shape), bytes=e.nbytes,
                   stored_bytes=sum(c.stored_nbytes for c in e.chunks), codecs=_codecs(e),
                   chunks=len(e.chunks), files=sorted({c.file for c in e.chunks}))
    elif leaf.kind in ("dict", "list", "tuple"):
        rec["value"] = [] if leaf.kind != "dict" else {}
    else:
        rec["value"] = leaf.node.get("v")  # JSON-safe: floats nan/inf as strings, bytes base64
        if leaf.kind == "npscalar":
            rec["dtype"] = leaf.node["dtype"]
    return rec


def _codecs(e: TensorEntry) -> list[str]:
    """The codecs a tensor's blocks are stored with (``["raw"]`` when uncompressed)."""
    return sorted({n for c in e.chunks for n in (c.stored.codecs if c.stored is not None else ("raw",))})


def describe(index: Index, path: str) -> dict[str, Any]:
    """Everything ``info`` shows, as plain JSON-serialisable data."""
    return {
        "path": path,
        "format_version": index.format_version,
        "library": index.library,
        "created": index.created,
        "world_size": index.world_size,
        "ranks": sorted({f.rank for f in index.files}),
        "block_size": index.block_size,
        "bytes": own_bytes(index),
        "referenced_bytes": referenced_bytes(index),
        "files": [{"name": f.name, "rank": f.rank, "bytes": f.size, "reference": f.reference is not None}
                  for f in index.files],
        "metadata": index.metadata,
        "leaves": [_leaf_record(leaf) for leaf in leaves(index)],
    }


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _VALUE_WIDTH else text[: _VALUE_WIDTH - 3] + "..."


def _print_text(d: dict[str, Any], index: Index, args: argparse.Namespace) -> None:
    tensors = [r for r in d["leaves"] if r["type"] == "tensor"]
    print(f"checkpoint   {d['path']}")
    print(f"format       version {d['format_version']} (written by {d['library'] or 'unknown'})")
    print(f"created      {local_time(d['created'])}")
    print(f"ranks        world size {d['world_size']}; data written by rank(s) "
          f"{', '.join(map(str, d['ranks'])) or '-'}")
    own = [f for f in d["files"] if not f["reference"]]
    print(f"files        {len(own)} data file(s), {human_bytes(d['bytes'])}")
    if len(own) < len(d["files"]):
        steps = sorted({f["name"].split("/", 1)[0] for f in d["files"] if f["reference"]})
        print(f"references   {human_bytes(d['referenced_bytes'])} of unchanged chunks in "
              f"{len(d['files']) - len(own)} data file(s) of {', '.join(steps)} (incremental save)")
    raw, stored = sum(r["bytes"] for r in tensors), sum(r["stored_bytes"] for r in tensors)
    compressed = any(r["codecs"] != ["raw"] for r in tensors)
    print(f"tensors      {len(tensors)} ({human_bytes(raw)}); "
          f"other values {len(d['leaves']) - len(tensors)}")
    if compressed:
        print(f"compression  {human_bytes(raw)} of tensors stored in {human_bytes(stored)} "
              f"({raw / max(stored, 1):.2f}x)")
    if d["metadata"]:
        print(f"metadata     {json.dumps(d['metadata'], sort_keys=True)}")
    print()
    pairs = [(leaf, r) for leaf, r in zip(leaves(index), d["leaves"])  # describe() lists the same leaves
             if within(leaf.dotted, args.only)]
    if not pairs:
        raise ValueError(f"no key path {args.only!r} in {args.ckpt}")
    if not args.all:
        _print_summary(pairs, args)
        return
    extra = ["STORED", "CODECS"] if compressed else []
    rows = [["KEY", "TYPE", "SHAPE", "BYTES", *extra, "CHUNKS", "VALUE"]]
    for leaf, r in pairs:
        e = leaf.entry
        if e is not None:
            more = [human_bytes(r["stored_bytes"]), ",".join(r["codecs"])] if compressed else []
            rows.append([leaf.dotted, e.dtype, str(list(e.shape)), human_bytes(e.nbytes), *more,
                         str(len(e.chunks)), ""])
        else:
            rows.append([leaf.dotted, leaf.kind, "", "", *([""] * len(extra)), "", _short(leaf.value())])
    for line in table(rows):
        print(line)


def _print_summary(pairs: list[tuple[Leaf, dict[str, Any]]], args: argparse.Namespace) -> None:
    """One row per group of key paths (``cli._summary``): its tensors, their bytes, its
    other values; a group of one leaf is that leaf's row."""
    rows = [["KEY", "TENSORS", "BYTES", "OTHER", "WHAT"]]
    for prefix, members in groups([leaf.dotted for leaf, _ in pairs], args.only, args.depth).items():
        got = [pairs[i][0] for i in members]
        ts = [leaf.entry for leaf in got if leaf.entry is not None]
        if len(got) == 1:
            leaf = got[0]
            what = f"{leaf.entry.dtype}{list(leaf.entry.shape)}" if leaf.entry is not None \
                else f"{leaf.kind} {_short(leaf.value())}"
            name = leaf.dotted
        else:
            what = ", ".join(sorted({e.dtype for e in ts}))
            name = label(prefix, len(got))
        rows.append([name, str(len(ts)), human_bytes(sum(e.nbytes for e in ts)) if ts else "-",
                     str(len(got) - len(ts)), what])
    for line in table(rows):
        print(line)
    print()
    print(f"{len(rows) - 1} group(s) of {len(pairs)} key path(s); --all lists every one, "
          f"--only PREFIX and --depth N choose the groups")


def run(args: argparse.Namespace) -> int:
    _, _, index = open_checkpoint(args.ckpt, storage_options(args))
    d = describe(index, args.ckpt)
    if args.json:
        if args.only:
            d["leaves"] = [r for leaf, r in zip(leaves(index), d["leaves"])
                           if within(leaf.dotted, args.only)]
        print(json.dumps(d, indent=2))
    else:
        _print_text(d, index, args)
    return EXIT_OK
