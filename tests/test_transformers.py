"""shardsafe.transformers.Trainer with a real transformers.Trainer on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
import transformers  # noqa: E402
from helpers import same  # noqa: E402
from transformers_job import STEPS, trainer, weights  # noqa: E402

import shardsafe  # noqa: E402
from shardsafe.transformers import CheckpointingMixin, Trainer, committed_checkpoints  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "transformers_job.py")


def _job(python: str, env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, JOB, *argv], env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, dict]:
    """One run of the shardsafe Trainer: its output directory, the final weights and the
    weights after step 8."""
    out = str(tmp_path_factory.mktemp("hf") / "out")
    at8: dict = {}

    class Keep8(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs) -> None:  # noqa: ANN001
            if state.global_step == 8:
                at8.update(weights(model))

    t = trainer(out, callbacks=[Keep8()])
    t.train()
    return out, weights(t.model), at8


def test_sigkill_between_checkpoints_then_resume_is_bit_exact(tmp_path, python, subprocess_env) -> None:
    plain, ours_ = str(tmp_path / "plain"), str(tmp_path / "ours")
    r = _job(python, subprocess_env, plain, "plain")
    assert r.returncode == 0, r.stderr[-3000:]
    r = _job(python, subprocess_env, ours_, "ours", "--kill-at", "10")
    assert r.returncode == -9, r.stderr[-3000:]
    assert [s for s, _ in committed_checkpoints(ours_)] == [4, 8]
    r = _job(python, subprocess_env, ours_, "ours", "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    want = torch.load(os.path.join(plain, "final.pt"))
    got = torch.load(os.path.join(ours_, "final.pt"))
    assert same(got, want)
    assert [s for s, _ in committed_checkpoints(ours_)] == [4, 8, 12]


def test_a_preemption_waits_for_the_checkpoint_in_flight(tmp_path, python, subprocess_env) -> None:
    out = str(tmp_path / "term")
    r = _job(python, subprocess_env, out, "ours", "--term-at", "8")
    assert r.returncode == -15, r.stderr[-3000:]  # SIGTERM still ends the process, as before
    assert [s for s, _ in committed_checkpoints(out)] == [4, 8]  # ... once step 8 is committed
    assert "SIGTERM: waiting for the checkpoint in flight" in r.stderr
    assert shardsafe.load(os.path.join(out, "checkpoint-8"))["trainer_state"]["0"]["global_step"] == 8


def test_resume_from_a_path_is_bit_exact(ours, tmp_path) -> None:  # noqa: ANN001
    out, final, _ = ours
    t = trainer(str(tmp_path / "again"))
    t.train(resume_from_checkpoint=os.path.join(out, "checkpoint-4"))
    assert same(weights(t.model), final)
    assert t._checkpointer.closed  # train() freed the staging buffers when it returned
    t.args.max_steps = 16  # training on saves again, with new buffers
    t.train(resume_from_checkpoint=True)
    assert [s for s, _ in committed_checkpoints(str(tmp_path / "again"))] == [8, 12, 16]


def test_a_crash_before_the_files_beside_it_still_resumes(ours, tmp_path) -> None:  # noqa: ANN001
    """The commit comes first, then trainer_state.json and the rest: a checkpoint that a
    crash left without them resumes all the same (the state is in the checkpoint)."""
    import shutil

    out, final, _ = ours
    ckpt = str(tmp_path / "checkpoint-4")
    shutil.copytree(os.path.join(out, "checkpoint-4"), ckpt)
    for name in ("trainer_state.json", "config.json", "model.safetensors.index.json", "generation_config.json"):
        os.remove(os.path.join(ckpt, name))
    t = trainer(str(tmp_path / "again"))
    t.train(resume_from_checkpoint=ckpt)
    assert same(weights(t.model), final)


def test_checkpoints_hold_the_whole_training_state(ours) -> None:  # noqa: ANN001
    out, _, after8 = ours
    saved = shardsafe.load(os.path.join(out, "checkpoint-8"))
    assert same({k: saved[k] for k in after8}, after8)  # the weights, under their own names
    assert {"optimizer", "lr_scheduler", "rng", "trainer_state"} <= set(saved)
    assert saved["trainer_state"]["0"]["global_step"] == 8  # every rank's view
    assert len(saved["optimizer"]["state"]) == len(list(trainer(out + "-x").model.parameters()))
    assert saved["rng"]["0"]["python"]["state"]  # every rank's generators
    for name in ("config.json", "trainer_state.json", "model.safetensors.index.json"):
        assert os.path.isfile(os.path.join(out, "checkpoint-8", name)), name


def test_from_pretrained_reads_the_trained_weights(ours) -> None:  # noqa: ANN001
    out, final, after8 = ours
    for step, want in (("12", final), ("8", after8)):
        m = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(out, f"checkpoint-{step}"))
        assert same(weights(m), want), step


def test_save_total_limit_keeps_the_newest_committed(tmp_path) -> None:
    seen: list[list[int]] = []

    class Watch(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs) -> None:  # noqa: ANN001
            seen.append([s for s, _ in committed_checkpoints(str(tmp_path / "lim"))])

    t = trainer(str(tmp_path / "lim"), save_steps=2, save_total_limit=2, callbacks=[Watch()])
    t.train()
    assert [s for s, _ in committed_checkpoints(str(tmp_path / "lim"))] == [10, 12]
    assert sorted(os.listdir(tmp_path / "lim")) == ["checkpoint-10", "checkpoint-12"]
    # retention runs once a checkpoint is committed: never fewer than the limit once reached,
    # at most one more until the oldest is deleted
    counts = [len(s) for s in seen]
    first = next(i for i, n in enumerate(counts) if n >= 2)
    assert all(n >= 2 for n in counts[first:]) and max(counts) <= 3, seen


def test_load_best_model_at_end_keeps_and_loads_the_best(tmp_path) -> None:
    out = str(tmp_path / "best")
    t = trainer(out, save_total_limit=1, eval_strategy="steps", eval_steps=4, load_best_model_at_end=True,
                metric_for_best_model="loss", greater_is_better=False)
    t.train()
    best = t.state.best_model_checkpoint
    # a limit of 1 keeps the best and the newest while training, the best alone at the end
    assert [p for _, p in committed_checkpoints(out)] == [best]
    saved = shardsafe.load(best)
    assert same({k: saved[k] for k in weights(t.model)}, weights(t.model))  # loaded at the end


def test_save_only_model_holds_the_weights_only(tmp_path) -> None:
    t = trainer(str(tmp_path / "only"), steps=4, save_only_model=True)
    t.train()
    saved = shardsafe.load(os.path.join(str(tmp_path / "only"), "checkpoint-4"))
    assert "optimizer" not in saved and "rng" not in saved and saved["trainer_state"]["0"]["global_step"] == 4
    assert same({k: v for k, v in saved.items() if k != "trainer_state"}, weights(t.model))


class CountingTrainer(transformers.Trainer):
    """A Trainer subclass from 'another library': it changes the loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001, ANN201
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return loss * 0.5 if not return_outputs else (loss[0] * 0.5, loss[1])


