"""Between DCP's view of a checkpoint and shardsafe's: flat FQNs and key paths, plans and
the tensor table, ``Metadata`` and the index.

DCP flattens a state dict into fully qualified names (``model.layers.0.weight``) and keeps
each one's key path in the planner data (``("model", "layers", 0, "weight")``: strings
are dict keys, integers list positions). A save through ``Writer`` stores the nested
structure those key paths describe, so ``shardsafe.load`` returns the state dict as it
was; ``Reader`` flattens a checkpoint's structure the way DCP does (with DCP's own
``flatten_state_dict``), so the names match the state dict a ``dcp.load`` fills.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType

from ..errors import CheckpointError
from ..format.index.objects import Index
from ..format.tree import KeyPath, Node, build, encode_key
from ..plan.flatten import TensorItem
from ..values.torch import torch_dtype_name
from . import byte_items


def key_path(planner_data: Any, fqn: str) -> KeyPath:
    """The key path of ``fqn``: from DCP's planner data (FQN -> key path) when it has one,
    else the FQN itself as the only key (a planner that does not flatten)."""
    if isinstance(planner_data, Mapping):
        path = planner_data.get(fqn)
        if isinstance(path, (tuple, list)) and path and all(
                type(p) is str or type(p) is int for p in path):
            return tuple(path)
    return (fqn,)


@dataclass(slots=True)
class SaveTable:
    """What the coordinator decides for a save: the tensor table and where values go.

    Attributes:
        items: Every tensor of the checkpoint (global dtype and shape; no value).
        ids: Each tensor's id (its position in ``items``) by FQN.
        byte_paths: The key path of each byte item (a value DCP serialised itself), by FQN.
    """

    items: list[TensorItem]
    ids: dict[str, int]
    byte_paths: dict[str, KeyPath]


def save_table(plans: Sequence[SavePlan]) -> tuple[SaveTable, list[SavePlan]]:
    """The tensor table of every rank's plan, and the plans without the items an earlier
    rank's plan holds already (the same FQN and chunk offsets): each chunk is written once.

    Raises:
        ValueError: two plans disagree on a tensor's dtype or global shape.
    """
    table = SaveTable([], {}, {})
    seen: set[tuple[str, tuple[int, ...]]] = set()
    kept_plans = []
    for plan in plans:
        kept = []
        for wi in plan.items:
            fqn = wi.index.fqn
            if wi.type == WriteItemType.BYTE_IO:
                if fqn not in table.byte_paths:
                    table.byte_paths[fqn] = key_path(plan.planner_data, fqn)
                    kept.append(wi)
                continue
            td = wi.tensor_data
            dtype, shape = torch_dtype_name(td.properties.dtype), tuple(int(s) for s in td.size)
            if fqn not in table.ids:
                table.ids[fqn] = len(table.items)
                table.items.append(TensorItem(len(table.items), key_path(plan.planner_data, fqn), None,
                                              "torch", dtype, shape, (0,) * len(shape), replicated=False))
            it = table.items[table.ids[fqn]]
            if (it.dtype, it.shape) != (dtype, shape):
                raise ValueError(f"ranks disagree on {fqn!r}: {it.dtype}{list(it.shape)} against "
                                 f"{dtype}{list(shape)}")
            key = (fqn, tuple(int(o) for o in td.chunk.offsets))
            if key not in seen:
                seen.add(key)
                kept.append(wi)
        kept_plans.append(dataclasses.replace(plan, items=kept))
    return table, kept_plans


def build_tree(table: SaveTable, byte_nodes: Mapping[str, Node]) -> Node:
    """The structure tree of a save: tensor nodes, and each byte item's node (by FQN) at its
    key path.

    Raises:
        ValueError: a key path runs through a value (DCP's paths never do).
    """
    root: dict[Any, Any] = {}
    leaves: list[tuple[KeyPath, Node]] = [(it.path, {"t": "tensor", "id": it.id}) for it in table.items]
    leaves += [(path, byte_nodes[fqn]) for fqn, path in table.byte_paths.items()]
    for path, node in leaves:
        at = root
        for k in path[:-1]:
            at = at.setdefault(k, {})
            if not isinstance(at, dict):
                raise ValueError(f"key path {path!r} runs through a value")
        if path[-1] in at:
            raise ValueError(f"two values at key path {path!r}")
        at[path[-1]] = _Leaf(node)
    return _node(root, ())


@dataclass(frozen=True, slots=True)
class _Leaf:
    node: Node


def _node(level: Any, path: KeyPath) -> Node:
    if isinstance(level, _Leaf):
        return level.node
    if level and all(type(k) is int for k in level):  # list positions
        size = max(level) + 1
        return {"t": "list", "v": [_node(level[i], path + (i,)) if i in level else {"t": "none"}
                                   for i in range(size)]}
    keys = list(level)
    return {"t": "dict", "k": [encode_key(k, path) for k in keys],
            "v": [_node(level[k], path + (k,)) for k in keys]}


@dataclass(slots=True)
class DcpView:
    """A checkpoint as DCP sees it: its ``Metadata``, and where each FQN's data is.

    Attributes:
        metadata: What ``Reader.read_metadata`` returns.
        tensors: Index of each tensor FQN's entry in ``index.tensors``.
        values: Each byte FQN's value, as stored (a typed value, or a pickle's bytes).
        pickles: The byte FQNs whose values are stored pickles (``byte_items.is_pickle``).
    """

    metadata: Metadata
    tensors: dict[str, int]
    values: dict[str, Any]
    pickles: frozenset[str]


def view(index: Index, checkpoint_id: str) -> DcpView:
    """DCP's view of ``index``: every leaf of the structure under the FQN DCP would give it.

    Raises:
        CorruptCheckpointError: The index's DCP record is malformed.
    """
    rec = byte_items.parse_record(index.metadata, checkpoint_id)
    placeholders: dict[int, int] = {}  # id(meta tensor) -> tensor entry

    def leaf(_: KeyPath, node: Node) -> Any:
        e = index.tensors[node["id"]]
        t = torch.empty(e.shape, dtype=getattr(torch, e.dtype), device="meta")
        placeholders[id(t)] = node["id"]
        return t

    skeleton = build(index.tree, leaf)
    try:
        flat, mappings = flatten_state_dict(skeleton)
    except ValueError as e:  # two keys with one text (1 and "1"): DCP names leaves by text
        raise CheckpointError(f"{checkpoint_id!r} cannot be presented to DCP: {e}") from None
    props = rec.properties if rec is not None else {}
    sd_md: dict[str, Any] = {}
    tensors: dict[str, int] = {}
    values: dict[str, Any] = {}
    for fqn, value in flat.items():
        if isinstance(value, torch.Tensor):
            tid = tensors[fqn] = placeholders[id(value)]
            sd_md[fqn] = _tensor_md(index, tid, props.get(fqn, {}))
        else:
            values[fqn] = value
            sd_md[fqn] = BytesStorageMetadata()
    md = Metadata(state_dict_metadata=sd_md, planner_data=mappings,
                  storage_meta=StorageMeta(checkpoint_id=checkpoint_id),
                  version=rec.version if rec is not None else None)
    pickles = frozenset(f for f, v in values.items() if byte_items.is_pickle(rec, f, v))
    return DcpView(md, tensors, values, pickles)


def _tensor_md(index: Index, tid: int, props: Mapping[str, Any]) -> TensorStorageMetadata:
    e = index.tensors[tid]
    return TensorStorageMetadata(
        properties=TensorProperties(dtype=getattr(torch, e.dtype),
                                    requires_grad=props.get("requires_grad") is True,
                                    pin_memory=props.get("pin_memory") is True),
        size=torch.Size(e.shape),
        chunks=[ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.shape))
                for c in e.chunks])


__all__ = ["DcpView", "SaveTable", "build_tree", "key_path", "save_table", "view"]
