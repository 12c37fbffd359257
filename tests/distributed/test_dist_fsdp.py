"""FSDP2 + AdamW saved on 4 ranks; reloaded on 2, 3, 4 ranks and in one process.

Also: a 2x2 mesh (Shard/Replicate) reloaded on 1-D meshes, replicated state written
once with balanced per-rank bytes, and a rank that raises while preparing. All ranks
are real processes in a gloo group (see dist_harness).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from dist_worker import flat_tensors, mesh_tensors, replicated_state
from helpers import assert_same
from safetensors.torch import load_file

import shardsafe
from shardsafe.api.load import read_checkpoint_index


@pytest.fixture
def saved(cluster) -> tuple[str, list[dict[str, Any]]]:  # noqa: ANN001
    out, results = cluster
    return out, results[("save", 4)]


def test_fsdp_checkpoint_holds_each_shard_once(saved) -> None:  # noqa: ANN001
    out, _ = saved
    index = read_checkpoint_index(os.path.join(out, "fsdp"))
    assert index.world_size == 4 and len(index.files) == 4
    weight = next(t for t in index.tensors if t.key == ("app", "model", "2.weight"))
    # 7 rows over 4 ranks: uneven shards 2, 2, 2, 1, each a chunk of its own rank's file
    assert [c.shape for c in weight.chunks] == [(2, 32), (2, 32), (2, 32), (1, 32)]
    assert [c.file for c in weight.chunks] == [f"data-r{r:05d}-000.safetensors" for r in range(4)]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_fsdp_reloads_bit_identically_on_other_world_sizes(cluster, saved, world: int) -> None:  # noqa: ANN001
    out, before = saved
    results = cluster[1][("load", world)]
    assert all(r["step"] == 3 for r in results)
    ref = load_file(os.path.join(out, "fsdp-ref.safetensors"))
    assert_same(ref, load_file(os.path.join(out, f"fsdp-loaded-{world}.safetensors")), key_order=False)
    # the 2x2-mesh checkpoint onto a 1-D mesh of this world size (resharded)
    for r in results:
        assert r["mesh_equal"] == {"a": True, "b": True, "c": True} and r["plain_equal"]
        assert r["absent"] == "CheckpointNotFoundError"
    if world == 4:  # training goes on exactly as it did in the saving job
        assert [r["losses_after"] for r in results] == [r["losses_after"] for r in before]
        assert_same(load_file(os.path.join(out, "fsdp-ref-after.safetensors")),
                    load_file(os.path.join(out, "fsdp-loaded-after.safetensors")), key_order=False)


def test_fsdp_loads_in_one_process_without_a_process_group(saved) -> None:  # noqa: ANN001
    out, _ = saved
    state = shardsafe.load(os.path.join(out, "fsdp"))
    assert state["step"] == 3
    assert state["app"]["optim"]["param_groups"][0]["lr"] == 0.01
    assert_same(load_file(os.path.join(out, "fsdp-ref.safetensors")),
                flat_tensors(state["app"]), key_order=False)
    mesh = shardsafe.load(os.path.join(out, "mesh2d"))
    for k, full in mesh_tensors().items():
        assert torch.equal(mesh["m"][k], full) and mesh["m"][k].dtype == full.dtype


def test_2d_mesh_replicated_boxes_are_written_once(saved) -> None:  # noqa: ANN001
    out, _ = saved
    index = read_checkpoint_index(os.path.join(out, "mesh2d"))
    for t in index.tensors:
        assert sum(c.nbytes for c in t.chunks) == t.nbytes  # no box twice
    a = next(t for t in index.tensors if t.key == ("m", "a"))  # (Replicate, Shard(0))
    assert [(c.offsets, c.shape) for c in a.chunks] == [((0, 0), (3, 5)), ((3, 0), (3, 5))]


def test_replicated_state_is_written_once_and_balanced(saved) -> None:  # noqa: ANN001
    out, _ = saved
    path = os.path.join(out, "replicated")
    index = read_checkpoint_index(path)
    one_copy = sum(t.numel() * t.element_size() for t in replicated_state()["w"].values())
    per_file = {f.name: f.size - f.data_start for f in index.files}
    assert sum(per_file.values()) == one_copy
    assert len(per_file) == 4
    mean = one_copy / 4
    assert max(per_file.values()) <= 1.10 * mean, per_file
    disk = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    assert disk < one_copy * 1.15  # headers and index on top of one copy, not four
    loaded = shardsafe.load(path)
    want = replicated_state()
    assert loaded["step"] == 11 and loaded["note"] == want["note"]
    assert all(torch.equal(loaded["w"][k], v) for k, v in want["w"].items())


def test_a_rank_raising_while_preparing_fails_every_rank(saved) -> None:  # noqa: ANN001
    out, results = saved
    assert results[1]["bad"].startswith("TypeError: cannot save value of type builtins.object")
    for r in (0, 2, 3):
        assert results[r]["bad"].startswith("CheckpointError:"), results[r]["bad"]
        assert "rank 1 failed" in results[r]["bad"] and "'oops'" in results[r]["bad"]
    assert not os.path.exists(os.path.join(out, "bad"))
    assert not [n for n in os.listdir(out) if n.startswith(".bad")]



@pytest.mark.parametrize("world", [2, 4])
def test_per_rank_state_comes_back_to_its_own_rank(cluster, saved, world: int) -> None:  # noqa: ANN001
    out, before = saved
    for rank, r in enumerate(cluster[1][("load", world)]):
        assert r["draw_after_load"] == before[rank]["draw_after_save"]  # RNG of this very rank
        assert r["mine"] == [rank, [float(rank)] * 3]
    state = shardsafe.load(os.path.join(out, "perrank"))  # one process: every rank's entry
    assert sorted(state["rng"]) == ["0", "1", "2", "3"]
    assert [state["mine"][str(r)]["rank"] for r in range(4)] == [0, 1, 2, 3]
    assert len({bytes(state["rng"][str(r)]["torch"].numpy()) for r in range(4)}) == 4
