"""The package as users install it: the sdist carries the planes kernel's C source, the
wheel built from that sdist carries the compiled kernel (wherever a C compiler exists),
and installed into a fresh virtual environment it runs the codec tests and saves with
``compression="auto"`` through the compiled path, byte for byte what the numpy path writes,
and ``shardsafe --version`` names the installed kernel's file. Built where no C compiler
works, the wheel has no kernel, installs all the same, and saves through the numpy path.

The build uses this environment's build backend (``[build-system]`` of pyproject.toml,
installed with the ``dev`` extra) without build isolation, so nothing is downloaded. The
fresh environment gets shardsafe from the wheel only; the test's own dependencies (numpy,
torch, pytest, ...) come from this environment through a path entry that comes after its
own site-packages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import c_compiler

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "setup.py", "README.md")
KERNEL_SOURCE = "src/shardsafe/format/_planes.c"

pytestmark = pytest.mark.slow

SAVE_BOTH_WAYS = """
import contextlib, filecmp, io, json, os, sys
import numpy as np
import shardsafe
from shardsafe.cli import main
from shardsafe.format import planes_kernel

version = io.StringIO()
with contextlib.redirect_stdout(version), contextlib.suppress(SystemExit):
    main(["--version"])

rng = np.random.default_rng(0)
state = {"w": rng.normal(0, 0.02, 1 << 17).astype(np.float32),
         "m": rng.normal(0, 0.02, 1 << 17).astype(np.float16), "step": 3}
compiled, numpy_ = sys.argv[1], sys.argv[2]
shardsafe.save(state, compiled, compression="auto")
kernel = planes_kernel.loaded()
planes_kernel._kernel = None  # what an install without the kernel runs
shardsafe.save(state, numpy_, compression="auto")
names = sorted(n for n in os.listdir(compiled) if n != "index.json")
assert names == sorted(n for n in os.listdir(numpy_) if n != "index.json"), names
_, differ, errors = filecmp.cmpfiles(compiled, numpy_, names, shallow=False)
back = shardsafe.load(compiled)
assert all(np.array_equal(back[k], state[k]) for k in ("w", "m")) and back["step"] == 3
print(json.dumps({"kernel": kernel is not None, "files": names, "differ": differ + errors,
                  "module": shardsafe.__file__, "version": version.getvalue()}))
"""


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _sdist(tmp: Path) -> Path:
    """The sdist of a copy of the project's sources (no build outputs), unpacked."""
    tree = tmp / "tree"
    tree.mkdir()
    for name in SOURCES:
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "*.so.tmp"))
    made = _run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                 "print(b.build_sdist(sys.argv[1]))", str(tmp / "sdist")], tree).split()[-1]
    with tarfile.open(tmp / "sdist" / made) as tar:
        names = tar.getnames()
        top = names[0].split("/")[0]
        assert f"{top}/{KERNEL_SOURCE}" in names, "the sdist lacks the kernel's C source"
        assert f"{top}/setup.py" in names, "the sdist lacks setup.py (which builds the kernel)"
        tar.extractall(tmp / "unpacked", filter="data")
    return tmp / "unpacked" / top


def _fresh_venv(tmp: Path, wheel: Path) -> tuple[Path, dict[str, str]]:
    """A new virtual environment with ``wheel`` installed, its python and environment."""
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
          "--no-index", str(wheel)], tmp)
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).strip()
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return py, env


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's sdist, unpacked (each test builds from its own copy of it)."""
    return _sdist(tmp_path_factory.mktemp("sdist"))


def _wheel(sdist: Path, tmp: Path, env: dict[str, str] | None = None) -> tuple[Path, list[str]]:
    """``pip wheel`` of a fresh copy of the unpacked sdist: the wheel and its member names."""
    project = shutil.copytree(sdist, tmp / "project")  # no build/ left by another build
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "-w", str(tmp / "wheels"), str(project)], tmp, env)
    (wheel,) = (tmp / "wheels").glob("shardsafe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".c")], "the wheel carries C source"
    return wheel, names


def _kernels(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith("shardsafe/format/_planes") and n.endswith(".so")]


def _save_both_ways(tmp: Path, wheel: Path) -> tuple[dict, Path, dict[str, str]]:
    """Installs ``wheel`` into a fresh venv and runs SAVE_BOTH_WAYS there: its report, and
    the venv's python and environment."""
    py, env = _fresh_venv(tmp, wheel)
    out = json.loads(_run([str(py), "-c", SAVE_BOTH_WAYS, str(tmp / "c"), str(tmp / "n")],
                          tmp, env).splitlines()[-1])
    assert Path(out["module"]).resolve().is_relative_to((tmp / "venv").resolve()), out["module"]
    assert out["files"] and not out["differ"], out
    return out, py, env


def test_the_wheel_carries_the_kernel_and_installs_into_a_fresh_venv(sdist: Path, tmp_path: Path) -> None:
    wheel, names = _wheel(sdist, tmp_path)
    built = _kernels(names)
    compiler = c_compiler()
    if compiler is not None:
        assert built, f"{wheel.name} lacks the compiled planes kernel although {compiler} exists"

    out, py, env = _save_both_ways(tmp_path, wheel)
    assert out["kernel"] == bool(built), out
    # shardsafe --version names the transform, and the installed kernel's file
    assert ("compiled kernel" if built else "numpy") in out["version"], out["version"]
    if built:
        where = out["version"].split("compiled kernel ", 1)[1].rstrip().rstrip(")")
        assert Path(where).resolve().is_relative_to((tmp_path / "venv").resolve()), out["version"]

    # the codec tests, with the compiled kernel, against the installed package
    tests = ["tests/format/test_planes_kernel.py", "tests/format/test_codec.py"]
    _run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "kernel", *tests], ROOT, env)


def test_without_a_c_compiler_the_package_installs_and_runs_numpy(sdist: Path, tmp_path: Path) -> None:
    # a compiler that fails every compile: the optional extension is left out, with a warning
    env = {k: v for k, v in os.environ.items() if k != "LDSHARED"} | {"CC": "false"}
    wheel, names = _wheel(sdist, tmp_path, env)
    assert not _kernels(names), names
    out, _, _ = _save_both_ways(tmp_path, wheel)
    assert out["kernel"] is False and "numpy (the compiled kernel is not built)" in out["version"], out
