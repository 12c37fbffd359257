"""Walking a checkpoint's leaves and reading single tensors (for info, export and diff).

Reads go through ``engine.load.reader.ChunkReader``, so every byte the CLI hands out has passed
its checksum.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .. import values
from ..engine.buffers import allocating
from ..engine.load.reader import ChunkReader, ReadJob
from ..format.index.objects import Index, TensorEntry
from ..format.tree import KeyPath, Node, decode_plain, dict_items, render_path
from ..values import torch as torch_values


@dataclass(frozen=True, slots=True)
class Leaf:
    """A leaf of the checkpoint tree: a tensor, a plain value, or an empty container.

    Attributes:
        key: Key path.
        node: The tree node (``{"t": "int", "v": 7}``, ``{"t": "tensor", "id": 3}``, ...).
        entry: The tensor entry, for tensors.
    """

    key: KeyPath
    node: Node
    entry: TensorEntry | None

    @property
    def dotted(self) -> str:
        return render_path(self.key)

    @property
    def kind(self) -> str:
        return self.node["t"]

    def value(self) -> Any:
        """The decoded plain value (an empty container for ``dict``/``list``/``tuple``)."""
        t = self.node["t"]
        if t in ("dict", "list"):
            return {} if t == "dict" else []
        if t == "tuple":
            return ()
        return decode_plain(self.node)


def leaves(index: Index, node: Node | None = None, path: KeyPath = ()) -> Iterator[Leaf]:
    """Every leaf of the (validated) tree in order, empty containers included.

    ``node``/``path`` start the walk at a subtree (see ``subtree``).
    """

    def walk(node: Node, path: KeyPath) -> Iterator[Leaf]:
        t = node["t"]
        if t in ("dict", "namespace") and node["k"]:
            for k, v in dict_items(node):
                yield from walk(v, path + (k,))
        elif t in ("list", "tuple") and node["v"]:
            for i, v in enumerate(node["v"]):
                yield from walk(v, path + (i,))
        elif t in ("tensor", "alias"):  # an alias (tied tensor) shows the entry it shares
            yield Leaf(path, node, index.tensors[node["id"]])
        else:
            yield Leaf(path, node, None)

    yield from walk(index.tree if node is None else node, path)


def subtree(index: Index, only: str | None) -> tuple[Node, KeyPath]:
    """The tree node at dotted path ``only`` (the root when None) and its key path.

    Raises:
        KeyError: No key path renders as ``only``.
    """
    if not only:
        return index.tree, ()

    def find(node: Node, path: KeyPath) -> tuple[Node, KeyPath] | None:
        if render_path(path) == only:
            return node, path
        t = node["t"]
        if t in ("dict", "namespace"):
            children = dict_items(node)
        elif t in ("list", "tuple"):
            children = enumerate(node["v"])
        else:
            return None
        for k, v in children:
            sub = path + (k,)
            rendered = render_path(sub)
            if rendered == only or only.startswith(rendered + "."):
                hit = find(v, sub)
                if hit is not None:
                    return hit
        return None

    hit = find(index.tree, ())
    if hit is None:
        raise KeyError(only)
    return hit


def without(node: Node, keys: list[str] | None) -> Node:
    """Dict ``node`` without its children named ``keys`` (every one must be there).

    Raises:
        KeyError: A key is not a child of ``node`` (or ``node`` is no dict).
    """
    if not keys:
        return node
    items = list(dict_items(node)) if node["t"] in ("dict", "namespace") else []
    names = {str(k) for k, _ in items}
    for k in keys:
        if k not in names:
            raise KeyError(k)
    kept = [i for i, (k, _) in enumerate(items) if str(k) not in keys]
    return {**node, "k": [node["k"][i] for i in kept], "v": [node["v"][i] for i in kept]}


def read_tensor(reader: ChunkReader, entry: TensorEntry) -> Any:
    """Reads one whole tensor (torch, or numpy for arrays saved from numpy), verified.

    Raises:
        CheckpointError: there is not enough memory for it.
    """
    with allocating(lambda: f"{render_path(entry.key)} ({entry.nbytes} bytes)"):
        value, dest = values.stored_kind(entry.kind).empty(entry.dtype, entry.shape)
    reader.run([ReadJob(entry, dest, (0,) * len(entry.shape), entry.shape)])
    return value


def as_torch(value: Any) -> Any:
    """A torch tensor for a torch tensor or numpy array (sharing memory)."""
    if torch_values.is_torch_tensor(value):
        return value
    return torch_values.torch.from_numpy(value)


def require_torch(what: str) -> None:
    """Raises ImportError naming the command when torch is not installed."""
    if not torch_values.HAVE_TORCH:
        raise ImportError(f"{what} needs torch (pip install 'shardsafe[torch]')")
