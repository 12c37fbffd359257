"""Case (c): a small transformer trained on the CPU, with and without async checkpoints.

Throughput is steps per second over the timed steps; saves happen every ``every``
steps. Background staging follows the DataStates/CheckFreq pattern: the save starts
after ``optimizer.step()``, the copy overlaps the next forward/backward, and
``wait_staged()`` is called right before the next ``optimizer.step()``. The last save
is waited for after the timed window (it is not training time).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import shardsafe

from . import systems


@dataclass(frozen=True)
class ModelSize:
    """The size of case (c)'s small transformer language model and of its batches."""

    vocab: int = 2048
    """Tokens in the vocabulary (embedding and output rows)."""
    d_model: int = 256
    """Width of every layer."""
    layers: int = 4
    """Transformer encoder layers."""
    heads: int = 4
    """Attention heads per layer."""
    seq: int = 64
    """Tokens per sequence."""
    batch: int = 8
    """Sequences per step."""


QUICK = ModelSize(vocab=512, d_model=32, layers=1, heads=2, seq=16, batch=4)


class TinyLM(nn.Module):
    def __init__(self, m: ModelSize) -> None:
        super().__init__()
        self.emb = nn.Embedding(m.vocab, m.d_model)
        layer = nn.TransformerEncoderLayer(m.d_model, m.heads, 4 * m.d_model, dropout=0.0,
                                           batch_first=True)
        self.body = nn.TransformerEncoder(layer, m.layers, enable_nested_tensor=False)
        self.head = nn.Linear(m.d_model, m.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.emb(x)))


class _Saver:
    """One checkpointing variant: ``start(state, path)`` at a save step, ``before_step()``
    before each optimizer step, ``finish()`` after the loop."""

    def __init__(self, kind: str, ckpt: shardsafe.Checkpointer | None) -> None:
        self.kind, self.ckpt = kind, ckpt
        self.handle: Any = None

    def start(self, state: dict[str, Any], path: str) -> None:
        if self.kind == "dcp.async_save":
            if self.handle is not None:
                self.handle.result()
            dcp = systems._dcp()
            sd = {"model": state["model"].state_dict(), "optim": state["optim"].state_dict()}
            fut = dcp.async_save(sd, checkpoint_id=path)
            self.handle = getattr(fut, "upload_completion", fut)
        else:
            staging = "background" if "background" in self.kind else "blocking"
            self.handle = self.ckpt.async_save(state, path, staging=staging)

    def before_step(self) -> None:
        if self.handle is not None and hasattr(self.handle, "wait_staged"):
            self.handle.wait_staged()

    def finish(self) -> None:
        if self.handle is not None:
            self.handle.result()


def run_loop(model: nn.Module, opt: torch.optim.Optimizer, batches: list[torch.Tensor], steps: int,
             every: int, saver: _Saver | None, path_for: Callable[[int], str]) -> float:
    """Trains ``steps`` steps; returns steps per second."""
    loss_fn = nn.CrossEntropyLoss()
    t = time.perf_counter()
    for step in range(steps):
        x = batches[step % len(batches)]
        logits = model(x[:, :-1])
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        if saver is not None:
            saver.before_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if saver is not None and step % every == every - 1 and step < steps - 1:
            saver.start({"model": model, "optim": opt, "step": step}, path_for(step))
    rate = steps / (time.perf_counter() - t)
    if saver is not None:
        saver.finish()
    return rate


VARIANTS = ("none", "shardsafe async_save (blocking)", "shardsafe async_save (background)",
            "dcp.async_save")


def run_training(directory: str, size: ModelSize, steps: int, every: int, repeat: int, *,
                 warmup_steps: int = 2) -> tuple[dict[str, list[float]], int]:
    """Steps/s of each variant, interleaved over ``repeat`` rounds; and the state's bytes."""
    torch.manual_seed(0)
    model = TinyLM(size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, size.vocab, (size.batch, size.seq + 1), generator=g) for _ in range(4)]
    # warm-up: kernels, and the optimizer state exists before the first save (layout is stable)
    run_loop(model, opt, batches, max(1, warmup_steps), every, None, lambda s: "")
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ckpt = shardsafe.Checkpointer()
    try:
        for r in range(repeat):
            for v in VARIANTS:
                saver = None if v == "none" else _Saver(v, ckpt)
                tag = v.split()[0].replace(".", "_") + ("_bg" if "background" in v else "")
                rates[v].append(run_loop(model, opt, batches, steps, every, saver,
                                         lambda s, t=tag: f"{directory}/train-{t}-{r}-{s}"))
                systems_cleanup(directory)
    finally:
        ckpt.close()
    return rates, state_bytes


def systems_cleanup(directory: str) -> None:
    import os

    from .measure import remove

    for name in os.listdir(directory):
        if name.startswith("train-"):
            remove(os.path.join(directory, name))
