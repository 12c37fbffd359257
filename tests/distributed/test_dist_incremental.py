"""CheckpointManager(incremental=True) on 3 gloo ranks: each rank hashes what it writes and
references its own unchanged shards in the collective save; restore is bit-exact."""

from __future__ import annotations


def test_incremental_collective_saves(cluster) -> None:  # noqa: ANN001
    _, results = cluster
    ranks = results[("incremental", 3)]
    assert all(r["steps"] == [2, 3] and r["restored"] == 3 and r["step"] == 3 for r in ranks)
    assert all(r["base_ok"] and r["adapter"] for r in ranks)
    files = ranks[0]["files"]
    # every rank's shard of the frozen base stays in the data file step 0 wrote
    assert {f"step_00000000/data-r0000{r}-000.safetensors" for r in range(3)} <= set(files)
    assert all(r["own_bytes"] < 8192 for r in ranks)  # step 3 wrote only the adapter


def test_incremental_compressed_collective_saves(cluster) -> None:  # noqa: ANN001
    _, results = cluster
    ranks = results[("incremental", 3)]
    assert all(r["z_restored"] == 2 and r["z_base_ok"] for r in ranks)
    # every rank's compressed shard of the base stays in the block file step 0 wrote
    assert {f"step_00000000/data-r0000{r}-000.blocks" for r in range(3)} <= set(ranks[0]["z_files"])
