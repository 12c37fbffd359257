"""Async saves of GPU state save the values of the moment of the call, whatever the
streams do around it: the copies wait for the work already queued on the caller's stream
(values produced late by a slow kernel are the ones saved), and changes made right after
``async_save`` returns (blocking staging) or after ``wait_staged()`` (background staging),
such as the next optimizer step, are not. Also on a stream of the caller's own, under a
staging budget, with compression, and when the caller drops the tensors at once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from gpu_helpers import SLOW_CYCLES, assert_bytes_equal, fill_late, to_host

import shardsafe

MiB = 1 << 20
# (staging, max_staging_bytes) of a Checkpointer's async_save; under the budget the state
# streams through three 1 MiB units (the helpers of the copy pool stage some of them)
SAVES = {"blocking": ("blocking", None), "background": ("background", None),
         "budget": ("blocking", 3 * MiB), "budget background": ("background", 3 * MiB)}


@contextlib.contextmanager
def on_stream(kind: str, device: torch.device) -> Iterator[None]:
    """The caller's stream: the default one, or a stream of its own (as with CUDA graphs,
    or a trainer that overlaps its own work)."""
    if kind == "default":
        yield
        return
    s = torch.cuda.Stream(device=device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        yield
    torch.cuda.current_stream(device).wait_stream(s)


def _state(device: torch.device) -> dict[str, torch.Tensor]:
    # 4 MiB and more: more than the budget, so units stream and are copied from offsets
    return {"w": torch.zeros(MiB + 333, device=device),
            "b": torch.zeros(1000, device=device, dtype=torch.bfloat16),
            "t": torch.zeros(512, 384, device=device).t()}


@pytest.mark.parametrize("stream", ["default", "own"])
@pytest.mark.parametrize("how", list(SAVES))
def test_saves_values_queued_before_the_call_and_not_changes_after(tmp_path, device, how, stream) -> None:
    staging, budget = SAVES[how]
    state = _state(device)
    path = str(tmp_path / "ckpt")
    with shardsafe.Checkpointer(unit_size=MiB, max_staging_bytes=budget) as ckpt, \
            on_stream(stream, device):
        for t in state.values():
            fill_late(t, 1.0)  # still queued behind a slow kernel when async_save is called
        h = ckpt.async_save(state, path, staging=staging)
        if staging == "background":
            h.wait_staged()
        for t in state.values():  # the next optimizer step, right away
            t.fill_(2.0)
        h.result()
    got = shardsafe.load(path)
    for k, t in state.items():
        want = torch.ones(t.shape, dtype=t.dtype)
        assert torch.equal(got[k], want), (k, got[k].unique())
    assert all(bool((t == 2).all()) for t in state.values())  # the caller's change stands


def test_optimizer_step_right_after_async_save_returns(tmp_path, device) -> None:
    """A real model and AdamW on the GPU: the step after ``async_save`` does not leak into
    the checkpoint; the optimizer's moments and step counts are the ones of the call."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(256, 512, device=device)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()
    step()
    snapshot = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                "exp_avg": [opt.state[p]["exp_avg"].clone() for p in model.parameters()]}
    path = str(tmp_path / "ckpt")
    with shardsafe.Checkpointer() as ckpt:
        h = ckpt.async_save({"model": model, "optim": opt}, path)
        step()  # no synchronisation in between
        h.result()
    got = shardsafe.load(path)
    for k, v in snapshot["model"].items():
        assert_bytes_equal(got["model"][k], v, k)
        assert not torch.equal(model.state_dict()[k], v), k  # the step did change the model
    moments = [s["exp_avg"] for _, s in sorted(got["optim"]["state"].items(), key=lambda kv: int(kv[0]))]
    for a, b in zip(moments, snapshot["exp_avg"], strict=True):
        assert_bytes_equal(a, b, "exp_avg")


@pytest.mark.parametrize("staging", ["blocking", "background"])
def test_tensors_dropped_right_after_the_call_are_saved_intact(tmp_path, device, staging) -> None:
    """The caller drops its only references and allocates (and fills) new GPU memory at
    once: the memory being copied must not be handed out and overwritten meanwhile."""
    path = str(tmp_path / "ckpt")
    g = torch.Generator().manual_seed(7)
    expect = [torch.randn(MiB, generator=g) for _ in range(4)]
    with shardsafe.Checkpointer(unit_size=MiB, max_staging_bytes=2 * MiB) as ckpt:
        state = {"w": [e.to(device) for e in expect]}
        torch.cuda._sleep(SLOW_CYCLES)  # the copies queue behind this
        h = ckpt.async_save(state, path, staging=staging)
        del state
        junk = [torch.full((MiB,), -5.0, device=device) for _ in range(8)]
        h.result()
        del junk
    got = shardsafe.load(path)
    for a, b in zip(got["w"], expect, strict=True):
        assert torch.equal(a, b)


def test_compressed_async_save_of_gpu_state_streaming_under_a_budget(tmp_path, device) -> None:
    pytest.importorskip("zstandard", reason="compression='zstd' needs the zstandard package")
    g = torch.Generator(device=device).manual_seed(9)
    # 80 MiB through a 48 MiB budget (one 16 MiB unit besides the coding room): compressible
    # bf16 weights and random fp32 moments
    state = {"w": (torch.randn(16 * MiB, generator=g, device=device) * 0.01).to(torch.bfloat16),
             "m": torch.randn(12 * MiB, generator=g, device=device)}
    want = {k: to_host(v) for k, v in state.items()}
    want["m"][0] = 3.0
    path = str(tmp_path / "ckpt")
    with shardsafe.Checkpointer(max_staging_bytes=48 * MiB, compression="zstd") as ckpt:
        with on_stream("own", device):
            fill_late(state["m"][:1], 3.0)
            h = ckpt.async_save(state, path)
            for t in state.values():
                t.zero_()
        h.result()
    target = {k: torch.empty_like(v) for k, v in state.items()}
    shardsafe.load(path, target)
    for k, v in want.items():
        assert_bytes_equal(target[k], v, k)
