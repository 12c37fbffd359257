"""JaxComm: shardsafe's collectives over JAX's coordination service, in a real 2-process
``jax.distributed`` job (no torch.distributed anywhere)."""

from __future__ import annotations

import pytest
from dist_harness import run_jax

pytest.importorskip("jax")


def test_jax_comm_collectives(tmp_path) -> None:
    out = run_jax(2, 1, ["comm"], str(tmp_path))["comm"]
    assert [r["type"] for r in out] == ["JaxComm", "JaxComm"]
    assert [(r["rank"], r["world"]) for r in out] == [(0, 2), (1, 2)]
    assert out[0]["gathered"] == [{"rank": 0}, {"rank": 1}] and out[1]["gathered"] is None
    assert all(r["big"] == 2_560_000 and r["big_ok"] for r in out)  # 2.5 MB: in pieces of 1 MB
    assert all(r["max"] == [1, 10] for r in out)
    # a channel: bounded waits, 3 MB values in 1 MB pieces, deletion of a value and its pieces
    assert all(r["late"] == [False] and r["long_ok"] and r["gone"] == [False] for r in out), out
