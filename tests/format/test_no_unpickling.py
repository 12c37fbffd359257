"""Source scan: nothing in the package can unpickle, and errors are never swallowed broadly."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src",
                   "shardsafe")


def _sources() -> Iterator[tuple[str, str]]:
    for root, _, files in os.walk(SRC):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(root, f)
                with open(p, encoding="utf-8") as fh:
                    yield os.path.relpath(p, SRC), fh.read()


def test_sources_found() -> None:
    names = [n for n, _ in _sources()]
    assert "format/index/versions.py" in names and len(names) > 20


PICKLE_ERRORS = {"UnpicklingError", "PicklingError", "PickleError"}
FORBIDDEN_IMPORTS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}


@pytest.mark.parametrize(("name", "text"), list(_sources()), ids=[n for n, _ in _sources()])
def test_no_pickle_and_no_unsafe_torch_load(name: str, text: str) -> None:
    tree = ast.parse(text, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = {a.name.split(".")[0] for a in node.names} & FORBIDDEN_IMPORTS
            assert not bad, f"{name}:{node.lineno} imports {bad}"
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in FORBIDDEN_IMPORTS:
                # catching the error torch.load(weights_only=True) raises is not unpickling
                names = {a.name for a in node.names}
                assert names <= PICKLE_ERRORS, f"{name}:{node.lineno} imports {names} from {node.module}"
        elif isinstance(node, ast.Call):
            fn = ast.unparse(node.func)
            if fn.endswith(("torch.load", ".load")) and "torch" in fn:
                kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
                assert kw.get("weights_only") == "True", f"{name}:{node.lineno}: {fn} without weights_only=True"
            assert fn not in ("eval", "exec", "__import__"), f"{name}:{node.lineno}: {fn}"
            # np.load's own pickle switch (shardsafe.dcp.Reader's option of that name is
            # only ever named in its docs and messages, never passed True by the package)
            assert not any(k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant)
                                                            and k.value.value is False)
                           for k in node.keywords), f"{name}:{node.lineno}: {fn} with allow_pickle"


def _forwards(handler: ast.ExceptHandler) -> bool:
    """The handler re-raises, or hands the caught exception on (e.g. to a future or handle)."""
    if any(isinstance(n, ast.Raise) for n in ast.walk(handler)):
        return True
    return handler.name is not None and any(
        isinstance(n, ast.Name) and n.id == handler.name for b in handler.body for n in ast.walk(b))


@pytest.mark.parametrize(("name", "text"), list(_sources()), ids=[n for n, _ in _sources()])
def test_no_broad_except_that_swallows(name: str, text: str) -> None:
    for node in ast.walk(ast.parse(text, name)):
        if isinstance(node, ast.ExceptHandler):
            broad = node.type is None or ast.unparse(node.type) in ("Exception", "BaseException")
            assert not broad or _forwards(node), f"{name}:{node.lineno}: broad except swallows the error"
