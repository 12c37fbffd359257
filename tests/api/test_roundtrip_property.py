"""Property: any nested structure of supported values round-trips exactly (hypothesis),
under dict keys of every supported key type: whatever the writer accepts, the reader loads."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pathlib
import shutil
from collections import OrderedDict
import tempfile
import uuid
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardsafe

from helpers import assert_same
from roundtrip_helpers import random_tensor

TORCH_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
                torch.float8_e5m2, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
                torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64, torch.complex128]
NP_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]

shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)


@st.composite
def torch_tensors(draw: st.DrawFn) -> torch.Tensor:
    t = random_tensor(draw(st.sampled_from(TORCH_DTYPES)), draw(shapes), seed=draw(st.integers(0, 2**16)))
    if t.dim() >= 2 and draw(st.booleans()):
        t = t.transpose(0, 1)  # non-contiguous
    return t


@st.composite
def numpy_arrays(draw: st.DrawFn) -> np.ndarray:
    dt = np.dtype(draw(st.sampled_from(NP_DTYPES)))
    shape = draw(shapes)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.frombuffer(draw(st.binary(min_size=n, max_size=n)), dtype=np.uint8)
    if dt == np.bool_:
        return (raw > 127).reshape(shape)
    return raw.view(dt).reshape(shape).copy()


@st.composite
def numpy_scalars(draw: st.DrawFn) -> np.generic:
    return draw(numpy_arrays().filter(lambda a: a.size > 0)).reshape(-1)[0]


plain = (st.none() | st.booleans() | st.integers() | st.integers(-(2**200), 2**200)
         | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20) | st.binary(max_size=20))
leaves = plain | torch_tensors() | numpy_arrays() | numpy_scalars()
keys = st.text(max_size=8) | st.integers(-(2**40), 2**40)


def containers(children: st.SearchStrategy) -> st.SearchStrategy:
    return (st.lists(children, max_size=4)
            | st.lists(children, max_size=4).map(tuple)
            | st.dictionaries(keys, children, max_size=4))


values = st.recursive(leaves, containers, max_leaves=20)
states = st.dictionaries(keys, values, max_size=5)


@pytest.fixture(scope="module")
def scratch() -> Any:
    d = tempfile.mkdtemp(prefix="shardsafe-prop-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def scrambled(x: Any) -> Any:
    """Same structure, shapes, dtypes and strides; every value different (or None)."""
    if isinstance(x, torch.Tensor):
        junk = torch.full((x.numel() * x.element_size(),), 0xA5, dtype=torch.uint8)
        out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
        out.copy_(junk.view(x.dtype).reshape(x.shape))  # keeps x's strides (e.g. transposed)
        return out
    if isinstance(x, np.ndarray):
        return np.full_like(x, 1 if x.dtype != np.bool_ else False)
    if isinstance(x, dict):
        return type(x)((k, scrambled(v)) for k, v in x.items())  # an OrderedDict stays one
    if isinstance(x, argparse.Namespace):
        return argparse.Namespace(**{k: scrambled(v) for k, v in vars(x).items()})
    if isinstance(x, list):
        return [scrambled(v) for v in x]
    if isinstance(x, tuple):
        return tuple(scrambled(v) for v in x)
    return None


def tensors_by_path(x: Any, path: tuple = ()) -> dict[tuple, Any]:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return {path: x}
    x = vars(x) if isinstance(x, argparse.Namespace) else x
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, (list, tuple)) else ()
    out: dict[tuple, Any] = {}
    for k, v in items:
        out.update(tensors_by_path(v, path + (k,)))
    return out


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(state=states)
def test_roundtrip(scratch: str, state: dict) -> None:
    _round_trip(scratch, state)


# ----------------------------------------------------------------------------- every key type
fixed_tz = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
datelike = (st.dates() | st.datetimes(timezones=st.none() | fixed_tz) | st.times(timezones=st.none() | fixed_tz)
            | st.timedeltas())
paths = (st.sampled_from([pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.Path])
         .flatmap(lambda cls: st.lists(st.sampled_from(["a", "b c", "é", ".."]), max_size=3)
                  .map(lambda parts: cls(*parts))))
torch_names = (st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.bool, torch.qint8])
               | st.sampled_from(["cpu", "cuda", "cuda:1", "meta"]).map(torch.device))
hashable_leaves = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                   | st.text(max_size=8) | st.binary(max_size=8)
                   | numpy_scalars().filter(lambda x: x == x) | datelike | paths | torch_names)
hashables = st.recursive(hashable_leaves, lambda c: st.tuples(c, c) | st.lists(c, max_size=3).map(tuple)
                         | st.frozensets(c, max_size=3), max_leaves=6)
rich_plain = plain | datelike | paths | torch_names | st.sets(hashables, max_size=3) | st.frozensets(hashables, max_size=3)


def rich_containers(children: st.SearchStrategy) -> st.SearchStrategy:
    return (containers(children)
            | st.dictionaries(hashables, children, max_size=4)
            | st.dictionaries(hashables, children, max_size=3).map(lambda d: OrderedDict(d))
            | st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), children, max_size=3)
              .map(lambda d: argparse.Namespace(**d)))


rich_states = st.dictionaries(hashables, st.recursive(rich_plain | torch_tensors() | numpy_arrays(),
                                                      rich_containers, max_leaves=16), max_size=5)


def _key_types(x: Any, path: str = "<root>") -> list[tuple[str, str]]:
    """(path, type and repr) of every dict key, recursively: ``assert_same`` compares keys by
    ``==``, under which 1, 1.0, True and np.int64(1) (or 0.0 and -0.0) are one key."""
    def sig(k: Any) -> Any:
        if type(k) in (tuple, frozenset):
            return (type(k).__name__, sorted(repr(sig(v)) for v in k) if type(k) is frozenset else
                    tuple(sig(v) for v in k))
        return (type(k).__name__, repr(k))
    out: list[tuple[str, str]] = []
    if isinstance(x, argparse.Namespace):
        x = vars(x)
    if isinstance(x, dict):
        for i, (k, v) in enumerate(x.items()):
            out.append((path, repr(sig(k))))
            out += _key_types(v, f"{path}.#{i}")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            out += _key_types(v, f"{path}.{i}")
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(state=rich_states)
def test_roundtrip_under_every_key_type(scratch: str, state: dict) -> None:
    _round_trip(scratch, state)


@pytest.mark.stress
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(state=rich_states)
def test_roundtrip_under_every_key_type_long(scratch: str, state: dict) -> None:
    _round_trip(scratch, state)


def _round_trip(scratch: str, state: dict) -> None:
    path = os.path.join(scratch, uuid.uuid4().hex)
    shardsafe.save(state, path)
    try:
        loaded = shardsafe.load(path)
        assert_same(loaded, state)
        assert _key_types(loaded) == _key_types(state)
        # in place: a target of the same structure gets every value, in its own tensors
        target = scrambled(state)
        before = tensors_by_path(target)
        result = shardsafe.load(path, target)
        assert (result.missing, result.unexpected, result.mismatched) == ([], [], [])
        assert_same(target, state)
        after = tensors_by_path(target)
        assert after.keys() == before.keys() and all(after[p] is before[p] for p in before)
    finally:
        shutil.rmtree(path)
