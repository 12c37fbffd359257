"""shardsafe's Trainer against the plain ``transformers.Trainer``, in one run.

    python -m shardsafe.bench.transformers [--steps 80] [--save-steps 10] [--layers 8] [--repeat 2] [--dir DIR] [--json]

The model is a GPT-2 of about 43 M parameters built from a config (``n_embd`` 512,
``--layers`` blocks, a 33,000-token vocabulary; nothing is downloaded), trained with AdamW
on random tokens on the CPU, so a checkpoint holds about 510 MB (weights and the two
moments). Three runs of the same training, in turn: the plain Trainer saving every
``--save-steps`` steps, ``shardsafe.transformers.Trainer`` saving as often, and the plain
Trainer not saving at all; with ``--repeat 2`` the runs go in the order plain,
shardsafe, none, none, shardsafe, plain (so that warming up favours none of them) and
each figure is the median of its runs. Measured:

* blocked: the time the training loop spends in each save, median over the run's saves
  (shardsafe's includes the wait before the next optimizer step for the copy of the
  tensors to finish, the only other time the loop waits for a checkpoint);
* throughput: optimizer steps per second over the whole run (until ``train()`` returns,
  so shardsafe's includes waiting for its last checkpoint), relative to the run without
  checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from .. import transformers as ours
from .measure import remove


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        self.x = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _timed(cls: type) -> type:
    """``cls`` recording how long each save holds the training loop."""

    class Timed(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self.blocked: list[float] = []

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            t = time.perf_counter()
            super()._save_checkpoint(model, trial)
            self.blocked.append(time.perf_counter() - t)

        def _wait_staged(self) -> None:  # shardsafe's Trainer only: before the next optimizer step
            t = time.perf_counter()
            super()._wait_staged()  # type: ignore[misc]
            if self.blocked:
                self.blocked[-1] += time.perf_counter() - t

    return Timed


def run(kind: str, out: str, steps: int, save_steps: int, layers: int) -> dict[str, Any]:
    transformers.set_seed(0)
    vocab = 33_000
    model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=512, n_head=8, vocab_size=vocab, n_positions=128,
                                       bos_token_id=0, eos_token_id=0))
    cls = _timed(ours.Trainer if kind == "shardsafe" else transformers.Trainer)
    args = TrainingArguments(out, max_steps=steps, save_steps=save_steps, per_device_train_batch_size=2,
                             save_strategy="no" if kind == "none" else "steps", report_to=[], logging_steps=10**6,
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    trainer = cls(model=model, args=args, train_dataset=_Tokens(steps * 2, 64, vocab))
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # the report is the output
    t = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t
    params = sum(p.numel() for p in model.parameters())
    return {"kind": kind, "params": params, "steps": steps, "seconds": total, "steps_per_s": steps / total,
            "saves": len(trainer.blocked), "blocked_median_s": statistics.median(trainer.blocked) if trainer.blocked
            else 0.0, "blocked_s": trainer.blocked}


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One kind's runs as one: the median throughput, every save's blocked time."""
    blocked = [b for r in runs for b in r["blocked_s"]]
    rate = statistics.median(r["steps_per_s"] for r in runs)
    return {**runs[0], "seconds": statistics.median(r["seconds"] for r in runs), "steps_per_s": rate,
            "runs_steps_per_s": [r["steps_per_s"] for r in runs], "saves": len(blocked) // len(runs),
            "blocked_median_s": statistics.median(blocked) if blocked else 0.0, "blocked_s": blocked}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m shardsafe.bench.transformers", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each kind, in mirrored order")
    ap.add_argument("--save-steps", type=int, default=10)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary directory)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    root = a.dir or tempfile.mkdtemp(prefix="shardsafe-bench-hf-")
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "shardsafe": [], "none": []}
    order = ("plain", "shardsafe", "none")
    for r in range(a.repeat):
        for kind in order if r % 2 == 0 else order[::-1]:
            out = os.path.join(root, f"{kind}-{r}")
            runs[kind].append(run(kind, out, a.steps, a.save_steps, a.layers))
            remove(out)
    results = {kind: _median_run(rs) for kind, rs in runs.items()}
    base = results["none"]["steps_per_s"]
    summary = {
        "load_average": os.getloadavg()[0],
        "params": results["none"]["params"],
        "blocked_ratio": results["shardsafe"]["blocked_median_s"] / results["plain"]["blocked_median_s"],
        "throughput_vs_no_checkpoints": {k: results[k]["steps_per_s"] / base for k in ("plain", "shardsafe")},
        "runs": results,
    }
    if a.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"GPT-2, {summary['params'] / 1e6:.1f} M parameters, {a.steps} steps, a save every {a.save_steps} "
          f"(load average {summary['load_average']:.2f})")
    print(f"{'':12} {'blocked per save (median)':>26} {'steps/s':>9} {'vs no checkpoints':>18}")
    for k in ("plain", "shardsafe", "none"):
        r = results[k]
        print(f"{k:12} {r['blocked_median_s']:>24.3f} s {r['steps_per_s']:>9.3f} {r['steps_per_s'] / base:>17.3f}x")
    print(f"blocked, shardsafe / plain: {summary['blocked_ratio']:.3f}x")


if __name__ == "__main__":
    main()
