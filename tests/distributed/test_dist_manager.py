"""CheckpointManager on 3 ranks: agreed preemption, rank-0 retention, agreed fallback."""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file


def test_manager_agrees_across_ranks(cluster) -> None:  # noqa: ANN001
    out, results = cluster
    ranks = results[("manager", 3)]
    # SIGUSR1 reached rank 1 only, at step 7: every rank saved step 7 and stopped there
    assert [r["stopped_at"] for r in ranks] == [7, 7, 7]
    # retention (max_to_keep=2) ran once, on rank 0, and every rank sees its result
    assert all(r["steps_after_retention"] == [6, 7] for r in ranks)
    # step 7 was damaged where only rank 2 reads: all ranks fell back to step 6 together
    assert [r["restored"] for r in ranks] == [6, 6, 6]
    assert [r["restored_step_value"] for r in ranks] == [6, 6, 6]
    assert ranks[0]["steps_after_restore"] == [6]  # step 7 set aside by rank 0
    ref = load_file(os.path.join(out, "managed-ref-6.safetensors"))
    got = load_file(os.path.join(out, "managed-restored-r0.safetensors"))
    assert sorted(ref) == sorted(got)
    for k in ref:
        assert torch.equal(ref[k].reshape(-1).view(torch.uint8), got[k].reshape(-1).view(torch.uint8)), k
