"""Async saves on 3 ranks while FSDP2 training collectives keep running (the later ones
within a host-memory budget smaller than each rank's state)."""

from __future__ import annotations

import os

import torch
from dist_worker import flat_tensors
from safetensors.torch import load_file

import shardsafe


def test_async_saves_commit_while_training_runs(cluster) -> None:  # noqa: ANN001
    out, results = cluster
    ranks = results[("async", 3)]
    assert all(r["saved"] == [2, 5, 8] for r in ranks)
    # the saves at steps 2 and 5 were still in flight while the next training step (with
    # its collectives) ran on every rank (the step-8 save has no next step)
    assert ranks[0]["overlapped"] == 2
    # the saves of steps 5 and 8 streamed each rank's state (> 8 MiB) through 2 MiB
    assert all(r["staged"] > 8 << 20 and 1 << 20 <= r["budget_peak"] <= 2 << 20 for r in ranks)
    for step in (2, 5, 8):
        state = shardsafe.load(os.path.join(out, f"async-{step}"))
        assert state["step"] == step
        # what was saved is the state at the save call, not what training did afterwards
        ref = load_file(os.path.join(out, f"async-ref-{step}.safetensors"))
        got = flat_tensors(state["app"])
        assert sorted(ref) == sorted(got)
        for k in ref:
            assert torch.equal(ref[k].reshape(-1).view(torch.uint8),
                               got[k].reshape(-1).view(torch.uint8)), (step, k)
        assert torch.equal(state["payload"], torch.full((3 * 512, 4096), float(step)))
