"""Every data file is a valid safetensors file whose tensors hold the saved values."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from safetensors import safe_open

import shardsafe
from shardsafe.format.dtypes import DTYPES

from helpers import raw_bytes
from roundtrip_helpers import random_tensor

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")


def _data_files(path: str) -> list[str]:
    return [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]


def test_tiny_checkpoint_opens_with_safetensors(tmp_path) -> None:
    state = {"model": {"w": torch.randn(3, 4), "b": torch.arange(3, dtype=torch.int32)},
             "scalar": torch.tensor(2.5, dtype=torch.float64), "n": 5, "arr": np.arange(6, dtype=np.uint16)}
    path = str(tmp_path / "c")
    shardsafe.save(state, path)
    (f,) = _data_files(path)
    with safe_open(f, framework="pt") as st:
        assert sorted(st.keys()) == ["arr", "model.b", "model.w", "scalar"]
        assert st.metadata() == {"format": "pt", "writer": "shardsafe"}
        assert torch.equal(st.get_tensor("model.w"), state["model"]["w"])
        assert torch.equal(st.get_tensor("model.b"), state["model"]["b"])
        assert torch.equal(st.get_tensor("scalar"), state["scalar"])
        assert st.get_tensor("scalar").shape == ()
        assert torch.equal(st.get_tensor("arr"), torch.from_numpy(state["arr"]))
    with safe_open(f, framework="numpy") as st:
        np.testing.assert_array_equal(st.get_tensor("arr"), state["arr"])


def test_every_dtype_is_readable_by_safetensors(tmp_path) -> None:
    state = {n: random_tensor(getattr(torch, n), (2, 3), seed=i)
             for i, n in enumerate(sorted(n for n, d in DTYPES.items() if d.torch))}
    state["empty"] = torch.zeros(0, 4)
    path = str(tmp_path / "c")
    shardsafe.save(state, path)
    (f,) = _data_files(path)
    with safe_open(f, framework="pt") as st:
        assert sorted(st.keys()) == sorted(state)
        for name, want in state.items():
            got = st.get_tensor(name)
            code = DTYPES[name].safetensors if name in DTYPES else "F32"
            if code is None:  # stored as a flat U8 byte array of the same bytes
                assert got.dtype == torch.uint8 and got.shape == (want.numel() * want.element_size(),)
                assert torch.equal(got, raw_bytes(want)), name
            else:
                assert got.dtype == want.dtype and got.shape == want.shape, name
                assert torch.equal(raw_bytes(got), raw_bytes(want)), name


def test_state_key_named_metadata_keeps_the_file_valid(tmp_path) -> None:
    path = str(tmp_path / "c")
    state = {"__metadata__": torch.ones(2), "a.b": torch.zeros(1), "a": {"b": torch.ones(1)}}
    shardsafe.save(state, path)
    (f,) = _data_files(path)
    with safe_open(f, framework="pt") as st:
        assert st.metadata() == {"format": "pt", "writer": "shardsafe"}
        assert len(st.keys()) == 3
    got = shardsafe.load(path)
    assert torch.equal(got["__metadata__"], torch.ones(2)) and torch.equal(got["a"]["b"], torch.ones(1))


def test_data_section_is_page_aligned(tmp_path) -> None:
    path = str(tmp_path / "c")
    shardsafe.save({"w": torch.ones(1000)}, path)
    (f,) = _data_files(path)
    with open(f, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
    assert (8 + n) % 4096 == 0
