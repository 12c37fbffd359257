"""Reading an Orbax checkpoint for ``shardsafe import``: the PyTree layout that
``StandardCheckpointer`` and ``PyTreeCheckpointer`` write, OCDBT or not.

The reading is Orbax's own (through tensorstore), with every array restored as a host
numpy array in its stored dtype, so the import is bit-exact whatever mesh wrote it.
Orbax's metadata is JSON and msgpack, never a pickle. A ``CheckpointManager`` step
directory (its item in a subdirectory, ``default`` for one unnamed item) is read through
that item.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

PYTREE_METADATA = "_METADATA"  # the file of Orbax's PyTree layout


def is_orbax(src: str) -> bool:
    """Whether the directory ``src`` (or its one item) holds an Orbax PyTree checkpoint."""
    return item_directory(src) is not None


def item_directory(src: str) -> str | None:
    """The directory holding the PyTree (``src`` itself, or its one item subdirectory)."""
    if os.path.isfile(os.path.join(src, PYTREE_METADATA)):
        return src
    items = [d for d in sorted(os.listdir(src)) if os.path.isfile(os.path.join(src, d, PYTREE_METADATA))]
    return os.path.join(src, items[0]) if len(items) == 1 else None


def read_orbax(src: str) -> dict[str, Any]:
    """The pytree of the Orbax checkpoint at ``src``, arrays as numpy arrays.

    Raises:
        ImportError: orbax-checkpoint is not installed.
        ValueError: ``src`` is not an Orbax PyTree checkpoint.
    """
    path = item_directory(src)
    if path is None:
        raise ValueError(f"{src} holds no Orbax PyTree checkpoint ({PYTREE_METADATA} not found)")
    try:
        import jax
        import orbax.checkpoint as ocp
    except ImportError:
        raise ImportError("importing an Orbax checkpoint needs orbax-checkpoint "
                          "(pip install 'shardsafe[jax]')") from None
    with ocp.PyTreeCheckpointer() as ckptr:
        meta = ckptr.metadata(path)
        tree = getattr(meta, "item_metadata", meta)
        tree = getattr(tree, "tree", tree)
        args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        state = ckptr.restore(path, restore_args=args)
    if not isinstance(state, dict):
        raise ValueError(f"{src} holds a {type(state).__name__} at its root, not a dict of state")
    return state


def same_values(source: Any, loaded: Any, where: str = "") -> list[str]:
    """The key paths where ``loaded`` differs from ``source`` (bytes, dtype, shape, type)."""
    if isinstance(source, dict):
        if not isinstance(loaded, dict) or set(map(str, source)) != set(map(str, loaded)):
            return [where or "<root>"]
        got = {str(k): v for k, v in loaded.items()}
        return [p for k, v in source.items() for p in same_values(v, got[str(k)], f"{where}.{k}".lstrip("."))]
    if isinstance(source, (list, tuple)):
        if not isinstance(loaded, (list, tuple)) or len(source) != len(loaded):
            return [where]
        return [p for i, (a, b) in enumerate(zip(source, loaded)) for p in same_values(a, b, f"{where}.{i}")]
    if isinstance(source, np.ndarray):
        b = np.asarray(loaded)
        same = b.dtype == source.dtype and b.shape == source.shape and b.tobytes() == source.tobytes()
        return [] if same else [where]
    return [] if source == loaded or np.asarray(source).tobytes() == np.asarray(loaded).tobytes() else [where]
