"""Async saves of JAX states: the shards are taken without a copy on the CPU backend,
staged after the call returns, and stay what was saved even if the next step donates
the arrays."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import PartitionSpec as P
from jax_states import bits, put

import shardsafe
from shardsafe.comm import SingleProcessComm
from shardsafe.engine.save import prepare as planning
from shardsafe.engine.save.request import SaveRequest
from shardsafe.plan.localize import immutable


def prepare(state: dict, path: str) -> planning.PreparedSave:
    """The plan of a one-process save of ``state`` (what the save pipeline runs)."""
    return planning.prepare(SaveRequest(state=state, path=path), SingleProcessComm(), None)


def _items(prep):
    return [it for p in prep.plans for it in p.items]


def test_shards_are_views_of_the_device_buffers_and_immutable(mesh42, tmp_path) -> None:
    x = put(bits(32 * 8, "float32", 0).reshape(32, 8), mesh42, P("dp", None))
    prep = prepare({"x": x, "step": 1}, str(tmp_path / "a"))
    items = _items(prep)
    assert len(items) == 4 and immutable(items)  # 4 row blocks, each on 2 devices, taken once
    buffers = {s.data.unsafe_buffer_pointer() for s in x.addressable_shards if s.replica_id == 0}
    assert {it.value.ctypes.data for it in items} == buffers
    mixed = prepare({"x": x, "host": np.zeros(3)}, str(tmp_path / "b"))
    assert not immutable(_items(mixed))  # a numpy array can change: staged before returning


def test_a_donated_array_keeps_the_buffers_a_save_holds(mesh42, tmp_path) -> None:
    x = put(bits(64 * 16, "float32", 1).reshape(64, 16), mesh42, P("dp", "tp"))
    want = np.asarray(x).copy()
    prep = prepare({"x": x}, str(tmp_path / "c"))  # what an async save holds while it runs
    step = jax.jit(lambda a: a * 2 + 1, donate_argnums=0)
    y = step(x).block_until_ready()  # the next training step donates its input
    assert not x.is_deleted()  # JAX copied instead: views of the buffers are alive
    got = np.zeros_like(want)
    for it in _items(prep):
        got[tuple(slice(o, o + n) for o, n in zip(it.offsets, it.local_shape))] = it.value
    assert got.tobytes() == want.tobytes() and np.asarray(y)[0, 0] == want[0, 0] * 2 + 1
    want_y = np.asarray(y).copy()
    h = shardsafe.async_save({"x": y}, str(tmp_path / "d"))
    step(y).block_until_ready()  # while the save may still be writing
    h.result()
    assert shardsafe.load(str(tmp_path / "d"))["x"].tobytes() == want_y.tobytes()
