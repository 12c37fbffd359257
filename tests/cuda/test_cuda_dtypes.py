"""Every dtype torch has on the GPU: CUDA tensors saved with ``save`` and ``async_save``
(blocking and background staging, and streamed under a staging budget) load back
bit-exactly, in place onto the GPU and as new CPU tensors; and views (non-contiguous,
offset, expanded, conjugated, negated) are saved as their logical values."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from gpu_helpers import DTYPE_NAMES, assert_bytes_equal, blank_like, host_bytes, random_tensor, torch_dtype

import shardsafe

MiB = 1 << 20
MODES = ("save", "async blocking", "async background", "async budget")


def save(mode: str, state: Any, path: str) -> None:
    """Saves ``state`` to ``path`` the way ``mode`` says and waits until it is committed.

    "async budget" streams through two 1 MiB units, so tensors larger than a unit are
    copied from the GPU a unit at a time, from an offset into the tensor.
    """
    if mode == "save":
        shardsafe.save(state, path)
        return
    budget = 2 * MiB if mode == "async budget" else None
    with shardsafe.Checkpointer(unit_size=MiB, max_staging_bytes=budget) as ckpt:
        staging = "background" if mode == "async background" else "blocking"
        h = ckpt.async_save(state, path, staging=staging)
        h.result()


def _on_device(name: str, device: torch.device, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    dt = torch_dtype(name)
    if dt is None:
        pytest.skip(f"torch {torch.__version__} has no dtype {name}")
    cpu = random_tensor(dt, shape, seed=len(name))
    try:
        return cpu, cpu.to(device)
    except (RuntimeError, NotImplementedError, TypeError) as e:
        pytest.skip(f"torch {torch.__version__} cannot place {name} on CUDA: {e}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_every_dtype_round_trips_from_and_onto_the_gpu(tmp_path, device, name, mode) -> None:
    small_cpu, small = _on_device(name, device, (3, 257))
    # 1.5 MiB + a few bytes: more than one staging unit, not a whole number of them
    big_cpu, big = _on_device(name, device, (3 * MiB // 2 + 77,))
    scalar_cpu, scalar = _on_device(name, device, ())
    state = {"small": small, "big": big, "scalar": scalar, "empty": small[:0], "step": 7}
    path = str(tmp_path / "ckpt")
    save(mode, state, path)

    got = shardsafe.load(path)  # new tensors, on the CPU
    for key, want in (("small", small_cpu), ("big", big_cpu), ("scalar", scalar_cpu), ("empty", small_cpu[:0])):
        assert got[key].device.type == "cpu", key
        assert_bytes_equal(got[key], want, key)
    assert got["step"] == 7

    target = {k: (blank_like(v) if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    ptrs = {k: v.data_ptr() for k, v in target.items() if isinstance(v, torch.Tensor)}
    shardsafe.load(path, target)  # in place, onto the GPU
    for key, ptr in ptrs.items():
        assert target[key].device == device and target[key].data_ptr() == ptr, key
        assert_bytes_equal(target[key], state[key], key)


def _complex(device: torch.device, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.complex64)


def views(device: torch.device) -> dict[str, torch.Tensor]:
    """Tensors that are not plain contiguous memory of their own, on ``device``."""
    g = torch.Generator(device=device).manual_seed(3)
    base = torch.randn(1024, 768, generator=g, device=device)
    c = _complex(device, (300, 200), 4)
    return {
        "transposed": base.t(),
        "strided": base[::3, 5::7],
        "offset": base.view(-1)[12345 : 12345 + 50_000],  # a slice deep inside its storage
        "expanded": base[0].expand(64, -1),  # stride 0
        "channels_last": torch.randn(4, 8, 16, 16, generator=g, device=device).to(
            memory_format=torch.channels_last),
        "conj": c.conj(),
        "conj_transposed": c.t().conj(),
        "neg": c.conj().imag,  # a view with the negative bit set
        "bf16_t": base.to(torch.bfloat16).t(),
        "fp8_strided": base.to(torch.float8_e4m3fn)[:, ::2],
    }


@pytest.mark.parametrize("mode", MODES)
def test_views_are_saved_as_their_logical_values(tmp_path, device, mode) -> None:
    state = views(device)
    assert state["conj"].is_conj() and state["neg"].is_neg() and not state["transposed"].is_contiguous()
    want = {k: host_bytes(v) for k, v in state.items()}
    path = str(tmp_path / "ckpt")
    save(mode, state, path)
    got = shardsafe.load(path)
    for k, v in state.items():
        assert got[k].dtype == v.dtype and tuple(got[k].shape) == tuple(v.shape), k
        assert torch.equal(host_bytes(got[k]), want[k]), k
    # the views themselves are untouched (no bit resolved in place, no copy written back)
    assert state["conj"].is_conj() and state["neg"].is_neg()
    assert torch.equal(host_bytes(state["conj"]), want["conj"])


def test_load_in_place_into_gpu_views(tmp_path, device) -> None:
    """A non-contiguous GPU target (a transposed parameter) is filled through its strides."""
    g = torch.Generator(device=device).manual_seed(5)
    src = {"w": torch.randn(96, 64, generator=g, device=device)}
    path = str(tmp_path / "ckpt")
    shardsafe.save(src, path)
    storage = torch.zeros(64, 96, device=device)
    target = {"w": storage.t()}
    shardsafe.load(path, target)
    assert torch.equal(target["w"], src["w"]) and torch.equal(storage, src["w"].t())
