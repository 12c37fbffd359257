"""A 4x2-mesh checkpoint restored onto other meshes and layouts, reading only each
device's boxes."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from jax_states import assert_same_tree, bits, put

import shardsafe
from shardsafe.api.load import read_checkpoint_index
from shardsafe.engine.load.placers import jax_arrays as jax_restore


@pytest.fixture(scope="module")
def saved(mesh42, tmp_path_factory):
    state = {"w": put(bits(64 * 24, "float32", 0).reshape(64, 24), mesh42, P("dp", "tp")),
             "e": put(bits(32 * 8, "bfloat16", 1).reshape(32, 8), mesh42, P("dp", None)),
             "b": put(bits(24, "int8", 2), mesh42, P()),
             "step": 5}
    path = str(tmp_path_factory.mktemp("reshard") / "ckpt")
    shardsafe.save(state, path)
    return state, path


def _meshes():
    d = jax.devices()
    return {"8x1": (jax.make_mesh((8, 1), ("dp", "tp")), P("dp", "tp")),
            "2x2": (jax.sharding.Mesh(np.array(d[:4]).reshape(2, 2), ("dp", "tp")), P("dp", "tp")),
            "4x2 other spec": (jax.make_mesh((4, 2), ("dp", "tp")), P("tp", "dp")),
            "4x2 transposed": (jax.make_mesh((4, 2), ("dp", "tp")), P(None, ("dp", "tp")))}


@pytest.mark.parametrize("layout", list(_meshes()) + ["1 device"])
def test_restores_onto_another_layout(saved, layout: str) -> None:
    state, path = saved

    def target(x):
        if layout == "1 device":
            sh = SingleDeviceSharding(jax.devices()[3])
        else:
            mesh, spec = _meshes()[layout]
            sh = NamedSharding(mesh, P(*spec[: x.ndim]) if x.ndim < 2 else spec)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)

    tgt = {k: target(v) if isinstance(v, jax.Array) else 0 for k, v in state.items()}
    restored = shardsafe.load(path, tgt)
    assert_same_tree(restored, state)
    for k in ("w", "e", "b"):
        assert restored[k].sharding == tgt[k].sharding
        for s in restored[k].addressable_shards:  # each device holds its own box
            assert np.asarray(s.data).tobytes() == np.asarray(state[k])[s.index].tobytes()


def test_reads_each_distinct_box_once(saved) -> None:
    _, path = saved
    index = read_checkpoint_index(path)
    mesh = jax.make_mesh((4, 2), ("dp", "tp"))
    w = jax.ShapeDtypeStruct((64, 24), np.float32, sharding=NamedSharding(mesh, P("dp", None)))
    one = jax.ShapeDtypeStruct((64, 24), np.float32, sharding=NamedSharding(mesh, P(None, "tp")))
    plan = jax_restore.plan(index, {"w": w})
    # 8 devices, 4 distinct row blocks: 4 reads of a quarter each, never the whole tensor
    assert sorted(r.offsets for r in plan.reads) == [(0, 0), (16, 0), (32, 0), (48, 0)]
    assert all(r.host.shape == (16, 24) for r in plan.reads)
    cols = jax_restore.plan(index, {"w": one}).reads
    assert sorted((r.offsets, r.host.shape) for r in cols) == [((0, 0), (64, 12)), ((0, 12), (64, 12))]
