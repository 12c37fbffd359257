"""Pipeline-parallel states: 2 stages x 2 FSDP ranks save the union of their
different states; it loads bit-exactly on 3 ranks (and 2 as well under -m stress) without
pipeline parallelism and in this plain process (real gloo processes, see pp_worker.py)."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_script
from safetensors.torch import load_file

import shardsafe
from shardsafe.comm import free_loopback_port


def _flat(tree, prefix: str = "") -> dict:  # noqa: ANN001
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(tree, torch.Tensor):
        out[prefix[:-1]] = tree
    return out


@pytest.mark.parametrize("loads", [pytest.param((3,), id="on-3"),
                                   pytest.param((3, 2), id="on-3-and-2", marks=pytest.mark.stress)])
def test_pipeline_stages_save_their_union_and_load_anywhere(tmp_path, loads: tuple[int, ...]) -> None:  # noqa: ANN001
    spec = ",".join(f"{n}:{w}:{free_loopback_port()}" for n, w in [("save", 4), *(("load", w) for w in loads)])
    run_script("pp_worker.py", 4, spec, str(tmp_path), timeout=150)
    ref = {**load_file(str(tmp_path / "ref-0.safetensors")), **load_file(str(tmp_path / "ref-1.safetensors"))}
    assert "model.layers.0.weight" in ref and "model.layers.3.weight" in ref
    assert any(k.startswith("optim.state.layers.3") for k in ref)
    for world in loads:
        got = load_file(str(tmp_path / f"loaded-{world}.safetensors"))
        assert set(got) == set(ref), world
        for k, v in ref.items():
            assert torch.equal(got[k], v), (world, k)
    plain = shardsafe.load(str(tmp_path / "pp"))
    assert plain["step"] == 1
    flat = _flat(plain)
    assert set(flat) == set(ref)
    for k, v in ref.items():
        assert torch.equal(flat[k], v), k
