"""shardsafe.lightning.ShardsafeCheckpointIO with a real Lightning Trainer on the CPU."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("lightning")

import torch  # noqa: E402
from dist_harness import run_script  # noqa: E402
from helpers import assert_same, same  # noqa: E402
from lightning_job import Net, data, full_and_resumed, resume, trainer, weights  # noqa: E402

import shardsafe  # noqa: E402
from shardsafe.lightning import RNG_KEY, ShardsafeCheckpointIO, load_from_checkpoint  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, dict, object, object]:
    root = str(tmp_path_factory.mktemp("lightning"))
    return (root, *full_and_resumed(root))


def test_resume_from_last_is_bit_exact(job) -> None:  # noqa: ANN001
    root, full, resumed, _, _ = job
    assert same(full, resumed)
    # the checkpoint carries the generators Lightning does not save itself
    assert RNG_KEY in shardsafe.load(os.path.join(root, "run", "last.ckpt"))


def test_without_the_generators_the_resume_diverges(job) -> None:  # noqa: ANN001
    """Negative control: the same checkpoint without the plugin's RNG state is not exact
    (dropout masks and shuffles come from the new process's generators)."""
    root, full, _, _, _ = job
    _, _, model = resume(root, os.path.join(root, "stop2-no-rng.ckpt"), run="control")
    assert not same(full, weights(model))


def test_top_k_and_last_are_shardsafe_checkpoints_and_deletions_use_delete(job) -> None:  # noqa: ANN001
    root, _, _, t, ckpt = job
    run = os.path.join(root, "run")
    kept = sorted(os.path.basename(p) for p in ckpt.best_k_models)
    assert len(kept) == 2
    # top-2 by val_loss plus last; the epochs that dropped out of the top 2 were deleted
    assert sorted(os.listdir(run)) == sorted([*kept, "last.ckpt"])
    for name in os.listdir(run):
        ck = shardsafe.load(os.path.join(run, name))
        assert {"state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks",
                "hyper_parameters", "epoch", "global_step"} <= ck.keys()
    assert shardsafe.load(os.path.join(run, "last.ckpt"))["epoch"] == 3
    # validate(ckpt_path="best") loads the best checkpoint through the plugin
    metrics = t.validate(Net(), data(48, False), ckpt_path="best", verbose=False)
    assert metrics[0]["val_loss"] == pytest.approx(float(ckpt.best_model_score), rel=1e-6)


def test_load_from_checkpoint_builds_the_module(job) -> None:  # noqa: ANN001
    root, _, _, _, ckpt = job
    best = ckpt.best_model_path
    model = load_from_checkpoint(Net, best)
    assert isinstance(model, Net)
    assert model.hparams.hidden == 16 and model.hparams.tags == ["a", 1]
    assert same(weights(model), shardsafe.load(best)["state_dict"])
    wider = load_from_checkpoint(Net, os.path.join(root, "run", "last.ckpt"), strict=False, lr=0.5)
    assert wider.hparams.lr == 0.5  # keyword arguments override the saved hyperparameters


def test_a_value_that_cannot_be_stored_is_a_clear_type_error(tmp_path) -> None:  # noqa: ANN001
    t, _ = trainer(str(tmp_path), 1, limit_train_batches=1, limit_val_batches=1)
    with pytest.raises(TypeError, match=r"hyper_parameters\.extra"):
        t.fit(Net(extra=object()), data(), data(48, False))
    assert not any(n.endswith(".ckpt") for n in os.listdir(tmp_path))


def test_class_objects_are_stored_by_name_and_map_location_moves_tensors(tmp_path) -> None:  # noqa: ANN001
    io = ShardsafeCheckpointIO(rng=False)
    io.save_checkpoint({"hparams_type": dict, "t": (torch.ones(2), int)}, tmp_path / "c.ckpt")
    got = io.load_checkpoint(tmp_path / "c.ckpt", map_location="cpu")
    assert got["hparams_type"] == "builtins.dict"
    assert got["t"][1] == "builtins.int" and torch.equal(got["t"][0], torch.ones(2))
    assert RNG_KEY not in shardsafe.load(str(tmp_path / "c.ckpt"))


@pytest.mark.parametrize("async_save", [False, True])
def test_compressed_checkpoints(tmp_path, async_save) -> None:  # noqa: ANN001
    io = ShardsafeCheckpointIO(rng=False, async_save=async_save, compression="auto")
    w = torch.randn(256, 256).mul_(0.02).to(torch.bfloat16)
    io.save_checkpoint({"state_dict": {"w": w}, "epoch": 3}, tmp_path / "c.ckpt")
    got = io.load_checkpoint(tmp_path / "c.ckpt")
    assert torch.equal(got["state_dict"]["w"], w) and got["epoch"] == 3
    assert (tmp_path / "c.ckpt" / "data-r00000-000.blocks").exists()
    with pytest.raises(ValueError, match="compression"):
        ShardsafeCheckpointIO(compression="gzip")


def test_async_saves_are_waited_for_before_teardown_and_removal(tmp_path) -> None:  # noqa: ANN001
    io = ShardsafeCheckpointIO(async_save=True)
    t, ckpt = trainer(str(tmp_path), 2, io)
    t.fit(Net(), data(), data(48, False))
    assert io._handle is None  # teardown waited for the last save
    assert shardsafe.load(str(tmp_path / "last.ckpt"))["epoch"] == 1
    io.save_checkpoint({"x": torch.ones(3)}, tmp_path / "a.ckpt")
    io.remove_checkpoint(tmp_path / "a.ckpt")  # waits for the save in flight, then deletes it
    assert not (tmp_path / "a.ckpt").exists()


@pytest.mark.stress
def test_ddp_on_two_processes_resumes_bit_exactly(tmp_path) -> None:  # noqa: ANN001
    """strategy="ddp" on 2 CPU processes, asynchronous saves: Lightning saves from rank 0
    only (collective=False), every rank loads on its own."""
    run_script(os.path.join(HERE, "lightning_job.py"), 2, str(tmp_path), timeout=240, env={"NODE_RANK": "0"})
    finals = [{kind: torch.load(tmp_path / f"final-r{r}-{kind}.pt") for kind in ("full", "resumed")}
              for r in range(2)]
    for r in range(2):
        assert_same(finals[r]["resumed"], finals[r]["full"], f"rank {r}")
    assert_same(finals[1]["resumed"], finals[0]["resumed"])  # DDP kept the replicas equal
