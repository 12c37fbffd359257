"""Forged inputs for shardsafe.dcp.Reader: pickles that would create a sentinel file if
anything unpickled them, placed in a checkpoint's values and in its DCP record (the index
is re-encoded, so its checksum is valid)."""

from __future__ import annotations

import base64
import dataclasses
import io
import os
import random
from typing import Any

import torch

from shardsafe.format.index.versions import decode_index, encode_index

INDEX = "index.json"


class _Payload:
    """Unpickling this runs ``open(path, "w")``: the sentinel file appears."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.path!r}, 'w').close()",))


def torch_bytes(value: Any) -> bytes:
    """What DCP writes for a byte item holding ``value`` (``torch.save``)."""
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def payload(sentinel: str) -> bytes:
    """What DCP would write for a value whose unpickling creates ``sentinel``."""
    return torch_bytes(_Payload(sentinel))


def bytes_node(raw: bytes) -> dict[str, Any]:
    return {"t": "bytes", "v": base64.b64encode(raw).decode("ascii")}


def rewrite(ckpt: str, *, metadata: Any = None, leaves: dict[str, dict[str, Any]] | None = None,
            drop_metadata: bool = False) -> None:
    """Re-encodes ``ckpt``'s index (same format version) with ``metadata`` as its metadata
    and each top-level key of ``leaves`` replaced by the given tree node."""
    path = os.path.join(ckpt, INDEX)
    with open(path, "rb") as f:
        idx = decode_index(f.read())
    tree = idx.tree
    if leaves:
        keys, vals = list(tree["k"]), list(tree["v"])
        for k, node in leaves.items():
            vals[keys.index(k)] = node
        tree = {**tree, "v": vals}
    md = {} if drop_metadata else (idx.metadata if metadata is None else metadata)
    with open(path, "wb") as f:
        f.write(encode_index(dataclasses.replace(idx, tree=tree, metadata=md), version=idx.format_version))


def random_record(rng: random.Random, sentinel: str, fqns: list[str]) -> Any:
    """A DCP record as a forger might write it: wrong types, pickles in its strings, lists
    naming values, or a well-formed one."""
    text = payload(sentinel).decode("latin-1")
    fqn = rng.choice(fqns)
    choices: list[Any] = [
        [1, 2], 7, "x", text, None, {"version": text}, {"version": 5}, {"version": "1.0.0"},
        {"properties": [fqn]}, {"properties": 3}, {"properties": text}, {"properties": {fqn: "yes"}},
        {"properties": {fqn: ["requires_grad"]}}, {"properties": {fqn: {"requires_grad": text}}},
        {"properties": {fqn: {"requires_grad": 1}}}, {"properties": {fqn: {"evil": True}}},
        {"byte_items": "typed", "pickles": fqn}, {"byte_items": "typed", "pickles": [fqn]},
        {"byte_items": "typed", "pickles": [1]}, {"byte_items": text}, {"pickles": [fqn]},
        {"byte_items": "typed", "pickles": [], "extra": text}, {"version": "1.0.0", "properties": {}},
        {"version": "1.0.0", "properties": {}, "byte_items": "typed", "pickles": []},
    ]
    return rng.choice(choices)
