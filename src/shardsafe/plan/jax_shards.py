"""The shards of each ``jax.Array`` item that this process writes.

``flatten`` makes one item of a ``jax.Array`` (its global shape: the index's tensor
table). ``write_items`` replaces it, for writing, by one item per distinct box this
process addresses, each holding that box's host copy at its offsets: the chunks of the
tensor, written like a DTensor's shards (same files, checksums and commit). Replicated
boxes are written once, by the shard whose ``replica_id`` is 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import jax_values
from .flatten import TensorItem


class JaxShard(TensorItem):
    """An item holding one shard of a ``jax.Array`` on the host: a private device-to-host
    copy, or on the CPU backend a view of the array's own buffer. Either way nothing the
    caller does can change it (JAX arrays are immutable, and a buffer a view refers to
    is not donated), so a save may copy it out of the caller's way, after returning."""

    __slots__ = ()


def immutable(items: Sequence[TensorItem]) -> bool:
    """Whether every item is a ``JaxShard`` (the caller cannot change what is saved)."""
    return all(type(it) is JaxShard for it in items)


def write_items(items: Sequence[TensorItem]) -> list[TensorItem]:
    """``items`` with each ``jax.Array`` item replaced by its written shards (same ``id``)."""
    jax_items = [it for it in items if it.kind == "jax" and jax_values.is_array(it.value)]
    if not jax_items:
        return list(items)
    shards = dict(zip(map(id, jax_items), jax_values.written_shards([it.value for it in jax_items])))
    out: list[TensorItem] = []
    for it in items:
        per = shards.get(id(it))
        if per is None:
            out.append(it)
            continue
        out.extend(JaxShard(it.id, it.path, host, "jax", it.dtype, it.shape, offsets, False)
                   for offsets, host in per)
    return out
