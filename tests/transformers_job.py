"""A tiny GPT-2 trained by ``transformers.Trainer`` or ``shardsafe.transformers.Trainer`` on
the CPU (built from a config: nothing is downloaded). Run as a script it trains once and
saves the final weights, or (``--kill-at``) SIGKILLs itself mid-run once the checkpoint
before is committed.

Usage: ``python transformers_job.py OUT {plain,ours} [--resume] [--kill-at STEP]``, also as
the ranks of a torchrun-style job (DDP on gloo: every rank trains on its share of the batch).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

from shardsafe.transformers import Trainer

STEPS, SAVE_STEPS = 12, 4


class Tokens(torch.utils.data.Dataset):
    """64 fixed random sequences of 16 tokens (language modelling on themselves)."""

    def __init__(self, n: int = 64, length: int = 16) -> None:
        self.x = torch.randint(0, 100, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def model() -> GPT2LMHeadModel:
    """Built after ``set_seed``: the same initial weights in every run; dropout 0.1, so the
    random generators decide the result too."""
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                      bos_token_id=0, eos_token_id=0))


def trainer(out: str, cls: type = Trainer, steps: int = STEPS, callbacks: list | None = None,
            **args: Any) -> Any:
    transformers.set_seed(0)
    kw: dict[str, Any] = dict(max_steps=steps, save_steps=SAVE_STEPS, per_device_train_batch_size=4, report_to=[],
                              logging_steps=1000, seed=0, use_cpu=True, disable_tqdm=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        kw["ddp_backend"] = "gloo"
    kw.update(args)
    evaluate = kw.get("eval_strategy", "no") != "no"
    return cls(model=model(), args=TrainingArguments(out, **kw), train_dataset=Tokens(),
               eval_dataset=Tokens(16) if evaluate else None, callbacks=callbacks)


def weights(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


class KillAt(TrainerCallback):
    """SIGKILLs the process at the end of step ``step``, once every checkpoint started
    before is committed."""

    def __init__(self, trainer_: Any, step: int) -> None:
        self.trainer, self.step = trainer_, step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            self.trainer.wait_for_checkpoints()
            os.kill(os.getpid(), signal.SIGKILL)


class TermAfterSave(TrainerCallback):
    """Sends this process SIGTERM (a preemption) right after the save at step ``step`` starts."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("kind", choices=["plain", "ours"])
    p.add_argument("--resume", action="store_true")
    p.add_argument("--kill-at", type=int)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 through Accelerate (fully_shard)")
    p.add_argument("--term-at", type=int, help="SIGTERM right after the save at this step starts")
    a = p.parse_args()
    extra = dict(fsdp="full_shard", fsdp_config={"fsdp_version": 2}) if a.fsdp else {}
    t = trainer(a.out, transformers.Trainer if a.kind == "plain" else Trainer, **extra)
    if a.kill_at:
        t.add_callback(KillAt(t, a.kill_at))
    if a.term_at:
        t.add_callback(TermAfterSave(a.term_at))
    t.train(resume_from_checkpoint=True if a.resume else None)
    if t.args.process_index == 0:
        torch.save(weights(t.accelerator.unwrap_model(t.model)), os.path.join(a.out, "final.pt"))
    if torch.distributed.is_initialized():  # else gloo's threads may abort the exit (SIGABRT)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
