"""This process's part of every sharded value of a state: a DTensor's box, a ``jax.Array``'s shards.

``localize`` turns DTensor items into this rank's box (local tensor, offsets) and
records who else holds that very box. A holder tuple per item means:

* ``None``: a plain tensor, held by every rank that has its key path (the replicated
  convention, restricted to those ranks);
* ``()``: an empty box (uneven sharding left this rank nothing): nothing to write;
* ``(rank,)``: only this rank holds the box; it writes it;
* ``(a, b, ...)``: these ranks hold identical boxes; the planner picks one writer.

``flatten`` makes one item of a ``jax.Array`` (its global shape: the index's tensor
table). ``write_items`` replaces it, for writing, by one item per distinct box this
process addresses, each holding that box's host copy at its offsets: the chunks of the
tensor, written like a DTensor's shards (same files, checksums and commit). Replicated
boxes are written once, by the shard whose ``replica_id`` is 0.

In a multi-process ``jax.distributed`` job an array spans processes; JAX gives each
distinct box ``replica_id`` 0 on exactly one device of the job, so the processes' written
shards never overlap and together cover the array: ``localize_spanning`` tells the
collective planner that each process alone holds its part (no writer has to be chosen),
and ``check_alone`` refuses such an array in a save of one process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..format.tree import render_path
from ..values import dtensor, jax as jax_values
from .flatten import TensorItem

Holders = tuple[int, ...] | None


def localize(items: Sequence[TensorItem], group_rank: Callable[[int], int]) -> list[Holders]:
    """Replaces each DTensor item's value by this rank's box; returns the holders per item.

    Args:
        items: Flattened items; DTensor items are modified in place (``value`` becomes
            the local tensor, ``offsets`` its position, ``replicated`` False).
        group_rank: Maps a default-group rank to a rank of the saving group (-1 if absent).

    Raises:
        TypeError: a DTensor cannot be saved (Partial placement, mesh outside the group).
    """
    out: list[Holders] = []
    for it in items:
        if not dtensor.is_dtensor(it.value):
            out.append(None)
            continue
        key = render_path(it.path)
        box = dtensor.local_shard(it.value, key)
        holders = tuple(sorted(group_rank(h) for h in box.holders))
        if holders and holders[0] < 0:
            raise TypeError(f"DTensor at key path {key!r} lives on a device mesh with ranks outside "
                            f"the process group that saves it")
        it.value, it.offsets, it.replicated = box.local, box.offsets, False
        out.append(holders if box.numel else ())
    return out


class JaxShard(TensorItem):
    """An item holding one shard of a ``jax.Array`` on the host: a private device-to-host
    copy, or on the CPU backend a view of the array's own buffer. Either way nothing the
    caller does can change it (JAX arrays are immutable, and a buffer a view refers to
    is not donated), so a save may copy it out of the caller's way, after returning."""

    __slots__ = ()


def immutable(items: Sequence[TensorItem]) -> bool:
    """Whether every item is a ``JaxShard`` (the caller cannot change what is saved)."""
    return all(type(it) is JaxShard for it in items)


def _arrays(items: Sequence[TensorItem]) -> list[TensorItem]:
    """The items that hold a whole ``jax.Array``."""
    return [it for it in items if it.kind == "jax" and jax_values.is_array(it.value)]


def write_items(items: Sequence[TensorItem]) -> list[TensorItem]:
    """``items`` with each ``jax.Array`` item replaced by its written shards (same ``id``)."""
    jax_items = _arrays(items)
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


def check_alone(items: Sequence[TensorItem]) -> None:
    """Refuses arrays spanning processes in a save that only this process makes.

    Raises:
        TypeError: an array spans processes (the message names its key path).
    """
    for it in _arrays(items):
        jax_values.check_addressable(it.value, f"jax.Array at key path {render_path(it.path)!r}")


def localize_spanning(items: Sequence[TensorItem], holders: list[Holders], rank: int,
                      world_size: int) -> None:
    """Marks each array spanning processes as this process's own part (its ``replica_id``
    0 shards; nothing where it has none) in ``holders``, for the collective planner.

    Raises:
        TypeError: an array spans processes but the saving group is not the JAX job
            (its ranks must be the JAX processes, in order).
    """
    for i, it in enumerate(items):
        if it.kind != "jax" or not jax_values.spans_processes(it.value):
            continue
        if jax_values.job_position() != (rank, world_size):
            raise TypeError(f"jax.Array at key path {render_path(it.path)!r} spans processes: the "
                            f"ranks of the saving group must be the processes of the jax.distributed "
                            f"job (rank {rank} of {world_size} is process {jax_values.job_position()})")
        holders[i] = (rank,) if jax_values.writes_a_shard(it.value) else ()
        it.replicated = False
