"""``shardsafe diff``: added/removed/changed keys and the max abs difference per tensor."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from shardsafe.cli.diff import max_abs_diff  # noqa: E402
from cli_helpers import rng_heavy_state  # noqa: E402


def test_diff_of_identical_checkpoints_exits_0(cli, tmp_path) -> None:  # noqa: ANN001
    state = {"w": torch.randn(3), "n": float("nan"), "x": torch.tensor([float("nan"), 1.0])}
    shardsafe.save(state, str(tmp_path / "a"))
    shardsafe.save(state, str(tmp_path / "b"))
    proc = cli("diff", tmp_path / "a", tmp_path / "b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "0 difference(s), 3 identical key(s)"


def test_diff_lists_added_removed_and_changed(cli, tmp_path) -> None:  # noqa: ANN001
    w = torch.zeros(4, 4)
    a = {"model": {"w": w, "gone": torch.ones(2), "cast": torch.ones(3)}, "step": 1, "same": torch.ones(2)}
    w2 = w.clone()
    w2[1, 2] = -0.25
    w2[3, 3] = 0.125
    b = {"model": {"w": w2, "new": torch.ones(5, dtype=torch.int8), "cast": torch.ones(3, dtype=torch.float16)},
         "step": 1.0, "same": torch.ones(2)}
    shardsafe.save(a, str(tmp_path / "a"))
    shardsafe.save(b, str(tmp_path / "b"))
    proc = cli("diff", tmp_path / "a", tmp_path / "b", "--all")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert "~ model.w  float32[4, 4]  max abs diff 0.25" in lines
    assert "- model.gone  float32[2]" in lines
    assert "+ model.new  int8[5]" in lines
    assert "~ model.cast  float32[3] -> float16[3]" in lines
    assert "~ step  int 1 -> float 1.0" in lines  # types matter: 1 and 1.0 differ
    assert lines[-1] == "5 difference(s), 1 identical key(s)"
    d = json.loads(cli("diff", tmp_path / "a", tmp_path / "b", "--json").stdout)
    by_key = {c["key"]: c for c in d["changes"]}
    assert by_key["model.w"]["max_abs_diff"] == 0.25 and by_key["model.new"]["op"] == "+"
    assert d["identical"] == 1


@pytest.mark.parametrize("a, b, want", [
    ([1.0, 2.0], [1.0, 2.5], 0.5),
    ([float("nan"), 1.0], [float("nan"), 1.0], 0.0),
    ([float("nan"), 1.0], [0.0, 1.0], math.inf),
    ([float("inf")], [float("inf")], 0.0),
    ([float("inf")], [float("-inf")], math.inf),
    ([], [], 0.0),
])
def test_max_abs_diff_table(a, b, want) -> None:  # noqa: ANN001
    assert max_abs_diff(torch.tensor(a), torch.tensor(b)) == want
    assert max_abs_diff(np.array(a), np.array(b)) == want


def test_max_abs_diff_of_bf16_ints_and_complex() -> None:
    assert max_abs_diff(torch.tensor([1.0, 2.0], dtype=torch.bfloat16),
                        torch.tensor([1.0, 3.0], dtype=torch.bfloat16)) == 1.0
    assert max_abs_diff(torch.tensor([5, -3]), torch.tensor([5, 4])) == 7.0
    assert max_abs_diff(torch.tensor([1 + 1j]), torch.tensor([1 + 4j])) == 3.0


def _fp4(codes: list[int]) -> "torch.Tensor":
    return torch.tensor(codes, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)


def test_diff_of_packed_float4_tensors(cli, tmp_path) -> None:  # noqa: ANN001
    # byte 0x21: low code 1 (0.5), high code 2 (1.0); 0x71: 0.5 and 6.0; 0xa1: 0.5 and -1.0
    shardsafe.save({"w": _fp4([0x21, 0x00])}, str(tmp_path / "a"))
    shardsafe.save({"w": _fp4([0x71, 0x00])}, str(tmp_path / "b"))
    shardsafe.save({"w": _fp4([0xA1, 0x00])}, str(tmp_path / "c"))
    proc = cli("diff", tmp_path / "a", tmp_path / "b")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "~ w  float4_e2m1fn_x2[2]  max abs diff 5" in proc.stdout.splitlines()
    proc = cli("diff", tmp_path / "a", tmp_path / "c", "--json")
    assert json.loads(proc.stdout)["changes"][0]["max_abs_diff"] == 2.0  # 1.0 against -1.0
    assert cli("diff", tmp_path / "a", tmp_path / "a").returncode == 0


def huge_tensor_checkpoint(path: str, nbytes: int = 16 << 30) -> None:
    """A checkpoint whose one tensor has ``nbytes`` bytes, over a sparse data file: its
    index is valid, its data all holes (and its checksums wrong, which no read gets to)."""
    import dataclasses
    import os

    from shardsafe.format import INDEX_NAME
    from shardsafe.format.index.objects import TensorEntry
    from shardsafe.format.index.rows import ChunkEntry
    from shardsafe.format.index.versions import decode_index, encode_index

    shardsafe.save({"w": torch.zeros(4, dtype=torch.uint8)}, path)
    with open(os.path.join(path, INDEX_NAME), "rb") as f:
        index = decode_index(f.read())
    f0 = index.files[0]
    blocks = -(-nbytes // index.block_size)
    chunk = ChunkEntry(f0.name, f0.data_start, nbytes, (0,), (nbytes,), (0,) * blocks)
    index = dataclasses.replace(index, files=(dataclasses.replace(f0, size=f0.data_start + nbytes),),
                                tensors=(TensorEntry(("w",), "torch", "uint8", (nbytes,), (chunk,)),))
    os.truncate(os.path.join(path, f0.name), f0.data_start + nbytes)
    with open(os.path.join(path, INDEX_NAME), "wb") as f:
        f.write(encode_index(index, version=2))


def run_limited(args: list, env: dict, limit: int = 6 << 30):  # noqa: ANN201
    """``python -m shardsafe ARGS`` with its address space limited to ``limit`` bytes."""
    import resource
    import subprocess
    import sys

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "shardsafe", *map(str, args)], env=env, preexec_fn=cap,
                          capture_output=True, text=True, timeout=120)


def test_diff_of_a_tensor_larger_than_memory_is_a_clean_error(tmp_path, subprocess_env) -> None:  # noqa: ANN001
    from cli_helpers import one_line_error

    huge_tensor_checkpoint(str(tmp_path / "a"))
    proc = run_limited(["diff", tmp_path / "a", tmp_path / "a"], subprocess_env)
    line = one_line_error(proc)
    assert "cannot allocate memory" in line and "w (17179869184 bytes)" in line, line


def test_diff_summarises_by_default(cli, tmp_path) -> None:  # noqa: ANN001
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    rng_heavy_state(a, 7)
    rng_heavy_state(b, 8)
    proc = cli("diff", a, b)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("~ model.*  4 changed, max abs diff ")
    assert any(x.startswith("~ rng.*  ") and " changed" in x for x in lines)
    assert "~ step  int 7 -> int 8" in lines
    assert len(lines) <= 6 and lines[-1].endswith("; --all lists every one")
    only = cli("diff", a, b, "--only", "model", "--all").stdout.splitlines()
    assert [x.split()[1] for x in only[:-1]] == ["model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias"]
    assert only[-1] == "4 difference(s), 0 identical key(s)"
