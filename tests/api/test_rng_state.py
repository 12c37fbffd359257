"""RNGState restores Python, NumPy and torch random streams exactly (also in a new process)."""

from __future__ import annotations

import json
import random
import subprocess

import numpy as np
import pytest
import torch

import shardsafe


def _draw() -> dict:
    return {
        "py": [random.random() for _ in range(3)] + [random.gauss(0, 1) for _ in range(3)]
        + [random.getrandbits(70)],
        "np": np.random.rand(3).tolist() + np.random.standard_normal(3).tolist()
        + np.random.randint(0, 2**31, 3).tolist(),
        "torch": torch.rand(3).tolist() + torch.randn(3).tolist()
        + torch.randint(0, 2**31, (3,)).tolist() + torch.nn.functional.dropout(torch.ones(8), 0.5).tolist(),
    }


def _advance() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)              # odd number of gauss draws: a cached value is pending
    np.random.standard_normal(1)    # same for numpy's legacy generator
    torch.randn(5)


def test_streams_continue_exactly(tmp_path) -> None:
    _advance()
    path = str(tmp_path / "c")
    shardsafe.save({"rng": shardsafe.RNGState()}, path)
    expected = _draw()
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    assert _draw() != expected
    shardsafe.load(path, {"rng": shardsafe.RNGState()})
    assert _draw() == expected


def test_state_dict_contents(tmp_path) -> None:
    sd = shardsafe.RNGState().state_dict()
    assert set(sd) >= {"python", "numpy", "torch"}
    assert sd["torch"].dtype == torch.uint8 and sd["numpy"]["keys"].dtype == np.uint32
    path = str(tmp_path / "c")
    shardsafe.save({"rng": shardsafe.RNGState()}, path)
    got = shardsafe.load(path)["rng"]
    assert got["python"]["version"] == 3 and len(got["python"]["state"]) == 625
    assert got["numpy"]["name"] == "MT19937"


def test_restored_in_a_new_process(tmp_path, subprocess_env, python) -> None:
    _advance()
    path = str(tmp_path / "c")
    shardsafe.save({"rng": shardsafe.RNGState()}, path)
    expected = _draw()
    script = (
        "import json, random, sys\n"
        "import numpy as np, torch, shardsafe\n"
        f"shardsafe.load({path!r}, {{'rng': shardsafe.RNGState()}})\n"
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('t', {__file__!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "print(json.dumps(mod._draw()))\n"
    )
    out = subprocess.run([python, "-c", script], env=subprocess_env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout) == json.loads(json.dumps(expected))


def test_keys_do_not_depend_on_the_machine() -> None:
    # a checkpoint from a CPU machine must load strictly on a GPU machine and vice versa:
    # the key set is fixed, absent generators are empty/None rather than missing keys
    sd = shardsafe.RNGState().state_dict()
    assert set(sd) == {"python", "numpy", "torch", "cuda"}
    if not torch.cuda.is_available():
        assert sd["cuda"] == []


def test_checkpoint_from_a_gpu_machine_loads_on_a_cpu_machine(tmp_path) -> None:
    sd = shardsafe.RNGState().state_dict()
    sd["cuda"] = [torch.zeros(16, dtype=torch.uint8), torch.zeros(16, dtype=torch.uint8)]
    path = str(tmp_path / "c")
    shardsafe.save({"rng": sd}, path)
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    assert shardsafe.load(path, {"rng": shardsafe.RNGState()}) == shardsafe.LoadResult()


def test_checkpoint_without_torch_generator_loads_strictly(tmp_path) -> None:
    sd = shardsafe.RNGState().state_dict()
    sd["torch"] = None  # as written by a numpy-only install
    path = str(tmp_path / "c")
    shardsafe.save({"rng": sd}, path)
    before = torch.get_rng_state()
    assert shardsafe.load(path, {"rng": shardsafe.RNGState()}) == shardsafe.LoadResult()
    assert torch.equal(torch.get_rng_state(), before)
