"""The first example of docs/guides/training-loop.md (a training loop with CheckpointManager) runs as documented."""

from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "guides", "training-loop.md")
SECTION = "# A training loop with CheckpointManager"


def first_python_block(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"```python\n(.*?)```", text[text.index(SECTION):], re.S)
    assert m, f"no python block in {path}"
    return m.group(1)


def test_training_loop_example_runs(tmp_path, python, subprocess_env) -> None:
    script = tmp_path / "train.py"
    script.write_text(first_python_block(DOC))
    run = subprocess.run([python, str(script)], cwd=tmp_path, env=subprocess_env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    kept = [0, 100, 200, 225, 250, 275]  # every 100th step and the newest three
    assert f"checkpoints: {kept}" in run.stdout
    assert sorted(os.listdir(tmp_path / "checkpoints" / "run1")) == [f"step_{s:08d}" for s in kept]
