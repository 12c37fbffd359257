"""comm.agreement without a process group (world size 1): plain calls, errors unchanged.

The multi-rank paths run in tests/distributed/test_dist_manager.py (real gloo groups):
a signal only one rank receives, rank-0 retention, agreed fallback, the directory lock.
"""

from __future__ import annotations

import pytest

from shardsafe.comm import agreement as agreement_module
from shardsafe.comm.agreement import Agreement
from shardsafe.errors import CheckpointError

agreement = Agreement(timeout=5)


def test_single_process_answers_are_local() -> None:
    assert agreement.rank == 0 and agreement.world_size == 1 and agreement.is_leader
    assert agreement.any_rank([True, False, 1, 0]) == [True, False, True, False]
    assert agreement.worst(2) == 2
    assert agreement.decide_together([1, 2], lambda all_: all_ + [3], what="x") == [[1, 2], 3]
    assert agreement.peer_link("/tmp") is None


def test_default_timeout_is_the_knob(monkeypatch) -> None:
    monkeypatch.setenv("SHARDSAFE_TIMEOUT", "12.5")
    assert Agreement().timeout == 12.5 and Agreement(3).timeout == 3.0


def test_leader_decides_returns_and_raises_unchanged() -> None:
    assert agreement.leader_decides(lambda: {"a": [1, 2]}, what="x") == {"a": [1, 2]}
    calls = []
    agreement.leader_acts_in_background("ns", lambda: calls.append(1), what="y")
    assert calls == [1]

    def fail() -> None:
        raise CheckpointError("boom")

    with pytest.raises(CheckpointError, match="^boom$"):
        agreement.leader_decides(fail, what="x")
    with pytest.raises(CheckpointError, match="^boom$"):
        agreement.leader_acts_in_background("ns", fail, what="y")


def test_leader_failure_is_a_checkpoint_error() -> None:
    assert issubclass(agreement_module.LeaderFailedError, CheckpointError)
