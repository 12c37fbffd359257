"""The simulated restore of a job from a store with a heavy tail (``bench.tail``)."""

from __future__ import annotations

import json

import pytest

from shardsafe.bench import tail

KEYS = {"job_over_median", "unhedged_job_over_median", "fixed_stall_job_over_median", "extra_request_fraction",
        "stalled_rank_over_median", "model", "policy", "ranks", "requests_per_rank", "job_s", "median_rank_s",
        "duplicates", "requests_sent"}


def test_hedging_shortens_the_tail_of_a_small_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert tail.main(["--ranks", "256", "--stall-p", "0.005", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert KEYS <= out.keys()
    assert out["ranks"] == 256 and out["model"]["stall_p"] == 0.005
    assert out["job_over_median"] < out["unhedged_job_over_median"] <= out["fixed_stall_job_over_median"]
    assert out["job_over_median"] < 2 < 3 < out["unhedged_job_over_median"]
    assert out["stalled_rank_over_median"] <= out["job_over_median"]
    assert out["stalled_rank_over_median"] < out["unhedged_stalled_rank_over_median"]
    assert 0 < out["extra_request_fraction"] <= 0.06


def test_without_a_tail_nothing_is_hedged_much() -> None:
    out = tail.run(64, rank_mib=256, model=tail.StoreModel(sigma=0.01, stall_p=0.0))
    assert out["job_over_median"] < 1.1 and out["unhedged_job_over_median"] < 1.1
    assert out["extra_request_fraction"] < 0.01


@pytest.mark.stress
def test_a_16384_rank_restore_meets_the_targets() -> None:
    out = tail.run(16384)
    assert out["job_over_median"] <= 1.5 and out["unhedged_job_over_median"] >= 3
    assert out["extra_request_fraction"] <= 0.05


@pytest.mark.parametrize("large_at", [0, 3])
def test_a_slot_goes_to_the_next_request_when_any_request_has_its_answer(large_at: int) -> None:
    """A store without a tail (every draw is the median): one 64 MiB read (0.67 s) among
    six 1 MiB reads (0.04 s each), 2 slots. The other slot serves every small read while
    the large one runs, so the phase ends with the large read. Sending the next read only
    once the oldest had its answer would hold the small reads behind it until then (the
    phase would end about 0.08 s later)."""
    model = tail.StoreModel(sigma=1e-12, stall_p=0.0)
    rank = tail._Rank(0, 0, model, tail.TailPolicy(hedge=False), tail.RetryPolicy(), learn_stalls=True)
    sizes = [tail.MiB] * 6
    sizes.insert(large_at, 64 * tail.MiB)
    small, large = model.ttfb + 1 / model.bandwidth_mib, model.ttfb + 64 / model.bandwidth_mib
    large_sent = small * (large_at // 2)  # its slot is free once the small reads before it have had their answers
    assert rank.phase(0.0, sizes, 2) == pytest.approx(large_sent + large, abs=1e-6)
    assert rank.sent == len(sizes)
