"""Every Python example in README.md runs.

Fenced ```python blocks are executed in the order they appear, all in one scratch
directory (so a later example may read what an earlier one wrote, as a reader trying
them one after another would). By default one child interpreter runs them all, each as
``__main__`` in a fresh namespace (one torch import instead of one per block); under
``-m stress`` each runs as its own script in a fresh interpreter. A block whose fence
says ```python no-run is skipped (e.g. it needs an S3 bucket). The quickstart's two
commands are pinned too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardsafe.harness.processes import child_env

README = Path(__file__).resolve().parent.parent / "README.md"
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    line: int
    info: str
    code: str

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def runnable(self) -> bool:
        return self.language == "python" and "no-run" not in self.info.split()[1:]


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a markdown text, with the line their fence is on."""
    return [Block(text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2))
            for m in _FENCE.finditer(text)]


RUNNABLE = [b for b in blocks(README.read_text(encoding="utf-8")) if b.runnable]


def test_fence_parsing() -> None:
    text = ("intro\n```python\nprint(1)\n```\n\n```python no-run\nboom()\n```\n"
            "```sh\nmake demo\n```\n```\nplain\n```\n")
    found = blocks(text)
    assert [(b.line, b.info, b.code) for b in found] == [
        (2, "python", "print(1)\n"), (6, "python no-run", "boom()\n"),
        (9, "sh", "make demo\n"), (12, "", "plain\n")]
    assert [b.runnable for b in found] == [True, False, False, False]


def test_readme_has_runnable_examples_and_the_two_quickstart_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(RUNNABLE) >= 8
    quick = text[text.index("## Quickstart"):]
    first_sh = next(b for b in blocks(quick) if b.language == "sh")
    commands = [line.split("#")[0].strip() for line in first_sh.code.splitlines()]
    assert commands == ["make demo", "make test"]


# Runs each script given as ``__main__`` in a fresh namespace, in order, with stdout and
# stderr captured per script; prints {script: {"ok": bool, "output": str}} as JSON.
_RUNNER = """
import contextlib, io, json, runpy, sys, traceback
results = {}
for path in sys.argv[1:]:
    out = io.StringIO()
    ok = True
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            ok = e.code in (None, 0)
        except BaseException:
            traceback.print_exc()
            ok = False
    results[path] = {"ok": ok, "output": out.getvalue()}
print(json.dumps(results))
"""


def _write(scratch: Path, block: Block) -> Path:
    script = scratch / f"readme_line_{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    return script


@pytest.fixture(scope="module")
def one_interpreter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    scratch = tmp_path_factory.mktemp("readme")
    scripts = [str(_write(scratch, b)) for b in RUNNABLE]
    proc = subprocess.run([sys.executable, "-c", _RUNNER, *scripts], cwd=scratch, env=child_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return scratch, json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"line-{b.line}" for b in RUNNABLE])
def test_readme_example_runs(block: Block, one_interpreter: tuple[Path, dict[str, dict]]) -> None:
    scratch, results = one_interpreter
    got = results[str(scratch / f"readme_line_{block.line}.py")]
    assert got["ok"] and "Traceback" not in got["output"], (
        f"README.md line {block.line} failed:\n{block.code}\n--- output\n{got['output']}")


def test_training_loop_example_keeps_what_it_documents(one_interpreter: tuple[Path, dict[str, dict]]) -> None:
    """The example of "Using shardsafe in a training loop": its retention keeps every
    100th step and the newest three."""
    scratch, results = one_interpreter
    text = README.read_text(encoding="utf-8")
    section = text.count("\n", 0, text.index("## Using shardsafe in a training loop")) + 1
    block = next(b for b in RUNNABLE if b.line > section)
    out = results[str(scratch / f"readme_line_{block.line}.py")]["output"]
    kept = [0, 100, 200, 225, 250, 275]
    assert f"checkpoints: {kept}" in out, out
    assert sorted(os.listdir(scratch / "checkpoints" / "run1")) == [f"step_{s:08d}" for s in kept]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme-fresh")


@pytest.mark.stress
@pytest.mark.parametrize("block", RUNNABLE, ids=[f"line-{b.line}" for b in RUNNABLE])
def test_readme_example_runs_in_a_fresh_interpreter(block: Block, scratch: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    script = _write(scratch, block)
    proc = subprocess.run([sys.executable, str(script)], cwd=scratch, env=child_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (f"README.md line {block.line} failed:\n{block.code}\n"
                                  f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert os.listdir(scratch)
