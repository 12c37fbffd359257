"""The placer conformance suite: every destination of the load pipeline passes the same tests.

As ``test_sinks.py`` does for the save's sinks, each test runs against every placer kind
(``KINDS``): an in-place load into contiguous host tensors (read into directly), into
strided host tensors and with ``cast=True`` (both staged through bounded buffers), into
new tensors, memory-mapped, into JAX arrays on 8 emulated devices, and into CUDA tensors
(page-locked staging; skipped without a GPU). Each kind is checked for exact bytes, for
partial boxes of stored tensors (a target holding part of a tensor, or a tensor stored in
several chunks), for what a failing load leaves (docs/guides/save-and-load.md: containers,
plain values and Stateful objects untouched, nothing returned) and for the staging memory:
bounded while a load runs and all freed when it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.engine.load.match import TensorTarget
from shardsafe.engine.load.placers import Placement, staged
from shardsafe.engine.load.reader import ChunkReader
from shardsafe.engine.load.run import read_placement
from shardsafe.errors import CorruptCheckpointError
from shardsafe.storage import LocalStorage

from helpers import flip_byte

# JAX reads XLA_FLAGS when it creates its CPU client (at the first array, after collection)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "big": torch.randn(600, 1000, generator=g),  # 2.4 MB: read block by block
        "small": torch.randn(7, 5, generator=g),  # coalesced with its neighbours
        "half": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        "ints": torch.arange(40, dtype=torch.int64).reshape(8, 5),
        "scalar": torch.tensor(3.5),
    }


def _strided(t: torch.Tensor) -> torch.Tensor:
    """A zero tensor of ``t``'s shape and dtype whose memory is not contiguous."""
    if t.dim() == 0:
        return torch.zeros(2, dtype=t.dtype)[1]  # a view at an offset: contiguous but a view
    return torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)[..., ::2]


@dataclass(frozen=True)
class Kind:
    """One placer: how to load a checkpoint of ``_state()`` through it."""

    name: str
    load: Callable[[str, dict[str, torch.Tensor]], dict[str, Any]]
    """Loads ``path`` (saved from the state) and returns the values placed, as torch tensors."""
    box: Callable[[torch.Tensor], torch.Tensor] | None = None
    """An empty target for a box of a tensor (in-place kinds), else None."""
    expect: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    cast: bool = False


