"""Elastic resume with real gloo processes: an FSDP2 + AdamW checkpoint saved on 8 ranks
loads bit-exactly on 6, 5, 3 and 12 ranks, and a 2-D (dp, tp) checkpoint on a 1-D mesh;
a 16-rank save of DTensors, plain tensors, stage keys and PerRank values loads on 8 and
24 ranks (see elastic_worker.py)."""

from __future__ import annotations

import pytest
from dist_harness import run_ranks
from safetensors.torch import load_file
from helpers import assert_same

WORKER = "elastic_worker.py"


@pytest.mark.stress
def test_fsdp_and_2d_checkpoints_of_8_ranks_load_bit_exactly_on_6_5_3_and_12(tmp_path) -> None:  # noqa: ANN001
    worlds = (6, 5, 3, 12)
    results = run_ranks(12, [("save", 8)] + [("load", w) for w in worlds], str(tmp_path),
                        timeout=900, worker=WORKER)
    for name, step in (("fsdp", 3), ("dptp", 2)):
        ref = load_file(str(tmp_path / f"{name}-ref.safetensors"))
        assert any(k.startswith("optim.state.") for k in ref)  # AdamW moments and steps
        for w in worlds:
            assert [r[name] for r in results[("load", w)]] == [step] * w
            assert_same(load_file(str(tmp_path / f"{name}-loaded-{w}.safetensors")), ref)


@pytest.mark.stress
def test_16_ranks_save_and_load_on_8_and_24(tmp_path) -> None:  # noqa: ANN001
    results = run_ranks(24, [("many", 16), ("many_load", 8), ("many_load", 24)], str(tmp_path),
                        timeout=900, worker=WORKER)
    saved = results[("many", 16)]
    for r in saved:  # the second save carried the new PerRank values, not a new plan
        assert not r["again_full"] and r["again"] < r["first"], r
    for world in (8, 24):
        for rank, r in enumerate(results[("many_load", world)]):
            assert r["equal"] == {"row": True, "col": True, "grid": True} and r["plain"], (world, rank)
            assert r["stage"] == [[float(s)] * 2 for s in range(4)]
            assert r["mine"] == ([rank + 100, [float(rank)] * 3] if rank < 16 else [-1, [0.0] * 3])
