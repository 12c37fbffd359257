"""Retention policies as tables: plain records in, steps to delete out. No filesystem."""

from __future__ import annotations

import math

import pytest

from shardsafe.manager.options import ManagerOptions
from shardsafe.manager.retention import (
    AnyPreservationPolicy,
    BestN,
    EveryNSeconds,
    EveryNSteps,
    KeepAll,
    LatestN,
    StepRecord,
    best_step,
    policy_from_options,
    steps_to_delete,
)


def recs(*steps: int, dt: float = 1.0, metrics: dict[int, dict] | None = None) -> list[StepRecord]:
    """Records for ``steps`` saved ``dt`` seconds apart (time = step * dt)."""
    metrics = metrics or {}
    return [StepRecord(s, s * dt, metrics.get(s)) for s in steps]


def loss(m: dict) -> float:
    return m["loss"]


@pytest.mark.parametrize("policy, records, deleted", [
    (KeepAll(), recs(1, 2, 3), []),
    (LatestN(1), recs(1, 2, 3), [1, 2]),
    (LatestN(2), recs(1, 2, 3, 4), [1, 2]),
    (LatestN(5), recs(1, 2, 3), []),
    (EveryNSteps(2), recs(1, 2, 3, 4, 5), [1, 3]),  # 5 is the newest: always kept
    (EveryNSteps(10), recs(5, 10, 15, 20, 25), [5, 15]),
    # one per 10 s: the oldest, then the first at least 10 s after the previous kept one
    (EveryNSeconds(10), recs(0, 3, 6, 9, 12, 15, 21, 22, 30), [3, 6, 9, 15, 21]),
    (AnyPreservationPolicy((LatestN(2), EveryNSteps(4))), recs(*range(1, 11)), [1, 2, 3, 5, 6, 7]),
    (AnyPreservationPolicy((LatestN(1), EveryNSeconds(5))), recs(*range(0, 12)), [1, 2, 3, 4, 6, 7, 8, 9]),
    (AnyPreservationPolicy(()), recs(1, 2, 3), [1, 2]),
], ids=["all", "latest1", "latest2", "latest-more-than-present", "period2", "period10", "seconds",
        "latest+period", "latest+seconds", "empty-any"])
def test_policy_table(policy, records, deleted) -> None:
    assert steps_to_delete(records, policy) == sorted(deleted)


def test_seconds_policy_is_stable_across_passes() -> None:
    """Applying retention after each save gives the same survivors as one pass at the end."""
    policy = AnyPreservationPolicy((LatestN(2), EveryNSeconds(10)))
    alive: list[StepRecord] = []
    for s in range(0, 40, 3):
        alive.append(StepRecord(s, float(s)))
        gone = set(steps_to_delete(alive, policy))
        alive = [r for r in alive if r.step not in gone]
    # time-kept chain: 0, 12 (>= 0 + 10), 24, 36; the latest two: 36, 39
    assert [r.step for r in alive] == [0, 12, 24, 36, 39]
    everything = [StepRecord(s, float(s)) for s in range(0, 40, 3)]
    once = set(steps_to_delete(everything, policy))
    assert [r.step for r in everything if r.step not in once] == [r.step for r in alive]


M = {1: {"loss": 0.5}, 2: {"loss": 0.2}, 3: {"loss": 0.9}, 4: {"loss": 0.3}, 5: {"loss": 0.7}}


