"""Mechanisms every test directory shares: damaging a file on purpose, comparing states
bit for bit, SIGKILLing a child process over and over, running the ``shardsafe``
command, and asking for the compiled planes kernel.

(Starting the ranks of a multi-process job is in dist_harness.py; the S3 server in
s3_server.py.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


# ----------------------------------------------------------------------------- damage
def flip_byte(path: str | os.PathLike, offset: int, mask: int = 0xFF) -> None:
    """XORs the byte at ``offset`` of file ``path`` with ``mask`` (a negative offset counts
    from the end): damage a checksum must catch. Flipping twice restores the file."""
    with open(path, "r+b") as f:
        pos = offset if offset >= 0 else f.seek(0, os.SEEK_END) + offset
        f.seek(pos)
        b = f.read(1)
        assert len(b) == 1, f"{path} has no byte at {pos}"
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))


# ----------------------------------------------------------------------------- incremental steps
def incremental_steps(root: Any, state: dict | None = None) -> dict:
    """Saves ``state`` (default: a random ``base`` of 128 x 32 and a ``head`` of 4) as steps
    1-3 under ``root`` (``step_<N>``), incrementally: steps 2 and 3 change only
    ``state["head"]`` (filled with the step) and reference the rest in step 1's data file.
    Returns ``state`` as step 3 holds it."""
    from shardsafe.api.checkpointer import Checkpointer
    from shardsafe.engine.save.request import SaveRequest
    from shardsafe.engine.save.incremental import Baseline

    if state is None:
        state = {"base": torch.randn(128, 32), "head": torch.zeros(4)}
    b, c = Baseline(), Checkpointer()
    for s in (1, 2, 3):
        state["head"].fill_(s)
        c._saver.submit(SaveRequest(state=state, path=str(root / f"step_{s:08d}"), baseline=b))
    c.close()
    return state


# ----------------------------------------------------------------------------- comparison
def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The logical values of ``t`` as row-major bytes (conj/neg bits resolved)."""
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8)


def assert_same(got: Any, want: Any, path: str = "<root>", *, key_order: bool = True) -> None:
    """Asserts equal structure (key order too, unless ``key_order`` is False), exact types,
    and bit-identical tensors, arrays and floats (NaN equals NaN; -0.0 differs from 0.0)."""
    if isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor, f"{path}: {type(got)}"
        assert got.device.type == "cpu", path
        assert got.dtype == want.dtype and got.shape == want.shape, (path, got.dtype, got.shape)
        assert torch.equal(raw_bytes(got), raw_bytes(want)), path
        return
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), path
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), path
    elif isinstance(want, float):
        assert math.isnan(got) if math.isnan(want) else (got == want and math.copysign(1, got) == math.copysign(1, want)), path
    elif isinstance(want, argparse.Namespace):
        assert_same(vars(got), vars(want), path, key_order=key_order)
    elif isinstance(want, dict):
        keys = (list(got), list(want)) if key_order else (sorted(got, key=repr), sorted(want, key=repr))
        assert keys[0] == keys[1], f"{path}: keys {keys[0]} != {keys[1]}"
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}", key_order=key_order)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}.{i}", key_order=key_order)
    else:
        assert got == want, path


def clone_state(state: Any) -> Any:
    """A copy of ``state`` whose tensors and arrays are copies too (what a save must have
    captured, to compare with after the state changed)."""
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, np.ndarray):
        return state.copy()
    if isinstance(state, dict):
        return {k: clone_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(clone_state(v) for v in state)
    return state


def mutate_state(state: Any) -> None:
    """Overwrites every tensor and array of ``state`` in place (a training step after a save
    was started): every element becomes -7 (or True)."""
    if isinstance(state, (torch.Tensor, np.ndarray)):
        state[...] = -7 if state.dtype not in (torch.bool, np.bool_) else True
    elif isinstance(state, dict):
        for v in state.values():
            mutate_state(v)
    elif isinstance(state, (list, tuple)):
        for v in state:
            mutate_state(v)


def same(got: Any, want: Any) -> bool:
    """Whether ``assert_same(got, want)`` passes (for negative controls)."""
    try:
        assert_same(got, want)
    except AssertionError:
        return False
    return True


# ----------------------------------------------------------------------------- SIGKILL
def read_progress(path: str) -> list[str]:
    """The complete lines a child wrote to its progress file (a torn last line is left out)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.strip() for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def wait_for(path: str, pred: Callable[[list[str]], bool], proc: subprocess.Popen,
             timeout: float = 60.0) -> list[str]:
    """Waits until the progress lines in ``path`` satisfy ``pred``; returns them.

    Raises:
        AssertionError: the child exited first, or ``timeout`` seconds passed (it is killed).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = read_progress(path)
        if pred(lines):
            return lines
        if proc.poll() is not None:
            raise AssertionError(f"child exited with {proc.returncode} before expected progress: {lines[-5:]}")
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"timed out waiting for the child; progress: {read_progress(path)[-5:]}")


