"""The commands that need no tensors start without importing torch (importing it costs
1.5-2 s of a command's start): ``--help``, ``ls``, ``info``, ``verify``, ``gc``, and
``import shardsafe`` itself. Checked in a fresh interpreter, on what it imported."""

from __future__ import annotations

import subprocess

import pytest
import torch

import shardsafe

CHILD = """
import sys
from shardsafe.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:  # --help
    code = e.code
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code)
"""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("startup")
    shardsafe.save({"w": torch.ones(3), "step": 1}, str(root / "step_00000001"))
    return str(root)


@pytest.mark.parametrize("argv", [["--help"], ["ls", "{root}"], ["info", "{root}/step_00000001"],
                                  ["verify", "{root}/step_00000001"], ["gc", "{root}", "--dry-run"]],
                         ids=["help", "ls", "info", "verify", "gc"])
def test_commands_without_tensors_do_not_import_torch(ckpt, python, subprocess_env, argv) -> None:  # noqa: ANN001
    r = subprocess.run([python, "-c", CHILD, *[a.format(root=ckpt) for a in argv]], env=subprocess_env,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().endswith("NO-TORCH 0"), (r.stdout[-2000:], r.stderr[-2000:])


def test_import_shardsafe_does_not_import_torch(python, subprocess_env) -> None:
    r = subprocess.run([python, "-c", "import sys, shardsafe; print('torch' in sys.modules)"],
                       env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr[-2000:]


def test_a_torch_tensor_is_still_a_tensor_once_torch_is_imported(python, subprocess_env) -> None:
    code = ("import shardsafe, shardsafe.values.torch as t; import torch; x = torch.ones(2);"
            "print(t.is_torch_tensor(x), t.is_plain(x), t.is_plain(torch.nn.Parameter(x)))")
    r = subprocess.run([python, "-c", code], env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "True True True", r.stderr[-2000:]