@pytest.mark.parametrize("policy, records, deleted", [
    (BestN(loss, "min", 2), recs(1, 2, 3, 4, 5, metrics=M), [1, 3]),       # 5 newest
    (BestN(loss, "max", 2), recs(1, 2, 3, 4, 5, metrics=M), [1, 2, 4]),
    (BestN(loss, "min", 1), recs(1, 2, 3, 4, 5, metrics=M), [1, 3, 4]),
    (BestN(loss, "min", None), recs(1, 2, 3, 4, 5, metrics=M), []),
    # steps 6, 7 without metrics: kept by default, deletable otherwise (7 is the newest)
    (BestN(loss, "min", 2), recs(1, 2, 3, 4, 5, 6, 7, metrics=M), [1, 3, 5]),
    (BestN(loss, "min", 2, keep_without_metrics=False), recs(1, 2, 3, 4, 5, 6, 7, metrics=M),
     [1, 3, 5, 6]),
    # ties: the newer step wins
    (BestN(loss, "min", 1), recs(1, 2, 3, metrics={1: {"loss": 1.0}, 2: {"loss": 1.0}, 3: {"loss": 2.0}}),
     [1]),
    # NaN ranks worst in either mode
    (BestN(loss, "min", 1), recs(1, 2, 3, metrics={1: {"loss": math.nan}, 2: {"loss": 5.0}, 3: {"loss": 9.0}}),
     [1]),
    (BestN(loss, "max", 1), recs(1, 2, 3, metrics={1: {"loss": math.nan}, 2: {"loss": 5.0}, 3: {"loss": 1.0}}),
     [1]),
], ids=["min2", "max2", "min1", "all-with-metrics", "without-kept", "without-dropped", "tie-newer",
        "nan-min", "nan-max"])
def test_best_policy_table(policy, records, deleted) -> None:
    assert steps_to_delete(records, policy) == deleted


def test_newest_is_kept_even_if_policy_drops_it() -> None:
    class DropAll:
        def should_preserve(self, records):
            return [False] * len(records)

    assert steps_to_delete(recs(3, 1, 2), DropAll()) == [1, 2]
    assert steps_to_delete([], DropAll()) == []


def test_wrong_answer_length_is_an_error() -> None:
    class Short:
        def should_preserve(self, records):
            return [True]

    with pytest.raises(ValueError, match="2 records"):
        steps_to_delete(recs(1, 2), Short())


def test_best_fn_failure_names_the_step() -> None:
    with pytest.raises(ValueError, match="step 2"):
        steps_to_delete(recs(1, 2, 3, metrics={2: {"acc": 1.0}}), BestN(loss, "min", 1))


@pytest.mark.parametrize("records, mode, want", [
    (recs(1, 2, 3, 4, 5, metrics=M), "min", 2),
    (recs(1, 2, 3, 4, 5, metrics=M), "max", 3),
    (recs(1, 2, 3), "max", None),
    ([], "min", None),
    (recs(1, 2, metrics={1: {"loss": 1.0}, 2: {"loss": 1.0}}), "min", 2),
])
def test_best_step_table(records, mode, want) -> None:
    assert best_step(records, loss, mode) == want


@pytest.mark.parametrize("kwargs, records, deleted", [
    ({}, recs(*range(10)), []),
    ({"keep_period": 3}, recs(*range(10)), []),  # no max_to_keep: nothing is deleted
    ({"max_to_keep": 3}, recs(*range(10)), list(range(7))),
    ({"max_to_keep": 2, "keep_period": 4}, recs(*range(10)), [1, 2, 3, 5, 6, 7]),
    ({"max_to_keep": 1, "keep_time_interval": 4.0}, recs(*range(10)), [1, 2, 3, 5, 6, 7]),
    ({"max_to_keep": 2, "best_fn": loss, "best_mode": "min"}, recs(1, 2, 3, 4, 5, metrics=M), [1, 3]),
    ({"max_to_keep": 2, "best_fn": loss, "best_mode": "min", "keep_period": 3},
     recs(1, 2, 3, 4, 5, metrics=M), [1]),
    ({"max_to_keep": 1, "best_fn": loss, "best_mode": "min", "keep_checkpoints_without_metrics": False},
     recs(1, 2, 3, 4, 5, 6, 7, metrics=M), [1, 3, 4, 5, 6]),
], ids=["none", "period-only", "max3", "max2+period4", "max1+time4", "best2", "best2+period3",
        "best1-drop-without"])
def test_policy_from_options(kwargs, records, deleted) -> None:
    policy = policy_from_options(ManagerOptions(**kwargs))
    assert steps_to_delete(records, policy) == deleted
