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


class _Scripted:
    """A draw stream with no stalls whose lognormal factors are given (then 1)."""

    def __init__(self, factors: list[float]) -> None:
        self.factors = list(factors)

    def random(self) -> float:
        return 1.0

    def lognormvariate(self, mu: float, sigma: float) -> float:
        return self.factors.pop(0) if self.factors else 1.0

    def uniform(self, a: float, b: float) -> float:
        return a


@pytest.mark.parametrize(("drain_factor", "ends"), [(2.5, 0.35 + 2.5 * 0.35 + 0.35), (100.0, 0.35 + 1.0 + 0.35)])
def test_the_last_read_is_hedged_sooner_once_nothing_is_left_to_send(drain_factor: float, ends: float) -> None:
    """Four 32 MiB reads (0.35 s at the median), 2 slots, reads of the class learned at
    0.35 s. The last read is 6 x slow; once the read beside it has its answer, nothing is
    left to send and it is draining: its duplicate goes out 2.5 x the median after its
    start instead of at the 1 s cap of a class with few durations."""
    model = tail.StoreModel()
    policy = tail.TailPolicy(drain_factor=drain_factor)
    rank = tail._Rank(0, 0, model, policy, tail.RetryPolicy(), learn_stalls=True)
    for _ in range(20):
        rank.tracker.record(32 * tail.MiB, 0.35, 0.03)
    rank.draws = [_Scripted([1.0, 1.0, 1.0, 6.0]), _Scripted([])]  # type: ignore[list-item]
    assert rank.phase(0.0, [32 * tail.MiB] * 4, 2) == pytest.approx(ends, abs=1e-6)
    assert rank.hedges == 1


def test_a_read_far_slower_than_its_siblings_is_cut_at_the_stall_floor_and_retried() -> None:
    """Without hedging: the first of three reads is 20 x slow (7 s, bytes arriving all
    along, so never silent); its siblings finish, and at the stall floor (2 s) it is on
    course for 9 s, far beyond 8 x the median: cut, and the retry (no backoff drawn here)
    takes the median 0.35 s."""
    model = tail.StoreModel()
    rank = tail._Rank(0, 0, model, tail.TailPolicy(hedge=False), tail.RetryPolicy(), learn_stalls=True)
    for _ in range(20):
        rank.tracker.record(32 * tail.MiB, 0.35, 0.03)
    rank.draws = [_Scripted([20.0, 1.0, 1.0, 1.0]), _Scripted([])]  # type: ignore[list-item]
    assert rank.phase(0.0, [32 * tail.MiB] * 3, 2) == pytest.approx(2.0 + 0.35, abs=1e-6)
    assert rank.sent == 4 and rank.stalls == 1
