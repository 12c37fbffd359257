"""JAX support: sharded ``jax.Array`` pytrees in the same checkpoint format as torch states.

Saving needs nothing from this package: ``shardsafe.save``/``async_save`` and
``CheckpointManager`` take JAX pytrees (dicts, lists, tuples, NamedTuples, dataclasses
and other nodes registered with ``jax.tree_util``; ``jax.Array``, numpy arrays and
plain values as leaves). Each process writes the shards of every array it addresses,
one per distinct box (a replicated box once), as chunks of the global array.

``shardsafe.load(path, target)`` with a target holding ``jax.Array`` or
``jax.ShapeDtypeStruct`` leaves returns the restored pytree, each array on its
target's sharding, whatever mesh and layout it was saved from (``shardsafe.engine.load.placers.jax_arrays``).

Key paths: see ``state_dict_names``; docs/guides/jax.md has the whole mapping.
"""

from __future__ import annotations

from typing import Any

from ..values import jax as jax_values
from ..format.tree import render_path as _render_path


def state_dict_names(tree: Any) -> list[str]:
    """The PyTorch ``state_dict`` name of every leaf of a JAX pytree, in the order of
    ``jax.tree_util.tree_leaves(tree)``: the dotted key path a checkpoint stores it under
    (``{"params": {"dense": {"kernel": x}}}`` -> ``["params.dense.kernel"]``; a NamedTuple's
    fields count by position)."""
    jax = jax_values.imported()
    if jax is None:
        raise TypeError("state_dict_names needs JAX (import jax first)")
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys, node = [], tree
        for entry in path:
            keys.append(jax_values.key_of(entry, node))
            node = _child(node, entry)
        out.append(_render_path(tuple(keys)))
    return out


def _child(node: Any, entry: Any) -> Any:
    jtu = jax_values.imported().tree_util
    if isinstance(entry, jtu.DictKey):
        return node[entry.key]
    if isinstance(entry, jtu.SequenceKey):
        return node[entry.idx]
    if isinstance(entry, jtu.GetAttrKey):
        return getattr(node, entry.name)
    return jax_values.children(node)[1][entry.key]  # FlattenedIndexKey: registered without keys


__all__ = ["state_dict_names"]
