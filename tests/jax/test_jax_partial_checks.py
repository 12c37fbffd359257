"""A JAX restore onto ``ShapeDtypeStruct`` targets reads only what its shardings need; a
forged layout (two chunks with one box, half the tensor covered by none) is refused as a
whole read refuses it, never handed back with uninitialised elements."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import shardsafe
from shardsafe import CorruptCheckpointError

jax = pytest.importorskip("jax")
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "format"))
from v4_forge import halve_twice  # noqa: E402


@pytest.mark.parametrize("spec", [P(), P("dp")], ids=["replicated", "sharded"])
def test_duplicate_boxes_are_refused_by_a_jax_restore(tmp_path, mesh42, spec) -> None:
    path = str(tmp_path / "ck")
    w = np.arange(1 << 17, dtype=np.float32)
    shardsafe.save({"w": w}, path)
    halve_twice(path, "w")
    target = {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=NamedSharding(mesh42, spec))}
    with pytest.raises(CorruptCheckpointError, match=r"tensor w: chunks overlap"):
        shardsafe.load(path, target)
