"""DCP's byte items: how the values DCP serialises are stored, and what a load hands back.

DCP serialises every value of a state dict that is not a tensor (``step``, a learning
rate, a list of strings, a ``torch.Size``) with ``torch.save`` into a *byte item*, and
its ``DefaultLoadPlanner`` deserialises what a ``StorageReader`` returns for one with
``torch.load(weights_only=False)``: full unpickling, which runs any code the bytes name.

- A save through ``Writer`` decodes each byte item with ``torch.load(weights_only=True)``
  (PyTorch's restricted unpickler, which builds only plain values, containers and
  tensors) and stores the value as a typed tree node, as ``shardsafe.save`` stores plain
  values. A value the restricted unpickler refuses, or one holding tensors (which the
  tree keeps only in the tensor table, fixed before DCP hands over its byte items), is
  kept as the bytes DCP wrote and named in the index's DCP record (``pickles``); a value
  that was ``bytes`` in the state is named there too (``bytes``).
- A load through ``Reader`` hands DCP only bytes that shardsafe serialised itself from a
  decoded typed value. In a checkpoint with a DCP record, a ``bytes`` value is served
  only if the record names it under ``bytes``: a stored pickle (named in ``pickles``),
  any ``bytes`` value the record does not name, and every ``bytes`` value of a record
  that predates typed byte items is refused with a ``CheckpointError`` naming the key,
  unless the reader was made with ``allow_pickle=True`` (then the bytes are handed to
  DCP as they are). A checkpoint without a DCP record (``shardsafe.save``) holds no DCP
  pickles: its ``bytes`` values are values, served like any other.

The DCP record (``index.metadata["dcp"]``) is untrusted input: ``parse_record`` accepts
exactly what ``record`` writes and raises ``CorruptCheckpointError`` for anything else.
"""

from __future__ import annotations

import io
from pickle import UnpicklingError
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from ..errors import CorruptCheckpointError
from ..format.tree import Node, encode_plain
from ..plan.flatten import flatten

DCP_KEY = "dcp"  # the index metadata member a Writer save records DCP's metadata under
TYPED = "typed"  # the record's "byte_items": byte items are stored as typed values
PROPERTIES = ("requires_grad", "pin_memory")  # tensor properties kept when not the default
_VERSION = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9}){0,3}")


def encode(raw: bytes) -> Node | None:
    """The typed tree node of the value DCP serialised into ``raw``, or None to keep ``raw``
    as an opaque pickle (the restricted unpickler refuses it, or it holds tensors)."""
    try:
        value = torch.load(io.BytesIO(raw), weights_only=True)
    except (UnpicklingError, RuntimeError, EOFError):
        return None
    try:
        node, tensors = flatten({"v": value})
    except TypeError:  # a value of a type the tree does not store (complex, a slice, ...)
        return None
    return None if tensors else node["v"][0]


def opaque(raw: bytes) -> Node:
    """The tree node of a byte item kept as DCP wrote it."""
    node = encode_plain(raw, ())
    assert node is not None
    return node


def record(metadata: Metadata, pickles: Iterable[str], raw: Iterable[str]) -> dict[str, Any]:
    """What a save keeps of DCP's ``Metadata`` (as JSON, never pickled): its version, the
    tensor properties that differ from the defaults, which byte items are pickles and
    which were ``bytes`` values."""
    props: dict[str, dict[str, bool]] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            p = {k: True for k in PROPERTIES if getattr(md.properties, k, False)}
            if p:
                props[fqn] = p
    return {"version": metadata.version, "properties": props, "byte_items": TYPED,
            "pickles": sorted(pickles), "bytes": sorted(raw)}


@dataclass(frozen=True, slots=True)
class Record:
    """A validated DCP record.

    Attributes:
        version: DCP's metadata version, if recorded.
        properties: Tensor properties by FQN (only ``True`` ones).
        typed: Byte items are typed values (else every ``bytes`` value is DCP's pickle).
        pickles: FQNs of the byte items kept as pickles.
        raw: FQNs of the byte items whose values were ``bytes``.
    """

    version: str | None
    properties: Mapping[str, Mapping[str, bool]]
    typed: bool
    pickles: frozenset[str]
    raw: frozenset[str]


def parse_record(metadata: Any, where: str) -> Record | None:
    """The DCP record of an index's metadata (None when it has none).

    Raises:
        CorruptCheckpointError: The record is not what ``record`` writes.
    """
    if not isinstance(metadata, Mapping) or DCP_KEY not in metadata:
        return None
    rec = metadata[DCP_KEY]

    def bad(what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"{where}: the DCP record (metadata {DCP_KEY!r}) {what}")

    if not isinstance(rec, Mapping):
        raise bad(f"is a {type(rec).__name__}, not an object")
    unknown = set(rec) - {"version", "properties", "byte_items", "pickles", "bytes"}
    if unknown:
        raise bad(f"has unknown members {sorted(map(str, unknown))[:5]}")
    version = rec.get("version")
    if version is not None and not (isinstance(version, str) and _VERSION.fullmatch(version)):
        raise bad(f"has a bad version {version!r:.60}")
    props = rec.get("properties", {})
    if not isinstance(props, Mapping):
        raise bad(f"has properties of type {type(props).__name__}, not an object")
    for fqn, p in props.items():
        if not (isinstance(p, Mapping) and set(p) <= set(PROPERTIES)
                and all(v is True for v in p.values())):
            raise bad(f"has bad properties for {fqn!r:.80}: {p!r:.80}")
    typed = rec.get("byte_items")
    if typed not in (None, TYPED):
        raise bad(f"has an unknown byte_items {typed!r:.40}")
    lists = {}
    for member in ("pickles", "bytes"):
        names = lists[member] = rec.get(member, [])
        if not (isinstance(names, list) and all(isinstance(f, str) for f in names)):
            raise bad(f"has a {member} member that is not a list of strings")
        if names and typed is None:
            raise bad(f"names {member} without byte_items")
    return Record(version, props, typed == TYPED, frozenset(lists["pickles"]), frozenset(lists["bytes"]))


def is_pickle(rec: Record | None, fqn: str, value: Any) -> bool:
    """Whether the value of byte item ``fqn`` is a stored pickle (never deserialised by
    shardsafe, and handed to DCP only with ``allow_pickle=True``)."""
    if rec is None or not isinstance(value, bytes):
        return False
    return not (rec.typed and fqn in rec.raw and fqn not in rec.pickles)


def serialise(value: Any) -> bytes:
    """The bytes ``Reader`` hands DCP for a typed value (DCP deserialises them)."""
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


__all__ = ["DCP_KEY", "Record", "encode", "is_pickle", "opaque", "parse_record", "record", "serialise"]
