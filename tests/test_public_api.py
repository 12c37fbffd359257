"""The public surface: every exported name exists, is documented and is exactly what the
module exposes; the DESIGN.md contract's calls have their shape; the version is the
package's; torch is optional. (The top-level names themselves are pinned in
tests/api/test_public_names.py.)"""

from __future__ import annotations

import __future__
import importlib
import importlib.metadata
import inspect
import os
import pkgutil
import re
import subprocess
import textwrap
import tomllib
import types
from typing import Any

import pytest

import shardsafe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ERRORS = ("CorruptCheckpointError", "CheckpointNotFoundError", "StateMismatchError", "CheckpointTimeoutError")
IMMUTABLE = (str, int, float, bool, tuple, frozenset, type(None))


def _subpackages_with_exports() -> list[types.ModuleType]:
    """``shardsafe`` and each of its subpackages that declares an export list."""
    found = [shardsafe]
    for info in pkgutil.iter_modules(shardsafe.__path__, "shardsafe."):
        if info.ispkg:
            mod = importlib.import_module(info.name)
            if hasattr(mod, "__all__"):
                found.append(mod)
    return found


PACKAGES = _subpackages_with_exports()


def _defined_elsewhere(value: Any) -> bool:
    """A class, function or typing helper imported from outside shardsafe (``Any``, ``Sequence``)."""
    if not (inspect.isclass(value) or inspect.isroutine(value) or type(value).__module__ == "typing"):
        return False
    return str(getattr(value, "__module__", "")).split(".")[0] != "shardsafe"


def _public_bindings(mod: types.ModuleType) -> set[str]:
    """Names a reader of ``mod`` would take as its public surface."""
    return {n for n, v in vars(mod).items()
            if not n.startswith("_") and not isinstance(v, (types.ModuleType, __future__._Feature))
            and not _defined_elsewhere(v)}


def _own_doc(value: Any) -> str:
    # inspect.getdoc would inherit a base class's docstring; the export must carry its own
    doc = vars(value).get("__doc__") if inspect.isclass(value) else getattr(value, "__doc__", None)
    return (doc or "").strip()


def test_found_the_top_level_and_the_packages_with_export_lists() -> None:
    names = {m.__name__ for m in PACKAGES}
    assert "shardsafe" in names and "shardsafe.manager" in names and "shardsafe.storage" in names


@pytest.mark.parametrize("mod", PACKAGES, ids=lambda m: m.__name__)
def test_export_list_is_exactly_the_public_surface(mod: types.ModuleType) -> None:
    exported = list(mod.__all__)
    assert exported and all(isinstance(n, str) for n in exported)
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    missing = [n for n in exported if not hasattr(mod, n)]  # lazy names resolve through __getattr__
    assert not missing, f"{mod.__name__}.__all__ names what it does not have: {missing}"
    unlisted = _public_bindings(mod) - set(exported)
    assert not unlisted, f"{mod.__name__} exposes names missing from __all__: {sorted(unlisted)}"
    star: dict[str, Any] = {}
    exec(f"from {mod.__name__} import *", star)  # noqa: S102 - the import statement itself
    assert set(star) - {"__builtins__"} == set(exported)


@pytest.mark.parametrize("mod", PACKAGES, ids=lambda m: m.__name__)
def test_each_export_is_documented(mod: types.ModuleType) -> None:
    assert _own_doc(mod), f"{mod.__name__} has no module docstring"
    for name in mod.__all__:
        value = getattr(mod, name)
        if inspect.isclass(value) or callable(value) or isinstance(value, types.ModuleType):
            assert _own_doc(value), f"{mod.__name__}.{name} has no docstring of its own"
        else:  # a constant: it cannot carry a docstring, it must at least be immutable
            assert isinstance(value, IMMUTABLE), f"{mod.__name__}.{name} is a mutable {type(value).__name__}"


def test_design_contract_calls_have_their_shape() -> None:
    """The calls of DESIGN.md's "Public API contract" (their names are pinned in
    tests/api/test_public_names.py)."""
    for name in ("save", "load", "async_save"):
        assert inspect.isfunction(getattr(shardsafe, name)), name
    assert {"state", "strict"} <= set(inspect.signature(shardsafe.load).parameters)
    for verb in ("wait_staged", "result", "done"):
        assert callable(getattr(shardsafe.SaveHandle, verb, None)), f"SaveHandle.{verb}"
    for verb in ("should_save", "save", "restore", "wait_until_finished", "all_steps", "latest_step"):
        assert callable(getattr(shardsafe.CheckpointManager, verb, None)), f"CheckpointManager.{verb}"


