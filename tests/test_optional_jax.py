"""JAX is optional: ``import shardsafe`` never imports it, and shardsafe works where JAX
(and ml_dtypes) cannot be imported at all."""

from __future__ import annotations

import subprocess
import sys

from shardsafe.harness.processes import child_env

HIDE = """
import sys
class Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "ml_dtypes", "orbax"):
            raise ImportError(f"{name} is hidden for this test")
sys.meta_path.insert(0, Hidden())
"""

CHECK = """
import numpy as np, torch, shardsafe, os, sys, tempfile
d = tempfile.mkdtemp()
shardsafe.save({"w": torch.arange(6.0).bfloat16(), "a": np.arange(3), "n": 1}, os.path.join(d, "c"))
out = shardsafe.load(os.path.join(d, "c"))
assert out["w"].dtype == torch.bfloat16 and out["a"].tolist() == [0, 1, 2]
target = {"w": torch.zeros(6, dtype=torch.bfloat16), "a": np.zeros(3, np.int64), "n": 0}
shardsafe.load(os.path.join(d, "c"), target)
assert target["w"].float().tolist() == list(range(6)) and target["n"] == 1
import shardsafe.jax, shardsafe.engine.load.placers.jax_arrays
print("jax imported:", any(m.split(".")[0] in ("jax", "jaxlib") for m in sys.modules))
"""


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_shardsafe_works_where_jax_cannot_be_imported() -> None:
    hidden = "\ntry:\n    import jax\nexcept ImportError:\n    print('hidden')\n"
    assert _run(HIDE + hidden + CHECK) == "hidden\njax imported: False"


def test_import_shardsafe_does_not_import_jax() -> None:
    assert _run(CHECK) == "jax imported: False"