def _in_place(make: Callable[[torch.Tensor], torch.Tensor], cast: bool = False):
    def load(path: str, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        target = {k: make(v) for k, v in state.items()}
        assert shardsafe.load(path, target, cast=cast) == shardsafe.LoadResult()
        return target
    return load


def _cast_target(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=torch.float64 if t.is_floating_point() else t.dtype)


def _cast_expect(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64) if t.is_floating_point() else t


def _new(path: str, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    return shardsafe.load(path)


def _mapped(path: str, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    return shardsafe.load(path, mmap=True)


def _jax(path: str, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    jax = pytest.importorskip("jax")
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((4, 2), ("a", "b"))
    target = {}
    with jax.enable_x64(True):  # int64 stays int64
        for k, v in state.items():
            spec = PartitionSpec("a", "b") if v.dim() == 2 and v.shape[0] % 4 == 0 and v.shape[1] % 2 == 0 \
                else PartitionSpec()
            target[k] = jax.ShapeDtypeStruct(tuple(v.shape), str(v.dtype).removeprefix("torch."),
                                             sharding=NamedSharding(mesh, spec))
        out = shardsafe.load(path, target)
        return {k: torch.from_numpy(np.ascontiguousarray(jax.device_get(v)).reshape(-1).view(np.uint8).copy())
                .view(state[k].dtype).reshape(state[k].shape) for k, v in out.items()}


def _cuda(path: str, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the CUDA placer runs on a GPU machine (scripts/gpu-check)")
    target = {k: torch.zeros_like(v, device="cuda") for k, v in state.items()}
    assert shardsafe.load(path, target) == shardsafe.LoadResult()
    return {k: v.cpu() for k, v in target.items()}


def _cuda_box(t: torch.Tensor) -> torch.Tensor:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    return torch.zeros_like(t, device="cuda")


KINDS = {
    "in_place": Kind("in_place", _in_place(torch.zeros_like), torch.zeros_like),
    "strided": Kind("strided", _in_place(_strided), _strided),
    "cast": Kind("cast", _in_place(_cast_target, cast=True), _cast_target, _cast_expect, cast=True),
    "new": Kind("new", _new),
    "mapped": Kind("mapped", _mapped),
    "jax": Kind("jax", _jax),
    "cuda": Kind("cuda", _cuda, _cuda_box),
}


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> Kind:
    return KINDS[request.param]


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    got = torch.as_tensor(got).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.contiguous().reshape(-1).view(torch.uint8), want.contiguous().reshape(-1).view(torch.uint8))


def test_bytes_exact(tmp_path, kind: Kind) -> None:
    state = _state()
    path = str(tmp_path / "ckpt")
    shardsafe.save(state, path)
    got = kind.load(path, state)
    assert sorted(got) == sorted(state)
    for k, v in state.items():
        _same(got[k], kind.expect(v))


@pytest.mark.parametrize("name", [k for k, v in KINDS.items() if v.box is not None])
def test_partial_boxes_of_one_chunk(tmp_path, name: str) -> None:
    """A target holding a box of a stored tensor gets exactly that box (the kinds that
    place whole tensors get boxes in test_boxes_of_several_chunks)."""
    kind = KINDS[name]
    state = _state()
    path = str(tmp_path / "ckpt")
    shardsafe.save(state, path)
    index = shardsafe.api.load.read_checkpoint_index(path)
    ids = {t.key[-1]: i for i, t in enumerate(index.tensors)}
    boxes = {"big": (slice(101, 457), slice(3, 999)), "half": (slice(5, 30), slice(0, 17)),
             "ints": (slice(2, 3), slice(1, 4))}
    targets, dests = [], {}
    for k, sl in boxes.items():
        want = state[k][sl]
        dests[k] = kind.box(want)
        targets.append(TensorTarget(index.tensors[ids[k]], dests[k], offsets=tuple(s.start for s in sl),
                                    cast=kind.cast and want.is_floating_point()))
    read_placement(ChunkReader(LocalStorage(), path, index), Placement(index, targets))
    for k, sl in boxes.items():
        _same(dests[k], kind.expect(state[k][sl].contiguous()))


def test_boxes_of_several_chunks(tmp_path, kind: Kind) -> None:
    """A tensor saved in 8 chunks (JAX on a 4x2 mesh) comes back whole through every placer
    that reads it (memory-mapped loads need one chunk per tensor and say so)."""
    jax = pytest.importorskip("jax")
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((4, 2), ("a", "b"))
    host = np.arange(64 * 30, dtype=np.float32).reshape(64, 30) / 7
    arr = jax.device_put(host, NamedSharding(mesh, PartitionSpec("a", "b")))
    path = str(tmp_path / "ckpt")
    shardsafe.save({"w": arr}, path)
    state = {"w": torch.from_numpy(host)}
    if kind.name == "mapped":
        with pytest.raises(CorruptCheckpointError, match="one chunk"):
            kind.load(path, state)
        return
    _same(kind.load(path, state)["w"], kind.expect(state["w"]))


def test_a_failing_load_leaves_the_target_as_documented(tmp_path, kind: Kind) -> None:
    """A corrupt block: nothing is returned, containers, plain values and Stateful objects
    stay as they were (``load_state_dict`` never runs), and no staging memory stays held."""
    state = _state()
    path = str(tmp_path / "ckpt")
    extras = {"note": "saved", "extra": {}} if kind.box is not None else {}  # for the in-place kinds
    shardsafe.save({**state, **extras}, path)
    index = shardsafe.api.load.read_checkpoint_index(path)
    big = next(t for t in index.tensors if t.key[-1] == "big").chunks[0]
    flip_byte(os.path.join(path, big.file), big.offset + big.nbytes - 10)
    calls: list[Any] = []

    class Recorder:
        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, sd: dict[str, Any]) -> None:
            calls.append(sd)

    with pytest.raises(CorruptCheckpointError, match="big"):
        if kind.box is None:
            kind.load(path, state)
        else:  # the in-place kinds: plain values and a Stateful object beside the tensors
            extra = Recorder()
            target = {**{k: kind.box(v) for k, v in state.items()}, "note": "before", "extra": extra}
            try:
                shardsafe.load(path, target, cast=kind.cast)
            finally:
                assert target["note"] == "before" and target["extra"] is extra and not calls
    assert staged.STATS.live == 0


def test_staging_is_bounded_and_freed(tmp_path, monkeypatch) -> None:
    """A staged target (strided) of 16 waves holds at most two waves' buffers at once; a
    load that fails half-way frees them."""
    monkeypatch.setattr(staged, "UNIT", 64 << 10)
    monkeypatch.setattr(staged, "WAVE", 256 << 10)
    t = torch.randn(1024, 1024)  # 4 MiB: 16 waves of 256 KiB
    path = str(tmp_path / "ckpt")
    shardsafe.save({"t": t}, path)
    target = {"t": _strided(t)}
    shardsafe.load(path, target)
    _same(target["t"], t)
    assert staged.STATS.waves == 16
    assert 0 < staged.STATS.peak <= 2 * (256 << 10) + 2 * 4096 and staged.STATS.live == 0
    chunk = shardsafe.api.load.read_checkpoint_index(path).tensors[0].chunks[0]
    flip_byte(os.path.join(path, chunk.file), chunk.offset + chunk.nbytes // 2)
    with pytest.raises(CorruptCheckpointError):
        shardsafe.load(path, {"t": _strided(t)})
    assert staged.STATS.live == 0


def test_boxes_tile_a_tensor_in_bounded_pieces() -> None:
    for shape, unit in [((10, 7), 64), ((3, 100), 40), ((5,), 8), ((), 4), ((2, 0, 3), 8), ((4, 3, 50), 100)]:
        got = np.zeros(shape, dtype=np.int32)
        for off, ext in staged.boxes(shape, 4, unit):
            assert np.prod(ext) * 4 <= max(unit, 4)
            got[tuple(slice(a, a + n) for a, n in zip(off, ext))] += 1
        assert (got == 1).all()


def test_a_torch_load_never_imports_jax_code(tmp_path) -> None:
    """The placer is chosen from the target kind once: a torch load (with or without JAX in
    the process) never imports the JAX placer, and without JAX never imports JAX."""
    code = f"""
import sys, torch, shardsafe
path = {str(tmp_path / 'ckpt')!r}
shardsafe.save({{"w": torch.ones(3)}}, path)
shardsafe.load(path, {{"w": torch.zeros(3)}}); shardsafe.load(path)
assert "jax" not in sys.modules, "jax imported"
import jax
shardsafe.load(path, {{"w": torch.zeros(3)}}); shardsafe.load(path)
assert "shardsafe.engine.load.placers.jax_arrays" not in sys.modules, "the JAX placer was imported"
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
