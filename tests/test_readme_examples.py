"""Every Python example in README.md runs.

Fenced ```python blocks are executed in the order they appear, each as its own script
in a fresh interpreter, all in one scratch directory (so a later example may read what
an earlier one wrote, as a reader trying them one after another would). A block whose
fence says ```python no-run is skipped (e.g. it needs an S3 bucket). The quickstart's
two commands are pinned too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme")


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[f"line-{b.line}" for b in RUNNABLE])
def test_readme_example_runs(block: Block, scratch: Path, subprocess_env: dict[str, str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    script = scratch / f"readme_line_{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=scratch, env=subprocess_env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (f"README.md line {block.line} failed:\n{block.code}\n"
                                  f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert os.listdir(scratch)