def test_version_matches_package_metadata() -> None:
    """``__version__`` is the installed distribution's version and pyproject.toml's."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    installed = importlib.metadata.version("shardsafe")
    assert shardsafe.__version__ == installed, (shardsafe.__version__, installed)
    assert shardsafe.__version__ == declared, (shardsafe.__version__, declared)
    assert re.fullmatch(r"\d+\.\d+\.\d+([.+-]?[0-9A-Za-z.]+)?", shardsafe.__version__)


def test_errors_are_exceptions_with_the_documented_bases() -> None:
    for name in ERRORS:
        assert issubclass(getattr(shardsafe, name), shardsafe.CheckpointError), name
    assert issubclass(shardsafe.CheckpointNotFoundError, FileNotFoundError)
    assert issubclass(shardsafe.CheckpointTimeoutError, TimeoutError)
    assert issubclass(shardsafe.CheckpointError, Exception)
    assert not issubclass(shardsafe.CorruptCheckpointError, (FileNotFoundError, TimeoutError))


def _run(python: str, env: dict, code: str) -> str:
    out = subprocess.run([python, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_numpy_only_install(tmp_path, python, subprocess_env) -> None:
    """``import shardsafe`` and numpy save/load work where torch cannot be imported."""
    ckpt = str(tmp_path / "np")
    out = _run(python, subprocess_env, f"""
        import sys
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
        import numpy as np
        import shardsafe
        from shardsafe.values import torch as torch_values
        assert not torch_values.HAVE_TORCH
        state = {{"a": np.arange(12, dtype=np.float32).reshape(3, 4).T, "b": {{"c": np.zeros(0, np.int8)}},
                 "n": np.int64(5), "x": [1, (2.5, None)], "rng": shardsafe.RNGState()}}
        shardsafe.save(state, {ckpt!r})
        got = shardsafe.load({ckpt!r})
        assert type(got["a"]) is np.ndarray and (got["a"] == state["a"]).all()
        assert got["b"]["c"].dtype == np.int8 and got["n"] == 5 and got["x"] == [1, (2.5, None)]
        assert got["rng"]["torch"] is None and got["rng"]["cuda"] == []
        target = {{"a": np.zeros((4, 3), np.float32), "b": {{"c": np.zeros(0, np.int8)}}, "n": 0, "x": [],
                  "rng": shardsafe.RNGState()}}
        a = target["a"]
        shardsafe.load({ckpt!r}, target)
        assert target["a"] is a and (a == state["a"]).all()
        assert not [m for m in sys.modules if m.startswith("torch") and sys.modules[m] is not None]
        print("ok")
    """)
    assert out.strip() == "ok"


def test_numpy_only_reader_of_a_torch_checkpoint(tmp_path, python, subprocess_env) -> None:
    import torch

    ckpt = str(tmp_path / "pt")
    shardsafe.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "h": torch.ones(2, dtype=torch.bfloat16)},
                   ckpt)
    out = _run(python, subprocess_env, f"""
        import sys
        sys.modules["torch"] = None
        import numpy as np, shardsafe
        try:
            shardsafe.load({ckpt!r})
        except TypeError as e:
            assert "bfloat16" in str(e), e
        else:
            raise AssertionError("bfloat16 cannot be a numpy array")
        w = np.zeros((2, 3), np.float32)
        shardsafe.load({ckpt!r}, {{"w": w, "h": np.zeros(2, np.float16)}}, strict=False)
        assert (w == np.arange(6).reshape(2, 3)).all()
        print("ok")
    """)
    assert out.strip() == "ok"


def test_software_checksum_fallback(tmp_path, python, subprocess_env) -> None:
    """Without the crc32c package, checksums are computed (slowly) in Python, same values."""
    import torch

    ckpt = str(tmp_path / "c")
    shardsafe.save({"w": torch.arange(100.0)}, ckpt)
    out = _run(python, subprocess_env, f"""
        import sys
        sys.modules["crc32c"] = None
        import shardsafe, torch
        from shardsafe.format import checksum
        assert not checksum.HARDWARE
        got = shardsafe.load({ckpt!r})
        assert torch.equal(got["w"], torch.arange(100.0))
        shardsafe.save(got, {ckpt + "2"!r})
        print("ok")
    """)
    assert out.strip() == "ok"
    a, b = (open(f"{p}/index.json", "rb").read() for p in (ckpt, ckpt + "2"))
    assert a.split(b'"crc32c":[')[1][:12] == b.split(b'"crc32c":[')[1][:12]  # same chunk checksum
