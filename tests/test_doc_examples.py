"""Every Python example of README.md and of the documentation pages under docs/ runs.

The fenced ```python blocks of a page run in the order they appear, in one scratch
directory per page, each block in a namespace of its own, as a reader trying them one
after another would (a later example may read what an earlier one wrote). A traceback
names the page and the line of the markdown file. A block fenced as
```{.python .no-run} is shown but not run; one fenced as ```{.python .s3} runs against
the suite's S3 server (its bucket for ``s3://my-bucket``, its options for ``opts``). docs/FORMAT.md's
examples are checked by tests/format (test_format_doc.py, test_index_v2_doc.py).

The default suite runs every page in one interpreter (importing torch, Lightning and
Accelerate once instead of once per page); ``-m stress`` runs each page in a fresh
interpreter of its own. The README's two quickstart commands and its size are pinned too.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardsafe.harness.processes import child_env

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CHECKED_ELSEWHERE = {DOCS / "FORMAT.md"}
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)

# Runs pages given as JSON [[page, [[line, code], ...]], ...]: each page in a scratch
# directory of its own, its blocks in order, compiled with the page as file name and
# padded so that tracebacks show the markdown line (and, through linecache, its text). A failing block ends its page (the
# later blocks may depend on it), not the run; each page's outcome is appended to the
# results file as one JSON line as soon as it is known.
_RUNNER = """
import json, linecache, os, sys, traceback
pages, results = json.load(open(sys.argv[1], encoding="utf-8")), sys.argv[2]
top = os.getcwd()
for n, (page, blocks) in enumerate(pages):
    os.makedirs(os.path.join(top, str(n)))
    os.chdir(os.path.join(top, str(n)))
    error = None
    for line, code in blocks:
        print(f"--- {page}:{line}", flush=True)
        try:
            source = "\\n" * line + code
            linecache.cache[page] = (len(source), None, source.splitlines(True), page)
            exec(compile(source, page, "exec"), {"__name__": "__main__"})
        except (Exception, SystemExit):
            error = traceback.format_exc()
            break
    with open(results, "a", encoding="utf-8") as f:
        f.write(json.dumps({"page": page, "error": error}) + "\\n")
"""


@dataclass(frozen=True)
class Block:
    line: int
    info: str
    code: str

    @property
    def words(self) -> list[str]:
        """The info string's words; ``{.python .no-run}`` attribute lists lose the dots."""
        info = self.info
        if info.startswith("{") and info.endswith("}"):
            return [w.lstrip(".") for w in info[1:-1].split()]
        return info.split()

    @property
    def language(self) -> str:
        return self.words[0] if self.words else ""

    @property
    def runnable(self) -> bool:
        return self.language == "python" and not {"no-run", "s3"} & set(self.words[1:])


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a markdown text, with the line their fence is on."""
    return [Block(text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2))
            for m in _FENCE.finditer(text)]


def pages() -> list[Path]:
    return [README, *(p for p in sorted(DOCS.rglob("*.md")) if p not in CHECKED_ELSEWHERE)]


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page.read_text(encoding="utf-8")) if b.runnable]


PAGES_WITH_EXAMPLES = [p for p in pages() if runnable(p)]
PAGE_IDS = [str(p.relative_to(ROOT)) for p in PAGES_WITH_EXAMPLES]


def run_pages(selected: list[Path], tmp: Path, env: dict[str, str]) -> dict[str, str | None]:
    """Runs the examples of ``selected`` in one interpreter: page name -> traceback or None.

    A page missing from the result is one the interpreter never finished (it died or
    hung); the result then maps it to the interpreter's output.
    """
    spec, results = tmp / "pages.json", tmp / "results.jsonl"
    spec.write_text(json.dumps([[str(p.relative_to(ROOT)), [[b.line, b.code] for b in runnable(p)]]
                                for p in selected]), encoding="utf-8")
    scratch = tmp / "scratch"
    scratch.mkdir()
    try:
        proc = subprocess.run([sys.executable, "-c", _RUNNER, str(spec), str(results)],
                              cwd=scratch, env=env, capture_output=True, text=True,
                              timeout=120 + 60 * len(selected))
        output = f"exit status {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    except subprocess.TimeoutExpired as e:
        output = f"timed out\n--- stdout\n{e.stdout}\n--- stderr\n{e.stderr}"
    done = {}
    if results.exists():
        for line in results.read_text(encoding="utf-8").splitlines():
            outcome = json.loads(line)
            done[outcome["page"]] = outcome["error"]
    return {str(p.relative_to(ROOT)): done.get(str(p.relative_to(ROOT)), output) for p in selected}


def test_fence_parsing() -> None:
    text = ("intro\n```python\nprint(1)\n```\n\n```{.python .no-run}\nboom()\n```\n"
            "```sh\nmake demo\n```\n```\nplain\n```\n```python no-run\nboom()\n```\n")
    found = blocks(text)
    assert [(b.line, b.info, b.code) for b in found] == [
        (2, "python", "print(1)\n"), (6, "{.python .no-run}", "boom()\n"),
        (9, "sh", "make demo\n"), (12, "", "plain\n"), (15, "python no-run", "boom()\n")]
    assert [b.runnable for b in found] == [True, False, False, False, False]


def test_readme_is_short_with_the_two_commands_and_an_example() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert len(runnable(README)) >= 1
    quick = text[text.index("## Quickstart"):]
    first_sh = next(b for b in blocks(quick) if b.language == "sh")
    commands = [line.split("#")[0].strip() for line in first_sh.code.splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_examples_are_spread_over_the_pages() -> None:
    assert sum(len(runnable(p)) for p in PAGES_WITH_EXAMPLES) >= 18
    assert len(PAGES_WITH_EXAMPLES) >= 10


@pytest.fixture(scope="module")
def one_interpreter(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    return run_pages(PAGES_WITH_EXAMPLES, tmp_path_factory.mktemp("docs-examples"),
                     child_env(OMP_NUM_THREADS="1"))


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGE_IDS)
def test_page_examples_run(page: str, one_interpreter: dict[str, str | None]) -> None:
    error = one_interpreter[page]
    assert error is None, f"an example of {page} failed:\n{error}"


@pytest.mark.stress
@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=PAGE_IDS)
def test_page_examples_run_in_a_fresh_interpreter(page: Path, tmp_path: Path,
                                                   subprocess_env: dict[str, str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    name = str(page.relative_to(ROOT))
    error = run_pages([page], tmp_path, subprocess_env)[name]
    assert error is None, f"an example of {name} failed:\n{error}"


_OPTS = re.compile(r"^opts = \{.*?\}[^\n]*\n", re.M | re.S)


def test_object_store_examples_run_against_the_test_server(s3, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The ``.s3`` blocks, with the test bucket and its options in place of the reader's."""
    found = [(p, b) for p in pages() for b in blocks(p.read_text(encoding="utf-8"))
             if b.language == "python" and "s3" in b.words[1:]]
    assert found, "no .s3 example left: drop this test or the tag"
    monkeypatch.chdir(tmp_path)
    for page, block in found:
        code, n = _OPTS.subn("opts = TEST_OPTIONS\n", block.code)
        assert n == 1, f"{page}:{block.line}: an .s3 example defines `opts = {{...}}` once"
        code = code.replace("s3://my-bucket", s3.url)
        source = "\n" * block.line + code
        exec(compile(source, str(page), "exec"), {"__name__": "__main__", "TEST_OPTIONS": s3.storage_options})
