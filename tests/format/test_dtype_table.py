"""The dtype table agrees with torch, numpy and safetensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardsafe.format.dtypes import DTYPES, from_numpy, lookup


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("name", sorted(n for n, d in DTYPES.items() if d.torch))
def test_matches_torch(name: str) -> None:
    d = DTYPES[name]
    t = getattr(torch, name)
    assert torch.empty((), dtype=t).element_size() == d.itemsize


@pytest.mark.parametrize("name", sorted(n for n, d in DTYPES.items() if d.numpy))
def test_matches_numpy(name: str) -> None:
    d = DTYPES[name]
    assert np.dtype(d.numpy).itemsize == d.itemsize
    assert from_numpy(np.dtype(d.numpy)) is d


def test_every_torch_dtype_is_known_or_deliberately_absent() -> None:
    # sub-byte and quantized dtypes have no exact byte layout we could promise to keep
    absent = {"uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7", "int1", "int2",
              "int3", "int4", "int5", "int6", "int7", "quint8", "qint8", "qint32", "quint4x2",
              "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"}
    names = {str(v).removeprefix("torch.") for v in vars(torch).values() if isinstance(v, torch.dtype)}
    assert names - set(DTYPES) - absent == set()


@pytest.mark.parametrize("dt", [np.dtype(">f4"), np.dtype(">i8"), np.dtype("U3"), np.dtype("O"),
                                np.dtype("M8[s]"), np.dtype("V4"), np.dtype([("a", "<f4")]),
                                np.dtype(np.longdouble)])
def test_unsupported_numpy(dt: np.dtype) -> None:
    with pytest.raises(TypeError):
        from_numpy(dt)


@pytest.mark.parametrize("name", sorted(n for n, d in DTYPES.items() if not d.torch))
def test_ml_dtypes_types_match_ml_dtypes_and_stay_out_of_torchs_table(name: str) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from shardsafe.values import torch as torch_values

    assert np.dtype(getattr(ml_dtypes, name)).itemsize == DTYPES[name].itemsize
    assert name not in torch_values.torch_dtypes()  # torch.int4 tensors stay unsaveable


def test_safetensors_codes_are_known_to_safetensors() -> None:
    from safetensors.torch import _TYPES  # the codes the installed safetensors reads

    for d in DTYPES.values():
        if d.safetensors is not None:
            assert d.safetensors in _TYPES, d


def test_lookup_unknown() -> None:
    with pytest.raises(ValueError):
        lookup("float128")