def committed_steps(lines: list[str]) -> list[int]:
    """The steps of the ``committed <step>`` progress lines."""
    return [int(ln.split()[1]) for ln in lines if ln.startswith("committed ")]


def kill_rounds(start: Callable[[int], subprocess.Popen], progress: str,
                after_kill: Callable[[list[str]], bool], *, seed: int, delay: tuple[float, float],
                rounds: int, min_debris: int = 0, max_rounds: int | None = None) -> int:
    """SIGKILLs a child at random moments, round after round; returns how many kills left debris.

    Each round starts a child (``start(round)``), waits until it reports ``ready`` in the
    ``progress`` file, waits a seeded random time in ``delay`` seconds, SIGKILLs it and
    checks that it died of that; ``after_kill(progress lines)`` then checks what the
    child left and says whether the kill landed inside unfinished work (debris). Runs
    ``rounds`` rounds, then more (up to ``max_rounds``) until ``min_debris`` kills left debris.
    """
    rng = random.Random(seed)
    debris = 0
    for n in range(max(rounds, max_rounds or 0)):
        if n >= rounds and debris >= min_debris:
            break
        if os.path.exists(progress):
            os.remove(progress)
        proc = start(n)
        try:
            wait_for(progress, lambda ln: "ready" in ln, proc)
            time.sleep(rng.uniform(*delay))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        lines = read_progress(progress)
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, lines[-3:])
        debris += bool(after_kill(lines))
    return debris


# ----------------------------------------------------------------------------- the planes kernel
def c_compiler() -> str | None:
    """The C compiler a package build here would use (``$CC`` or Python's), if it exists."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(cc.split()[0])


def compiled_kernel() -> Any:
    """The compiled planes kernel (``format.planes_kernel.loaded()``). Where it is missing,
    fails if a C compiler exists (the package build must have made it) and skips if none does."""
    import pytest

    from shardsafe.format import planes_kernel

    kernel = planes_kernel.loaded()
    if kernel is None:
        if c_compiler() is not None:
            pytest.fail(f"the planes kernel is not built although {c_compiler()} exists "
                        "(pip install / make builds it)")
        pytest.skip("no C compiler here: the planes kernel cannot be built")
    return kernel


# ----------------------------------------------------------------------------- the command
def run_cli(*args: Any, env: dict[str, str | None] | None = None, cwd: str | os.PathLike | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs ``shardsafe *args`` and returns what ``python -m shardsafe`` would: exit code,
    stdout and stderr (log records included, formatted as the command does).

    The command runs in this process (an interpreter start-up importing torch costs
    seconds, and the CLI tests run it ~80 times); an uncaught exception becomes a
    traceback on stderr and exit code 1, as in a child. With ``env`` (variables for the
    child; None removes one) it runs as a real child process, whose environment is
    really its own (credentials, endpoints).
    """
    argv = [str(a) for a in args]
    if env is not None:
        from shardsafe.harness.processes import child_env

        merged = {k: v for k, v in {**child_env(), **env}.items() if v is not None}
        return subprocess.run([sys.executable, "-m", "shardsafe", *argv], env=merged, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)
    from shardsafe.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root, old_level = logging.getLogger(), logging.getLogger().level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if {"-v", "--verbose"} & set(argv) else logging.WARNING)
    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse: usage errors (2) and --help (0)
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            except Exception:  # noqa: BLE001 - what the interpreter would print and exit with
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(here)
        root.removeHandler(handler)
        root.setLevel(old_level)
    return subprocess.CompletedProcess(["shardsafe", *argv], code, out.getvalue(), err.getvalue())