class MyTrainer(CheckpointingMixin, CountingTrainer):
    pass


def test_the_mixin_checkpoints_a_trainer_subclass(tmp_path) -> None:
    full = trainer(str(tmp_path / "full"), cls=MyTrainer, steps=8)
    full.train()
    assert [s for s, _ in committed_checkpoints(str(tmp_path / "full"))] == [4, 8]
    resumed = trainer(str(tmp_path / "res"), cls=MyTrainer, steps=8)
    resumed.train(resume_from_checkpoint=os.path.join(str(tmp_path / "full"), "checkpoint-4"))
    assert same(weights(resumed.model), weights(full.model))
    plain = trainer(str(tmp_path / "plain"), cls=CountingTrainer, steps=8)
    plain.train()
    assert same(weights(plain.model), weights(full.model))  # the same training as without shardsafe


def test_a_checkpoint_verifies(ours, cli) -> None:  # noqa: ANN001
    out, _, _ = ours
    r = cli("verify", os.path.join(out, "checkpoint-12"))
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    assert isinstance(Trainer.__mro__[1], type) and sys.modules["shardsafe.transformers"]


@pytest.mark.parametrize("mode", ["ddp", pytest.param("fsdp2", marks=pytest.mark.stress)])
def test_two_ranks_killed_and_resumed_are_bit_exact(tmp_path, mode) -> None:
    """The same Trainer under torchrun on gloo, 2 ranks, with DDP or with FSDP2 through
    Accelerate: killed with SIGKILL between checkpoints and resumed, it ends where the plain
    Trainer's uninterrupted run ends; a DDP checkpoint also resumes on one process (the
    Trainer allows another rank count there)."""
    from dist_harness import run_job

    flags = ["--fsdp"] if mode == "fsdp2" else []
    plain, ours_ = str(tmp_path / "plain"), str(tmp_path / "ours")
    job = run_job(JOB, 2, plain, "plain", *flags, timeout=240)
    assert job.codes == [0, 0], job.logs()
    job = run_job(JOB, 2, ours_, "ours", "--kill-at", "10", *flags, timeout=240)
    assert job.codes == [-9, -9], job.logs()
    assert [s for s, _ in committed_checkpoints(ours_)] == [4, 8]
    job = run_job(JOB, 2, ours_, "ours", "--resume", *flags, timeout=240)
    assert job.codes == [0, 0], job.logs()
    assert same(torch.load(os.path.join(ours_, "final.pt")), torch.load(os.path.join(plain, "final.pt")))
    saved = shardsafe.load(os.path.join(ours_, "checkpoint-8"))
    assert sorted(saved["rng"]) == ["0", "1"]  # each rank's generators
    if mode == "ddp":
        one = trainer(str(tmp_path / "one"))
        one.train(resume_from_checkpoint=os.path.join(ours_, "checkpoint-8"))
        assert one.state.global_step == 12


def test_export_writes_the_standard_layout(ours, cli, tmp_path) -> None:  # noqa: ANN001
    """``shardsafe export --exclude`` leaves out the training state: config.json beside the
    exported model.safetensors is a directory from_pretrained reads."""
    import shutil

    out, final, _ = ours
    ckpt = os.path.join(out, "checkpoint-12")
    dest = tmp_path / "exported"
    dest.mkdir()
    shutil.copy(os.path.join(ckpt, "config.json"), dest)
    excluded = [a for k in ("optimizer", "lr_scheduler", "rng", "trainer_state") for a in ("--exclude", k)]
    r = cli("export", ckpt, str(dest / "model.safetensors"), *excluded, "-q")
    assert r.returncode == 0, r.stderr
    from safetensors import safe_open

    with safe_open(str(dest / "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if k.split(".")[0] in ("optimizer", "rng", "lr_scheduler")]
    m = transformers.AutoModelForCausalLM.from_pretrained(str(dest))
    assert same(weights(m), final)
    r = cli("export", ckpt, str(tmp_path / "x.safetensors"), "--exclude", "nope")
    assert r.returncode != 0 and "--exclude 'nope'" in r.stderr
