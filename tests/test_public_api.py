"""The public surface: the export list is what DESIGN.md documents; torch is optional."""

from __future__ import annotations

import __future__
import importlib
import inspect
import subprocess
import textwrap
import types

import shardsafe

# DESIGN.md "Public API contract" + what issue 2 adds (LoadResult, the timeout error, __version__).
FOUNDATION = {
    "__version__", "save", "load", "LoadResult", "RNGState", "CheckpointError",
    "CorruptCheckpointError", "CheckpointNotFoundError", "StateMismatchError", "CheckpointTimeoutError",
}
# Documented names that later issues add (async save: issue 3; manager: issue 4; distributed
# model/optimizer state and per-rank state: issue 5; delete: issue 15). Each may be absent on a branch that predates it, but
# nothing outside these two sets may be exported.
LATER = {"async_save", "SaveHandle", "Checkpointer", "CheckpointManager", "ManagerOptions",
         "ModelOptimizerState", "PerRank", "delete"}


def test_all_is_exactly_the_documented_names() -> None:
    exported = set(shardsafe.__all__)
    assert len(shardsafe.__all__) == len(exported), "duplicates in __all__"
    assert exported == FOUNDATION | {n for n in LATER if n in exported}
    assert FOUNDATION <= exported


def test_each_name_is_importable_and_documented() -> None:
    for name in shardsafe.__all__:
        obj = getattr(importlib.import_module("shardsafe"), name)
        exec(f"from shardsafe import {name}", {})  # noqa: S102 - the import statement itself
        if name != "__version__":
            assert inspect.getdoc(obj), f"{name} has no docstring"


def test_nothing_public_is_left_out_of_all() -> None:
    public = {n for n, v in vars(shardsafe).items()
              if not n.startswith("_") and not isinstance(v, (types.ModuleType, __future__._Feature))}
    assert public <= set(shardsafe.__all__), public - set(shardsafe.__all__)


def test_version_matches_package_metadata() -> None:
    assert isinstance(shardsafe.__version__, str) and shardsafe.__version__.count(".") >= 2


def test_errors_are_exceptions_with_the_documented_bases() -> None:
    assert issubclass(shardsafe.CheckpointNotFoundError, FileNotFoundError)
    assert issubclass(shardsafe.CheckpointTimeoutError, TimeoutError)
    assert issubclass(shardsafe.CheckpointError, Exception)


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
        from shardsafe import tensors
        assert not tensors.HAVE_TORCH
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
