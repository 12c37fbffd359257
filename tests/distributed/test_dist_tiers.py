"""Local, peer and persistent tiers on real ranks as 2 nodes (FSDP2 + AdamW, SIGKILL):
2 ranks (one per node) by default, 4 ranks (two per node) under -m stress.

One job trains and saves (local every 2 steps, persistent every 4, replicated to the
other node) and is SIGKILLed; a second job restores three times: from every node's
local directory, from rank 1's peer copy after its local copy is damaged,
from the peers after node 1's directory is deleted, and from the
persistent tier after every local directory is deleted. Each restored state must be
bit-identical to what the uninterrupted run held at that step.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from dist_harness import run_job
from helpers import assert_same
from safetensors.torch import load_file

@pytest.fixture(scope="module", params=[2, pytest.param(4, marks=pytest.mark.stress)],
                ids=["2-ranks", "4-ranks"])
def recovered(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict], list[dict]]:
    world = request.param
    out = str(tmp_path_factory.mktemp("tiers"))
    job = run_job("tier_worker.py", world, "train", out, log_dir=out, name="train")
    assert job.codes == [-signal.SIGKILL] * world, job.logs()
    trained = [json.load(open(os.path.join(out, f"train-r{r}.json"))) for r in range(world)]
    job = run_job("tier_worker.py", world, "recover", out, log_dir=out, name="recover")
    assert job.codes == [0] * world, job.logs()
    got = [json.load(open(os.path.join(out, f"recover-r{r}.json"))) for r in range(world)]
    return out, trained, got


def on_node_1(got: list[dict]) -> list[bool]:
    """Whether each rank is on node 1 (the second half of the ranks)."""
    return [r >= len(got) // 2 for r in range(len(got))]


def test_training_kept_two_local_steps_and_the_persistent_one(recovered) -> None:  # noqa: ANN001
    _, trained, _ = recovered
    assert [t["local_steps"] for t in trained] == [[4, 6]] * len(trained)
    assert [t["all_steps"] for t in trained] == [[4]] * len(trained)


def test_crash_restores_newest_local_step_bit_exactly(recovered) -> None:  # noqa: ANN001
    out, trained, got = recovered
    assert [g["local"]["step"] for g in got] == [6] * len(got)
    assert [g["local"]["state_step"] for g in got] == [6] * len(got)
    assert [g["local"]["tier"] for g in got] == ["local"] * len(got)
    assert_same(load_file(os.path.join(out, "ref-6.safetensors")),
                load_file(os.path.join(out, "got-local.safetensors")), key_order=False)
    # and training goes on exactly as in the run that crashed
    assert [g["local"]["loss7"] for g in got] == [t["loss7"] for t in trained]


def test_damaged_local_copy_falls_back_to_the_peer_copy(recovered) -> None:  # noqa: ANN001
    out, trained, got = recovered
    assert [(g["damaged"]["step"], g["damaged"]["tier"]) for g in got] == \
        [(6, "peer" if r == 1 else "local") for r in range(len(got))]  # rank 1 alone
    assert_same(load_file(os.path.join(out, "ref-6.safetensors")),
                load_file(os.path.join(out, "got-damaged.safetensors")), key_order=False)
    with open(os.path.join(out, "recover-r1.log")) as f:
        log = f.read()
    assert "step 6: rank 1 could not load its local copy" in log and "checksum" in log.lower(), log


def test_lost_node_restores_from_peers_bit_exactly(recovered) -> None:  # noqa: ANN001
    out, trained, got = recovered
    assert [g["peer"]["step"] for g in got] == [6] * len(got)
    assert [g["peer"]["tier"] for g in got] == ["peer" if n1 else "local" for n1 in on_node_1(got)]
    assert_same(load_file(os.path.join(out, "ref-6.safetensors")),
                load_file(os.path.join(out, "got-peer.safetensors")), key_order=False)
    assert [g["peer"]["loss7"] for g in got] == [t["loss7"] for t in trained]
    # the fetched copies were stored again in node 1's local directory
    assert [g["peer"]["local_steps"] for g in got] == [[6] if n1 else [4, 6] for n1 in on_node_1(got)]


def test_without_local_copies_restores_newest_persistent_step(recovered) -> None:  # noqa: ANN001
    out, _, got = recovered
    assert [(g["persistent"]["step"], g["persistent"]["tier"]) for g in got] == [(4, "persistent")] * len(got)
    ref = load_file(os.path.join(out, "ref-4.safetensors"))
    assert_same(ref, load_file(os.path.join(out, "got-persistent.safetensors")), key_order=False)
    assert not all(torch.equal(ref[k], load_file(os.path.join(out, "ref-6.safetensors"))[k]) for k in ref)


def test_auto_interval_is_agreed_by_all_ranks(recovered) -> None:  # noqa: ANN001
    _, _, got = recovered
    intervals = [g["auto"]["interval"] for g in got]
    # rank 0's measurement wins: each rank alone would compute a different interval
    assert len(set(intervals)) == 1 and intervals[0] > 3, intervals
    assert [g["auto"]["steps"] for g in got] == [[0]] * len(got)
