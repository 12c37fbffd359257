"""torch.distributed.checkpoint through shardsafe.dcp in real gloo groups (dcp_worker.py):
FSDP2 + AdamW saved by ``dcp.save`` on 2 ranks and loaded by ``dcp.load`` on 3, bit for
bit; ``dcp.async_save``; ``dcp.load`` of a ``shardsafe.save`` checkpoint; the DCP
checkpoint read by ``shardsafe.load`` (a new dict here, in place resharded there) and
verified; a damaged block raising through ``dcp.load``; a SIGKILLed writer rank."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from dist_harness import run_ranks
from dist_worker import flat_tensors
from helpers import assert_same
from safetensors.torch import load_file

import shardsafe
from shardsafe.engine.commit import is_committed
from shardsafe.storage.local import LocalStorage

Results = dict[tuple[str, int], list[dict[str, Any] | None]]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Results]:
    out = str(tmp_path_factory.mktemp("dcp"))
    # one job (interpreter start-up is the cost): rank 1 dies in the last phase, so
    # run_ranks reports None for it; its load results are read from its file
    results = run_ranks(3, [("save", 2), ("load", 3), ("kill", 2)], out, timeout=240, killed=[1],
                        worker="dcp_worker.py")
    with open(os.path.join(out, "load-w3-r1.json")) as f:
        results[("load", 3)][1] = json.load(f)
    return out, results


def test_dcp_save_on_2_ranks_loads_with_dcp_on_3(job: tuple[str, Results]) -> None:
    job, results = job
    loads = results[("load", 3)]
    assert [r["sync"] for r in loads] == [3, 3, 3] and [r["async"] for r in loads] == [4, 4, 4]
    ref = load_file(os.path.join(job, "sync-ref.safetensors"))
    assert any(".exp_avg" in k for k in ref)  # AdamW's moments are in it
    assert_same(ref, load_file(os.path.join(job, "sync-loaded.safetensors")))
    assert_same(load_file(os.path.join(job, "async-ref.safetensors")),
          load_file(os.path.join(job, "async-loaded.safetensors")))
    # Reader on a checkpoint that shardsafe.save wrote from the same state
    assert [r["native"] for r in loads] == [3, 3, 3]
    assert_same(ref, load_file(os.path.join(job, "native-loaded.safetensors")))


def test_the_dcp_checkpoint_is_an_ordinary_shardsafe_checkpoint(job: tuple[str, Results]) -> None:
    job, results = job
    path = os.path.join(job, "sync")
    assert is_committed(LocalStorage(), path)
    assert sorted(f for f in os.listdir(path) if f.startswith("data-")) == [
        "data-r00000-000.safetensors", "data-r00001-000.safetensors"]
    state = shardsafe.load(path)  # one plain process, full tensors
    ref = load_file(os.path.join(job, "sync-ref.safetensors"))
    flat = flat_tensors({"model": state["model"], "optim": state["optim"]})
    assert_same({k: flat[k] for k in ref}, ref)
    assert type(state["step"]) is int and state["step"] == 3  # DCP's byte item, stored typed
    # in place on 3 ranks (the model's tensors; the optimizer's were unexpected there)
    assert all(r["in_place_unexpected"] > 0 for r in results[("load", 3)])
    in_place = load_file(os.path.join(job, "in-place-loaded.safetensors"))
    assert_same({k: v for k, v in ref.items() if k.startswith("model.")},
          {k: v for k, v in in_place.items() if k.startswith("model.")})


def test_a_damaged_block_raises_through_dcp_load(job: tuple[str, Results]) -> None:
    errors = [r["damaged"] for r in job[1][("load", 3)]]
    assert all(e for e in errors), errors  # every rank raised DCP's CheckpointException
    messages = list(errors[0].values())
    assert any(m.startswith("CorruptCheckpointError") and "data-r00001-000.safetensors" in m
               for m in messages), messages


def test_a_killed_writer_rank_leaves_nothing_committed(job: tuple[str, Results]) -> None:
    job, results = job
    rank0 = results[("kill", 2)][0]  # rank 1 SIGKILLed itself while writing
    assert rank0["error"] is not None and rank0["committed"] is False, rank0
    assert not os.path.exists(os.path.join(job, "killed"))
    assert any(d.startswith(".killed.shardsafe-tmp-") for d in os.listdir(job))  # what gc removes
    with pytest.raises(shardsafe.CheckpointNotFoundError):
        shardsafe.load(os.path.join(job, "killed"))
