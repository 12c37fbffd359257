"""jax.Array pytrees saved and restored bit-exactly: every value kind and dtype, shards
written once per replica group, restored onto the target's sharding."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax_states import DTYPES, Adam, TrainState, assert_same_tree, bits, put, train_state

import shardsafe
from shardsafe.api.load import read_checkpoint_index
from shardsafe.jax import state_dict_names


@pytest.fixture(scope="module")
def saved(mesh42, tmp_path_factory):
    """One checkpoint of a TrainState (NamedTuple and dataclass inside) plus every dtype,
    every kind of sharding, numpy arrays and plain values."""
    state = {"train": train_state(mesh42),
             "dtypes": {d: put(bits(8 * 4, d, i).reshape(8, 4), mesh42, P("dp", "tp"))
                        for i, d in enumerate(DTYPES)},
             "layouts": {"rows": put(bits(40 * 6, "float32", 1).reshape(40, 6), mesh42, P("dp")),
                         "cols": put(bits(8 * 10, "int32", 2).reshape(8, 10), mesh42, P(None, "tp")),
                         "both": put(bits(12 * 4 * 3, "float16", 3).reshape(12, 4, 3), mesh42, P("tp", None, None)),
                         "uneven": jnp.asarray(bits(7 * 5, "float32", 4).reshape(7, 5)),
                         "scalar": jnp.asarray(2.5, jnp.float32), "empty": jnp.zeros((0, 3), jnp.float32)},
             "host": {"np": bits(9, "float64", 5), "np_bf16": bits(6, "bfloat16", 6), "lst": [1, "a", None],
                      "tup": (1.5, b"x"), "none": None}}
    path = str(tmp_path_factory.mktemp("jax") / "ckpt")
    shardsafe.save(state, path)
    return state, path


def test_restores_every_value_kind_and_dtype_bit_exactly(saved) -> None:
    state, path = saved
    restored = shardsafe.load(path, state)
    assert_same_tree(restored, state)
    for d in DTYPES:
        assert np.asarray(restored["dtypes"][d]).dtype == np.dtype(getattr(ml_dtypes, d, None) or d)
    assert type(restored["train"]) is TrainState and type(restored["train"].opt) is Adam
    got, want = restored["train"].params["dense"]["kernel"], state["train"].params["dense"]["kernel"]
    assert got.sharding == want.sharding and isinstance(got, jax.Array)


@pytest.mark.parametrize("compression", ["zstd", "auto"])
def test_every_dtype_round_trips_compressed(mesh42, tmp_path, compression: str) -> None:
    # shards of 64 Ki elements: large enough to be compressed (plan.CODED_MIN)
    state = {d: put(bits(512 * 1024, d, i).reshape(512, 1024), mesh42, P("dp", "tp")) for i, d in enumerate(DTYPES)}
    shardsafe.save(state, str(tmp_path / "c"), compression=compression)
    index = read_checkpoint_index(str(tmp_path / "c"))
    assert all(c.file.endswith(".blocks") for t in index.tensors for c in t.chunks)  # (random bits: stored raw)
    assert_same_tree(shardsafe.load(str(tmp_path / "c"), state), state)


def test_each_distinct_shard_is_written_once(saved) -> None:
    _, path = saved
    index = read_checkpoint_index(path)
    chunks = {t.key: [(c.offsets, c.shape) for c in t.chunks] for t in index.tensors}
    # P("dp", "tp") on 4x2: 8 boxes; P("dp", None): 4 boxes, each on 2 devices, written once
    assert len(chunks[("train", "params", "dense", "kernel")]) == 8
    assert sorted(chunks[("train", "params", "embed")]) == [((r, 0), (32, 16)) for r in (0, 32, 64, 96)]
    assert chunks[("train", "params", "dense", "bias")] == [((0,), (32,))]  # replicated: once
    assert len(chunks[("layouts", "cols")]) == 2
    total = sum(t.nbytes for t in index.tensors)
    written = sum(c.nbytes for t in index.tensors for c in t.chunks)
    assert written == total
    assert {t.kind for t in index.tensors if t.key[0] in ("train", "dtypes", "layouts")} == {"jax"}


def test_load_without_a_target_gives_host_arrays(saved) -> None:
    state, path = saved
    plain = shardsafe.load(path)
    assert isinstance(plain["train"]["params"]["embed"], np.ndarray)
    assert plain["train"]["params"]["embed"].dtype == ml_dtypes.bfloat16
    assert np.asarray(state["train"].params["embed"]).tobytes() == plain["train"]["params"]["embed"].tobytes()
    assert plain["train"]["opt"][2] == np.asarray(7, np.int32)  # a NamedTuple's fields by position
    assert plain["host"]["lst"] == [1, "a", None] and plain["host"]["tup"] == (1.5, b"x")


def test_restore_into_abstract_targets_on_another_sharding(saved, mesh42) -> None:
    state, path = saved
    target = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh42, P())), state["train"])
    restored = shardsafe.load(path, {"train": target}, strict=False)
    assert_same_tree(restored["train"], state["train"])
    assert restored["train"].params["dense"]["kernel"].sharding.spec == P()


def test_strict_load_names_the_mismatches(saved, mesh42) -> None:
    state, path = saved
    wrong = {"train": train_state(mesh42), "dtypes": {"float32": jnp.zeros((8, 5), jnp.float32)}}
    with pytest.raises(shardsafe.StateMismatchError) as e:
        shardsafe.load(path, wrong)
    assert "dtypes.float32: target float32[8, 5], checkpoint float32[8, 4]" in str(e.value)
    assert "missing" not in str(e.value) and "unexpected in checkpoint (absent from target): layouts" in str(e.value)


def test_unsupported_dtypes_and_arrays_are_refused_by_key_path(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"key path 'a\.b'.*int2"):
        shardsafe.save({"a": {"b": np.zeros(3, ml_dtypes.int2)}}, str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x")


def test_state_dict_names_are_the_dotted_key_paths(mesh42) -> None:
    s = train_state(mesh42)
    names = state_dict_names({"train": s})
    assert names[:3] == ["train.params.dense.bias", "train.params.dense.kernel", "train.params.embed"]
    assert "train.opt.0.dense.kernel" in names and names[-1] == "train.step"
    assert len(names) == len(jax.tree_util.tree_leaves(s))
