"""The value adapters' conformance suite: every kind of tensor value answers the same questions.

Each case (``CASES``) is a leaf of one kind: plain, strided, conjugated and subclassed
torch tensors, numpy arrays (and one of ml_dtypes' types, stored as JAX's kind), and
``jax.Array`` whole and sharded over 8 emulated devices. For each, ``adapter_for`` picks
the adapter of its kind, the adapter describes it (dtype, global shape, bytes) as the
format stores it, its bytes come back as the same value through the stored kind a load
builds (``stored_kind``: over memory of the caller's, and newly allocated), and a
save and load round-trips it. Leaves of no kind (plain values, containers, Stateful
objects, JAX pytree nodes) are left to the value path. DTensors, which need a process
group, are checked in ``test_dtensor_adapter.py``.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe import values
from shardsafe.format.dtypes import lookup
from shardsafe.plan.flatten import flatten
from shardsafe.values.adapter import StoredKind, ValueAdapter

# JAX reads XLA_FLAGS when it creates its CPU client (at the first array, after collection)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
jax = pytest.importorskip("jax")
jnp = jax.numpy
ml_dtypes = pytest.importorskip("ml_dtypes")


class Tagged(torch.Tensor):
    """A tensor subclass of the caller's: a torch tensor, never shared with another path."""


def _sharded() -> Any:
    mesh = jax.make_mesh((4, 2), ("dp", "tp"))
    x = jnp.arange(48, dtype=jnp.float32).reshape(8, 6)
    return jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("dp", None)))


@dataclass(frozen=True)
class Case:
    """One leaf: ``make()`` builds it; the adapter, stored kind and dtype it must get."""

    name: str
    make: Callable[[], Any]
    adapter: str
    kind: str
    dtype: str


CASES = [
    Case("torch", lambda: torch.arange(12.0).reshape(3, 4), "torch", "torch", "float32"),
    Case("torch-parameter", lambda: torch.nn.Parameter(torch.ones(2, 2)), "torch", "torch", "float32"),
    Case("torch-strided", lambda: torch.arange(24, dtype=torch.int64).reshape(4, 6)[:, ::2], "torch", "torch",
         "int64"),
    Case("torch-conj", lambda: torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj(), "torch", "torch",
         "complex64"),
    Case("torch-bfloat16", lambda: torch.linspace(-2, 2, 10).to(torch.bfloat16), "torch", "torch", "bfloat16"),
    Case("torch-subclass", lambda: torch.arange(6.0).as_subclass(Tagged), "torch", "torch", "float32"),
    Case("torch-empty", lambda: torch.zeros(0, 3, dtype=torch.int8), "torch", "torch", "int8"),
    Case("numpy", lambda: np.arange(12, dtype=np.float64).reshape(3, 4), "numpy", "numpy", "float64"),
    Case("numpy-transposed", lambda: np.arange(6, dtype=np.int16).reshape(2, 3).T, "numpy", "numpy", "int16"),
    Case("numpy-bool", lambda: np.array([True, False, True]), "numpy", "numpy", "bool"),
    Case("numpy-ml_dtypes", lambda: np.arange(5, dtype=np.float32).astype(ml_dtypes.bfloat16), "numpy", "jax",
         "bfloat16"),
    Case("jax", lambda: jnp.arange(10, dtype=jnp.int32), "jax", "jax", "int32"),
    Case("jax-bfloat16", lambda: jnp.linspace(0, 1, 6, dtype=jnp.bfloat16).reshape(2, 3), "jax", "jax", "bfloat16"),
    Case("jax-sharded", _sharded, "jax", "jax", "float32"),
]


