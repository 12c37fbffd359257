"""``shardsafe export CKPT OUT``: consolidate a checkpoint into one .safetensors or .pt file.

``.safetensors``: tensor keys are the dotted key paths (relative to ``--only``); plain
values (int, float, str, bool, None) are stored as JSON text in the header's
``__metadata__`` under their dotted key path; bytes, numpy scalars and empty containers
have no safetensors form and are skipped with a note on stderr. The file is written
tensor by tensor, so memory stays at about the largest tensor.

``.pt``: the nested structure as ``load`` returns it, loadable with
``torch.load(path, weights_only=True)``: numpy arrays become torch tensors and numpy
scalars Python numbers (weights-only unpickling admits neither).

Both are written to a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from . import EXIT_OK, UsageError
from ..values import torch as torch_values
from ._args import CKPT, add_command, add_quiet_option, open_checkpoint, storage_options
from ._output import progress
from ._tensors import as_torch, leaves, read_tensor, require_torch, subtree, without
from ..engine.load.reader import ChunkReader
from ..format.datafile import safetensors_header
from ..format.dtypes import lookup
from ..format.index.objects import Index
from ..format.tree import KeyPath, Node, decode_plain, render_path

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "half": "float16", "fp32": "float32", "float32": "float32", "float": "float32",
          "fp64": "float64", "float64": "float64", "double": "float64"}
_JSON_KINDS = ("int", "float", "str", "bool", "none")


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "export", run, "write a checkpoint as one .safetensors or .pt file",
                    "Consolidate CKPT into OUT: .safetensors (keys are dotted key paths; plain "
                    "values go to __metadata__ as JSON) or .pt (loadable with "
                    "torch.load(weights_only=True)).",
                    CKPT, ("out", "OUT", "output file (.safetensors, .pt or .pth)"),
                    json_help="print JSON for machines: the file written and the values left out or kept")
    p.add_argument("--exclude", metavar="KEY", action="append",
                   help="leave out this key of the exported subtree (repeatable), e.g. a Trainer "
                        "checkpoint's 'optimizer'")
    p.add_argument("--only", metavar="KEY", help="export only this subtree (e.g. 'model'); its "
                                                 "prefix is dropped from the exported keys")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="cast floating-point tensors")
    p.add_argument("--format", choices=("safetensors", "pt"), help="default: from OUT's suffix")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    add_quiet_option(p)


def _out_format(args: argparse.Namespace) -> str:
    if args.format:
        return args.format
    suffix = os.path.splitext(args.out)[1].lower()
    if suffix == ".safetensors":
        return "safetensors"
    if suffix in (".pt", ".pth", ".bin"):
        return "pt"
    raise UsageError(f"cannot tell the format of {args.out!r} from its suffix (.safetensors, .pt, .pth, "
                     f".bin); pass --format")


# floating-point dtypes torch cannot cast: two values packed per byte (shapes count bytes)
UNCASTABLE = ("float4_e2m1fn_x2",)


def _cast_to(saved: str, dtype: str | None) -> str:
    """The dtype a tensor saved as ``saved`` is exported as (``--dtype`` casts floating
    point; packed dtypes torch cannot cast stay as they are)."""
    if dtype is not None and saved not in UNCASTABLE and getattr(torch_values.torch, saved).is_floating_point:
        return dtype
    return saved


def _prepare(t: Any, dtype: str | None) -> Any:
    """A contiguous torch tensor, cast to ``dtype`` when it is floating point."""
    t = as_torch(t)
    return t.to(getattr(torch_values.torch, _cast_to(torch_values.torch_dtype_name(t.dtype), dtype))).contiguous()


def _relative(key: KeyPath, base: KeyPath) -> str:
    rel = key[len(base):]
    return render_path(rel) if rel else render_path(key)


def _st_header(index: Index, node: Node, base: KeyPath, dtype: str | None) -> tuple[bytes, list, list[str]]:
    """The safetensors header, the tensors to write in order, and the skipped key paths."""
    entries: list[tuple[str, str, tuple[int, ...], int]] = []
    meta: dict[str, str] = {}
    order, skipped, names = [], [], set()
    for leaf in leaves(index, node, base):
        name = _relative(leaf.key, base)
        if name in meta or name in names:
            raise ValueError(f"two key paths export as {name!r}; use .pt, which keeps the nesting")
        e = leaf.entry
        if e is None:
            if leaf.kind in _JSON_KINDS:
                meta[name] = json.dumps(leaf.value())
            else:
                skipped.append(f"{leaf.dotted} ({leaf.kind})")
            continue
        out_dtype = _cast_to(e.dtype, dtype)
        d = lookup(out_dtype)
        if d.safetensors is None:
            raise ValueError(f"{leaf.dotted}: safetensors has no dtype for {out_dtype}; export to .pt")
        n = d.itemsize
        for s in e.shape:
            n *= s
        entries.append((name, d.safetensors, e.shape, n))
        names.add(name)
        order.append((e, n))
    meta.setdefault("format", "pt")  # what transformers expects of torch weights
    # safetensors recommends an 8-byte aligned data section
    return safetensors_header(meta, entries, 8), order, skipped


def _write_safetensors(reader: ChunkReader, node: Node, base: KeyPath, out: str, dtype: str | None,
                       quiet: bool) -> list[str]:
    header, order, skipped = _st_header(reader.index, node, base, dtype)
    bar = progress(sum(n for _, n in order), "export", quiet)
    try:
        with open(out, "wb") as f:
            f.write(header)
            for entry, n in order:
                t = _prepare(read_tensor(reader, entry), dtype)
                # an empty tensor has no bytes (and from numpy a stride of 0, which no view takes)
                data = t.reshape(-1).view(torch_values.torch.uint8).numpy() if t.numel() else b""
                if len(data) != n:  # the header promised n bytes: never write a file that lies
                    raise ValueError(f"{render_path(entry.key)}: {len(data)} bytes, expected {n}")
                f.write(memoryview(data))
                bar.update(n)
            f.flush()
            os.fsync(f.fileno())
    finally:
        bar.close()
    return skipped


def _build_pt(reader: ChunkReader, node: Node, dtype: str | None) -> Any:
    """The nested value at ``node`` with only types weights-only unpickling admits."""
    t = node["t"]
    if t == "dict":
        return {k: _build_pt(reader, v, dtype) for k, v in zip(node["k"], node["v"])}
    if t in ("list", "tuple"):
        vals = [_build_pt(reader, v, dtype) for v in node["v"]]
        return tuple(vals) if t == "tuple" else vals
    if t == "tensor":
        return _prepare(read_tensor(reader, reader.index.tensors[node["id"]]), dtype)
    value = decode_plain(node)
    return value.item() if t == "npscalar" else value


def _check_out(out: str, overwrite: bool) -> None:
    """Refuses an ``out`` that exists (unless ``overwrite``) or is a directory, before
    anything is read."""
    if os.path.isdir(out):
        raise ValueError(f"{out!r} is a directory; OUT names the file to write")
    if os.path.lexists(out) and not overwrite:
        raise ValueError(f"{out!r} already exists; pass --overwrite to replace it")


def run(args: argparse.Namespace) -> int:
    require_torch("export")
    fmt = _out_format(args)
    if "://" in args.out:
        raise UsageError("export writes a local file; OUT must be a local path")
    _check_out(args.out, args.overwrite)
    storage, spath, index = open_checkpoint(args.ckpt, storage_options(args))
    try:
        node, base = subtree(index, args.only)
    except KeyError:
        raise ValueError(f"no key path {args.only!r} in {args.ckpt}") from None
    try:
        node = without(node, args.exclude)
    except KeyError as e:
        raise ValueError(f"--exclude {e.args[0]!r}: no such key under {args.only or 'the root'} "
                         f"of {args.ckpt}") from None
    dtype = DTYPES[args.dtype] if args.dtype else None
    reader = ChunkReader(storage, spath, index)
    tmp = f"{args.out}.tmp-{os.getpid()}"
    try:
        if fmt == "safetensors":
            skipped = _write_safetensors(reader, node, base, tmp, dtype, args.quiet)
        else:
            skipped = []
            torch_values.torch.save(_build_pt(reader, node, dtype), tmp)
        os.replace(tmp, args.out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    kept = [leaf.dotted for leaf in leaves(index, node, base)
            if dtype is not None and leaf.entry is not None and leaf.entry.dtype in UNCASTABLE]
    if args.json:
        print(json.dumps({"wrote": args.out, "format": fmt, "kept_dtype": kept, "skipped": skipped}))
        return EXIT_OK
    if kept:
        print(f"note: kept {len(kept)} packed tensor(s) in their own dtype (torch cannot cast "
              f"them): {', '.join(kept[:10])}{' ...' if len(kept) > 10 else ''}", file=sys.stderr)
    if skipped:
        print(f"note: skipped {len(skipped)} value(s) safetensors cannot hold: "
              f"{', '.join(skipped[:10])}{' ...' if len(skipped) > 10 else ''}", file=sys.stderr)
    print(f"wrote {args.out}")
    return EXIT_OK
