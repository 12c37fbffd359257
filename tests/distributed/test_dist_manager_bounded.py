"""A CheckpointManager bounds every wait by its ``timeout`` (2 real gloo processes; see
manager_bounded_worker.py): a rank whose save fails before its local save costs its peer
no wait at all, and a rank that stops calling the manager turns into
CheckpointTimeoutError naming it, within the timeout, with nothing committed."""

from __future__ import annotations

import json

import pytest
from dist_harness import run_script

TIMEOUT = 3.0  # as in manager_bounded_worker.py
SLACK = 5.0


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("bounded")
    run_script("manager_bounded_worker.py", 2, str(out), timeout=120)
    return [json.loads((out / f"r{r}.json").read_text()) for r in range(2)]


def test_both_tiers_saved_step_0_from_one_copy(seen) -> None:  # noqa: ANN001
    assert [s["save0"]["error"] for s in seen] == [None, None], seen
    for s in seen:  # each rank writes part of the state; its local step holds it all, copied once
        assert s["copied0"] == s["state_bytes"], s
        assert "data-r00000-000.safetensors" in s["local_files"] or "data-r00001-000.safetensors" in s["local_files"]
        assert any("-500." in n for n in s["local_files"]), s["local_files"]  # the other rank's share


def test_a_rank_failing_before_its_local_save_costs_no_wait(seen) -> None:  # noqa: ANN001
    r0, r1 = seen
    assert r1["fail1"]["error"] == "TypeError" and "oops" in r1["fail1"]["message"], r1
    assert r0["fail1"]["error"] == "CheckpointError" and "rank 1" in r0["fail1"]["message"], r0
    # the local tiers' peer round of step 1 paired up at once: each got the other's notice
    for s in seen:
        assert s["fail1_wait"]["error"] == "CheckpointError" and "step 1" in s["fail1_wait"]["message"], s
        assert s["fail1"]["s"] + s["fail1_wait"]["s"] < TIMEOUT, s


@pytest.mark.parametrize("call", ["restore", "save2", "save2_wait"])
def test_a_silent_rank_is_named_within_the_timeout(seen, call) -> None:  # noqa: ANN001
    got = seen[0][call]
    assert got["error"] == "CheckpointTimeoutError", got
    assert "1" in got["message"].split("rank", 1)[1], got  # names rank 1
    assert got["s"] <= TIMEOUT + SLACK, got
    if call == "save2_wait":
        assert "step 2" in got["message"], got


def test_nothing_was_committed_after_step_0(seen) -> None:  # noqa: ANN001
    assert [s["steps"] for s in seen] == [[0], [0]]
