"""The public API is only the API: its names are pinned, and the reference lists exactly them.

``shardsafe.__all__`` is what users may rely on; the API reference (docs/reference, built
by mkdocstrings from the docstrings) documents every one of those names and nothing else
at the top level; and the objects the API hands out (``SaveHandle``, ``Checkpointer``)
show their users' methods only: what the engine calls on a save in flight lives on its
own object (``engine.save.handle.SaveProgress``), not on the handle.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import shardsafe
from shardsafe import errors

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = {
    "__version__", "save", "async_save", "load", "delete", "Checkpointer", "SaveHandle", "LoadResult",
    "RNGState", "PerRank", "ModelOptimizerState", "CheckpointManager", "ManagerOptions", "RestoreInfo",
    "CheckpointError", "CorruptCheckpointError", "CheckpointNotFoundError", "StateMismatchError",
    "CheckpointTimeoutError", "StorageRequestError",
}
# DESIGN.md's "Public API contract" (plus LoadResult, SaveHandle and __version__, which the
# API returns or promises): all of it is public
CONTRACT = {
    "__version__", "save", "load", "async_save", "SaveHandle", "LoadResult", "RNGState", "CheckpointManager",
    "CheckpointError", "CorruptCheckpointError", "CheckpointNotFoundError", "StateMismatchError",
    "CheckpointTimeoutError", "delete",
}
HANDLE = {"path", "nbytes", "timings", "wait_staged", "result", "done", "failed", "exception"}
CHECKPOINTER = {"save", "async_save", "load", "wait", "close", "closed", "retained_bytes"}


def _members(cls: type) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}


def _is_module(name: str) -> bool:
    parent = name.rsplit(".", 1)[0]
    if parent != "shardsafe" and not hasattr(importlib.import_module(parent), "__path__"):
        return False  # a name inside a module (shardsafe.model_state.ModelOptimizerState)
    return importlib.util.find_spec(name) is not None


def _documented() -> set[str]:
    """Top-level names the reference pages document (``::: shardsafe.X``, the errors
    module's classes, and names documented at their home module); modules documented
    whole (the integrations) are not names of the top level."""
    names: set[str] = set()
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        for target in re.findall(r"^:::\s*(shardsafe\.[\w.]+)", page.read_text(), re.M):
            parts = target.split(".")
            if target == "shardsafe.errors":  # the page documents the module's error classes
                names.update(n for n, v in vars(errors).items() if not n.startswith("_")
                             and isinstance(v, type) and issubclass(v, Exception) and v.__module__ == errors.__name__)
            elif _is_module(target):
                continue  # a module's page (the integrations, the manager's policies)
            elif len(parts) == 2:
                names.add(parts[1])
            elif hasattr(shardsafe, parts[-1]) and parts[-1] in shardsafe.__all__:
                names.add(parts[-1])  # e.g. shardsafe.model_state.ModelOptimizerState
    return names


def test_the_export_list_is_pinned() -> None:
    assert set(shardsafe.__all__) == PUBLIC
    assert len(shardsafe.__all__) == len(PUBLIC)  # no name twice
    assert CONTRACT <= PUBLIC, CONTRACT - PUBLIC


def test_the_reference_documents_exactly_the_exports() -> None:
    documented = _documented() | {"__version__"}
    assert documented == PUBLIC, (sorted(documented - PUBLIC), sorted(PUBLIC - documented))


def test_a_save_handle_shows_only_what_its_caller_uses() -> None:
    assert _members(shardsafe.SaveHandle) == HANDLE


def test_a_checkpointer_shows_only_saving_loading_waiting_and_closing() -> None:
    assert _members(shardsafe.Checkpointer) == CHECKPOINTER
    with shardsafe.Checkpointer() as ckpt:
        assert {n for n in vars(ckpt) if not n.startswith("_")} == set()  # no public attributes either
