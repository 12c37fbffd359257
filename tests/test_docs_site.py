"""The documentation site builds with ``mkdocs build --strict`` (as ``make docs`` does).

Strict mode turns every warning into a failure: a page missing from the navigation, a
link to a page or an anchor that does not exist, a docstring mkdocstrings cannot render.
The API reference pages must hold the docstrings of the public API.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ["index.html", "getting-started/index.html", "FORMAT/index.html",
                 "BENCHMARKS/index.html", "guides/dcp/index.html", "concepts/tiers/index.html"]:
        assert (site / page).is_file(), page
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    # rendered from the docstrings, not written by hand on the page
    assert "returns once the checkpoint is committed and durable" in api
    assert "wait_staged" in api
    manager = (site / "reference" / "manager" / "index.html").read_text(encoding="utf-8")
    assert "restore" in manager and "save_interval_steps" in manager
