"""``shardsafe export``: .safetensors with dotted keys, .pt loadable weights-only, --only, --dtype."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402

import shardsafe  # noqa: E402
from cli_helpers import manager_state, one_line_error, save_step  # noqa: E402


def test_export_safetensors_with_dotted_keys_and_metadata(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 3)
    out = tmp_path / "all.safetensors"
    proc = cli("export", path, out)
    assert proc.returncode == 0, proc.stderr
    want = manager_state(3)
    got = safetensors_torch.load_file(str(out))
    assert sorted(got) == ["model.layer.bias", "model.layer.weight", "table"]
    assert torch.equal(got["model.layer.weight"], want["model"]["layer.weight"])
    assert got["model.layer.bias"].dtype == torch.bfloat16
    assert torch.equal(got["table"], torch.from_numpy(want["table"]))
    with safe_open(str(out), framework="pt") as f:
        meta = f.metadata()
    assert json.loads(meta["optim.step"]) == 3 and json.loads(meta["optim.betas.1"]) == 0.999
    assert meta["format"] == "pt"
    # bytes and empty containers have no safetensors form: skipped, and said so
    assert "optim.blob (bytes)" in proc.stderr and "optim.empty (dict)" in proc.stderr
    assert "optim.blob" not in meta


def test_export_only_a_subtree_cast_to_bf16(cli, tmp_path) -> None:  # noqa: ANN001
    state = {"model": {"w": torch.randn(5, 3, dtype=torch.float64), "n": torch.arange(4)},
             "other": torch.ones(2)}
    shardsafe.save(state, str(tmp_path / "ck"))
    out = tmp_path / "model.safetensors"
    proc = cli("export", tmp_path / "ck", out, "--only", "model", "--dtype", "bf16")
    assert proc.returncode == 0, proc.stderr
    got = safetensors_torch.load_file(str(out))
    assert sorted(got) == ["n", "w"]  # the --only prefix is dropped
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], state["model"]["w"].to(torch.bfloat16))
    assert got["n"].dtype == torch.int64 and torch.equal(got["n"], state["model"]["n"])  # ints untouched
    model = torch.nn.Linear(3, 5, bias=False)  # the file loads straight into a module
    model.load_state_dict({"weight": got["w"].float()})


def test_export_pt_loads_weights_only_with_nesting(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 2)
    out = tmp_path / "all.pt"
    proc = cli("export", path, out)
    assert proc.returncode == 0, proc.stderr
    got = torch.load(str(out), weights_only=True)
    want = manager_state(2)
    assert torch.equal(got["model"]["layer.weight"], want["model"]["layer.weight"])
    assert got["optim"] == {"step": 2, "betas": (0.9, 0.999), "blob": b"\x00\x01", "empty": {}}
    assert isinstance(got["table"], torch.Tensor)  # numpy arrays become tensors for weights_only
    assert np.array_equal(got["table"].numpy(), want["table"])
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_export_errors_are_one_line(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 1)
    proc = cli("export", path, tmp_path / "x.safetensors", "--only", "nope")
    assert proc.returncode == 1 and "no key path 'nope'" in one_line_error(proc)
    proc = cli("export", path, tmp_path / "x.weird")
    assert proc.returncode == 2 and "--format" in one_line_error(proc)
    assert not os.path.exists(tmp_path / "x.safetensors")


def test_export_of_a_tensor_larger_than_memory_is_a_clean_error(tmp_path, subprocess_env) -> None:  # noqa: ANN001
    from test_cli_diff import huge_tensor_checkpoint, run_limited

    huge_tensor_checkpoint(str(tmp_path / "a"))  # .pt reads through the same read_tensor
    proc = run_limited(["export", tmp_path / "a", tmp_path / "x.safetensors"], subprocess_env)
    assert "cannot allocate memory" in one_line_error(proc)
    assert not (tmp_path / "x.safetensors").exists()


def test_export_with_dtype_keeps_packed_float4(cli, tmp_path) -> None:  # noqa: ANN001
    fp4 = torch.tensor([0x21, 0x7F], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    shardsafe.save({"w": fp4, "b": torch.ones(2)}, str(tmp_path / "a"))
    proc = cli("export", tmp_path / "a", tmp_path / "x.pt", "--dtype", "bf16")
    assert proc.returncode == 0, proc.stderr
    assert "kept 1 packed tensor(s)" in proc.stderr and "Traceback" not in proc.stderr
    got = torch.load(tmp_path / "x.pt", weights_only=True)
    assert got["b"].dtype == torch.bfloat16 and got["w"].dtype == torch.float4_e2m1fn_x2
    assert torch.equal(got["w"].view(torch.uint8), fp4.view(torch.uint8))
    proc = cli("export", tmp_path / "a", tmp_path / "x.safetensors", "--dtype", "bf16")
    assert "safetensors has no dtype for float4_e2m1fn_x2" in proc.stderr and "Traceback" not in proc.stderr


def test_export_of_empty_tensors_and_arrays(cli, tmp_path) -> None:  # noqa: ANN001
    state = {"a": np.zeros((0,), np.float32), "t": torch.zeros(0, 3), "w": torch.arange(4.0)}
    shardsafe.save(state, str(tmp_path / "ck"))
    for name in ("out.safetensors", "out.pt"):
        proc = cli("export", tmp_path / "ck", tmp_path / name)
        assert proc.returncode == 0, proc.stderr
    got = safetensors_torch.load_file(str(tmp_path / "out.safetensors"))
    assert got["a"].shape == (0,) and got["t"].shape == (0, 3) and torch.equal(got["w"], state["w"])
    pt = torch.load(tmp_path / "out.pt", weights_only=True)
    assert pt["t"].shape == (0, 3) and torch.equal(pt["w"], state["w"])



def test_export_refuses_an_existing_file_without_overwrite(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 1)
    out = tmp_path / "w.safetensors"
    out.write_bytes(b"precious")
    proc = cli("export", path, out)
    assert proc.returncode == 1
    assert f"{str(out)!r} already exists; pass --overwrite to replace it" in one_line_error(proc)
    assert out.read_bytes() == b"precious"
    proc = cli("export", path, out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() != b"precious" and out.stat().st_size > 100
    proc = cli("export", path, tmp_path, "--format", "pt", "--overwrite")
    assert proc.returncode == 1 and "is a directory" in one_line_error(proc)
