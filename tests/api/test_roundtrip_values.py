"""save -> load round-trips every dtype and value kind exactly, with types kept."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.format.dtypes import DTYPES

from helpers import assert_same
from roundtrip_helpers import random_tensor

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

# (the format's ml_dtypes-only types, JAX's, round-trip in tests/jax)
TORCH_DTYPES = [getattr(torch, n) for n in sorted(DTYPES) if DTYPES[n].torch]
SHAPES = [(), (0,), (3, 0, 2), (5,), (4, 7)]


def roundtrip(state: dict, tmp_path, name: str = "ckpt", **load_kw) -> dict:
    path = os.path.join(tmp_path, name)
    shardsafe.save(state, path)
    return shardsafe.load(path, **load_kw)


@pytest.mark.parametrize("mmap", [False, True])
def test_every_torch_dtype_and_shape(tmp_path, mmap: bool) -> None:
    state = {str(dt).removeprefix("torch."): {str(s): random_tensor(dt, s, seed=i)
                                               for i, s in enumerate(SHAPES)}
             for dt in TORCH_DTYPES}
    got = roundtrip(state, tmp_path, mmap=mmap)
    assert_same(got, state)
    assert got["float32"]["()"].dim() == 0


def test_float_specials_in_tensors(tmp_path) -> None:
    vals = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, 3.4e38]
    state = {str(dt): torch.tensor(vals, dtype=dt)
             for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16)}
    state["c"] = torch.tensor([complex(float("nan"), -0.0)], dtype=torch.complex128)
    assert_same(roundtrip(state, tmp_path), state)


def _non_contiguous() -> dict[str, torch.Tensor]:
    base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    z = torch.randn(4, 3, dtype=torch.complex64)
    return {
        "transposed": base.transpose(0, 2),
        "permuted": base.permute(1, 2, 0),
        "stepped": base[:, ::2, 1::3],
        "narrowed": base[1:, 2],
        "expanded": torch.arange(3.0).expand(4, 3),
        "expanded_0d": torch.tensor(7.0).expand(2, 2),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "negative_of_view": -base[0],
        "conj": z.conj(),
        "conj_transposed": z.conj().t(),
        "neg_bit": torch._neg_view(z),
        "imag_of_conj": z.conj().imag,
        "bool_strided": (base > 30)[:, 1],
        "bf16_t": base[0].to(torch.bfloat16).t(),
        "storage_offset": base.reshape(-1)[7:19],
    }


def test_non_contiguous_and_lazy_bit_tensors(tmp_path) -> None:
    state = _non_contiguous()
    assert not state["transposed"].is_contiguous() and state["conj"].is_conj()
    assert state["neg_bit"].is_neg()
    got = roundtrip(state, tmp_path)
    assert_same(got, state)
    for k, t in got.items():
        assert t.is_contiguous() and not t.is_conj() and not t.is_neg(), k
        assert torch.equal(t, state[k].resolve_conj().resolve_neg()), k


def test_views_of_one_storage(tmp_path) -> None:
    base = torch.arange(24, dtype=torch.int64)
    state = {"base": base, "tail": base[10:], "matrix": base.view(4, 6), "col": base.view(4, 6)[:, 2],
             "same": base, "again": [base]}
    got = roundtrip(state, tmp_path)
    assert_same(got, state)
    # the same tensor under several keys is stored once and comes back as one object
    assert got["same"] is got["base"] and got["again"][0] is got["base"]
    got["base"][0] = 99  # views of other shapes are stored as tensors of their own
    assert got["tail"][0] == 10 and got["matrix"][0, 0] == 0 and got["col"][0] == 2


def test_parameters_and_grad_tensors(tmp_path) -> None:
    p = torch.nn.Parameter(torch.randn(3, 2))
    g = torch.randn(4, requires_grad=True) * 2  # non-leaf
    got = roundtrip({"p": p, "g": g}, tmp_path)
    assert type(got["p"]) is torch.Tensor and not got["p"].requires_grad
    assert torch.equal(got["p"], p.detach()) and torch.equal(got["g"], g.detach())


NUMPY_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"]


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("dt", NUMPY_DTYPES)
def test_numpy_arrays(tmp_path, dt: str, mmap: bool) -> None:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, 6 * 5 * 16, dtype=np.uint8)
    base = raw[: 30 * np.dtype(dt).itemsize].view(dt).reshape(6, 5)
    if dt == "bool":
        base = raw[:30].reshape(6, 5) > 127
    state = {"a": base, "t": base.T, "s": base[::2, 1:], "f": np.asfortranarray(base),
             "e": base[:0], "z": np.array(base[0, 0]), "ro": base.copy()}
    state["ro"].flags.writeable = False
    got = roundtrip(state, tmp_path, mmap=mmap)
    assert_same(got, state)
    assert got["z"].shape == () and type(got["z"]) is np.ndarray
    assert got["ro"].flags.writeable


def test_numpy_scalars(tmp_path) -> None:
    state = {dt: np.array(1, dt)[()] for dt in NUMPY_DTYPES}
    state["nan32"] = np.float32("nan")
    state["negzero"] = np.float64(-0.0)
    got = roundtrip(state, tmp_path)
    assert_same(got, state)
    assert all(isinstance(v, np.generic) for v in got.values())


def test_plain_values(tmp_path) -> None:
    state = {
        "ints": [0, -1, 2**63, -(2**80), 10**300],
        "floats": [0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"), 5e-324, 1.7976931348623157e308],
        "strs": ["", "ü", "日本語", "a\x00b", "\n", "nan", "inf"],
        "bytes": [b"", b"\x00\xff" * 100],
        "none": None,
        "bools": (True, False),
        "tuple": (1, (2, (3,)), [4, (5,)]),
        "empty": {"d": {}, "l": [], "t": ()},
        "intkeys": {0: "a", -5: "b", 2**40: "c", "0": "str zero"},
        "nested": {"a": {"b": {"c": [{"d": (None,)}]}}},
        7: "int key at the root",
    }
    got = roundtrip(state, tmp_path)
    assert_same(got, state)
    assert math.copysign(1, got["floats"][1]) == -1


def test_mixed_torch_and_numpy_in_containers(tmp_path) -> None:
    state = {"mix": [torch.ones(2), np.ones(2), (torch.zeros((), dtype=torch.int8), {"n": np.int8(3)})]}
    assert_same(roundtrip(state, tmp_path), state)


def test_empty_state(tmp_path) -> None:
    assert roundtrip({}, tmp_path) == {}


def test_metadata_round_trips_in_index(tmp_path) -> None:
    path = str(tmp_path / "c")
    shardsafe.save({"x": 1}, path, metadata={"step": 3, "tags": ["a"]})
    from shardsafe.api.load import read_checkpoint_index

    assert read_checkpoint_index(path).metadata == {"step": 3, "tags": ["a"]}


def test_loaded_tensors_are_writable_cpu_tensors(tmp_path) -> None:
    got = roundtrip({"a": torch.arange(4), "b": torch.ones(2, 2).t()}, tmp_path)
    for t in got.values():
        t += 1  # would raise on a read-only / non-writable view
    assert got["a"].tolist() == [1, 2, 3, 4]


def test_same_state_saved_twice_gives_identical_data_files(tmp_path) -> None:
    state = {"a": torch.arange(10.0), "b": np.arange(3), "c": {"d": "x"}}
    for name in ("one", "two"):
        shardsafe.save(state, str(tmp_path / name))
    data = [f for f in os.listdir(tmp_path / "one") if f != "index.json"]
    for f in data:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes()