def _numpy(x: Any) -> np.ndarray:
    """The values of ``x`` as a numpy array (a torch dtype numpy lacks: its raw bits)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().resolve_conj().resolve_neg()
        return x.view(torch.int16).numpy() if x.dtype == torch.bfloat16 else x.numpy()
    return np.asarray(x)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_adapter_for_picks_the_adapter_of_the_kind(case: Case) -> None:
    x = case.make()
    adapter = values.adapter_for(x)
    assert adapter is not None and adapter.name == case.adapter
    assert values.adapter_for(case.make()) is adapter  # asked again (its type is known now): the same


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_adapter_describes_what_the_format_stores(case: Case) -> None:
    x = case.make()
    adapter = values.adapter_for(x)
    row = adapter.describe(x, ("a", 0))
    assert (row.kind, row.dtype, row.shape) == (case.kind, case.dtype, tuple(x.shape))
    assert adapter.dtype_name(x) == case.dtype and adapter.shape(x) == tuple(x.shape)
    assert row.nbytes == (x.numel() * x.element_size() if isinstance(x, torch.Tensor) else _numpy(x).nbytes)
    assert adapter.local_region(x) is None  # held whole by this process
    assert values.target_region(x)[1:] == ((0,) * x.ndim, tuple(x.shape))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bytes_round_trip_through_the_stored_kind(case: Case) -> None:
    x = case.make()
    adapter = values.adapter_for(x)
    row = adapter.describe(x, ("a",))
    flat = adapter.host_bytes(x)
    assert flat.dtype == np.uint8 and flat.ndim == 1 and flat.size == row.nbytes
    assert np.array_equal(values.host_bytes(x), flat)
    made = values.stored_kind(row.kind)
    assert made.name == row.kind
    wrapped = made.from_bytes(row.dtype, row.shape, flat.copy())  # over memory of the caller's
    new, dest = made.empty(row.dtype, row.shape)  # newly allocated, filled through its bytes
    dest[:] = flat
    for got in (wrapped, new):
        assert type(got) is (torch.Tensor if row.kind == "torch" else np.ndarray)
        assert tuple(got.shape) == row.shape
        assert np.array_equal(_numpy(got), _numpy(x))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_writable_bytes_are_the_values_own_memory_or_none(case: Case) -> None:
    x = case.make()
    adapter = values.adapter_for(x)
    view = adapter.writable_bytes(x)
    own = case.adapter != "jax" and not case.name.endswith(("strided", "conj", "transposed"))
    assert (view is not None) == own
    if view is not None and view.size:
        view[:] = 0  # a load writes the value itself
        assert not _numpy(x).any()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_save_and_load_round_trips_the_leaf(case: Case, tmp_path) -> None:  # noqa: ANN001
    x = case.make()
    shardsafe.save({"x": x, "again": x}, tmp_path / "c")
    got = shardsafe.load(tmp_path / "c")
    assert np.array_equal(_numpy(got["x"]), _numpy(x))
    tree, items = flatten({"x": x, "again": x})
    shared = not case.name.endswith(("subclass", "empty"))  # those are stored twice, never shared
    assert len(items) == (1 if shared else 2)
    assert (tree["v"][1] == {"t": "alias", "id": 0}) == shared


def test_every_adapter_answers_the_whole_protocol() -> None:
    asked = {n for n, _ in inspect.getmembers(ValueAdapter) if not n.startswith("_")} | {"name"}
    built = {n for n, _ in inspect.getmembers(StoredKind) if not n.startswith("_")} | {"name"}
    assert {"owns", "describe", "host_bytes", "local_region"} <= asked
    assert [a.name for a in values.ADAPTERS] == ["dtensor", "torch", "numpy", "jax"]  # DTensor before torch
    for adapter in values.ADAPTERS:
        assert all(callable(getattr(adapter, n)) for n in asked - {"name"}), adapter.name
    for kind in ("torch", "numpy", "jax"):
        assert all(callable(getattr(values.stored_kind(kind), n)) for n in built - {"name"}), kind


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: Any


class Counter:
    """A Stateful object."""

    def __init__(self) -> None:
        self.n = 3

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.n = sd["n"]


@pytest.mark.parametrize("leaf", [None, 1, 2.5, "s", b"b", True, np.float32(1.5), np.int64(2), [1], (2,),
                                  {"k": 1}, datetime.date(2024, 1, 2), torch.float16, torch.device("cpu"),
                                  {1, 2}, Counter(), Params(w=1), jax.ShapeDtypeStruct((2,), jnp.float32),
                                  object()],
                         ids=lambda v: type(v).__name__)
def test_leaves_of_no_kind_go_to_the_value_path(leaf: Any) -> None:
    assert values.adapter_for(leaf) is None
    assert not values.is_tensor(leaf)


def test_the_value_path_keeps_plain_values_containers_and_refusals() -> None:
    tree, items = flatten({"s": np.float32(1.5), "p": Params(w=jnp.ones(2)), "c": Counter()})
    assert items[0].kind == "jax" and [n["t"] for n in tree["v"]] == ["npscalar", "dict", "dict"]
    with pytest.raises(TypeError, match=r"cannot save value of type builtins.object at key path 'o'"):
        flatten({"o": object()})


@pytest.mark.parametrize("leaf, message", [
    (torch.ones(2).to_sparse(), r"cannot save tensor at key path 'bad': torch.sparse_coo tensors are not"),
    (torch.empty(2, device="meta"), r"cannot save tensor at key path 'bad': quantized, nested and meta"),
    (np.array([object()]), r"cannot save tensor at key path 'bad': numpy object arrays cannot be saved"),
    (np.ma.masked_array([1, 2], mask=[0, 1]), r"cannot save tensor at key path 'bad': numpy array subclass "
                                              r"MaskedArray"),
    (np.ones(2, dtype=">f4"), r"cannot save tensor at key path 'bad': numpy dtype >f4 is not supported"),
], ids=["sparse", "meta", "object", "masked", "big-endian"])
def test_an_unsavable_leaf_is_refused_naming_its_key_path(leaf: Any, message: str) -> None:
    assert values.adapter_for(leaf) is not None  # a tensor of a known kind, which its adapter refuses
    with pytest.raises(TypeError, match=message):
        flatten({"bad": leaf})


def test_a_stored_kind_says_what_it_needs_where_numpy_cannot_hold_a_dtype() -> None:
    assert values.stored_kind("numpy").host_dtype(lookup("bfloat16")) is None
    with pytest.raises(TypeError, match=r"dtype bfloat16 needs torch to be loaded"):
        values.stored_kind("numpy").empty("bfloat16", (2,))
    assert values.stored_kind("jax").empty("bfloat16", (2,))[0].dtype == ml_dtypes.bfloat16
