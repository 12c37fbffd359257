"""Match a checkpoint's tree against a live target state, for in-place loading.

The walk collects every problem (missing, unexpected, mismatched key paths) and every
change it would make before anything is touched, so a strict load either fails naming
all offending keys or restores the target. Inside Stateful objects the checkpoint wins
for keys the target does not have yet, so a never-stepped optimizer or scheduler
restores fully; ``nn.Module`` state dicts are closed (extra keys are unexpected).
``load_state_dict`` calls run after all tensors are read, innermost first.
"""

from __future__ import annotations

import argparse

import copy as _copy
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ... import values
from ..buffers import new_tensor
from ...format.index.objects import Index, TensorEntry
from ...format.tree import KeyPath, Node, build, dict_items, render_path
from ...plan.flatten import Stateful, is_stateful
from ...values import torch as torch_values


@dataclass(slots=True)
class TensorTarget:
    """A checkpoint tensor and the host/device tensor it is read into."""

    entry: TensorEntry | None
    """The tensor's index entry (its chunks); None when ``tid`` names it in the index's columns."""
    target: Any
    """The tensor (or DTensor) its bytes are read into."""
    dest: Any = None
    """A new tensor's writable bytes, known from its allocation (None: derived from ``target``)."""
    offsets: tuple[int, ...] | None = None
    """Where ``target`` starts in the global tensor, when it holds only a box of it (a DCP
    read item); None: derived from ``target`` (all of it, or a DTensor's local shard)."""
    tid: int = -1
    """The tensor's position in the index's tensor table (-1: not known)."""
    cast: bool = False
    """``target`` has another floating-point dtype than the stored tensor (``load(...,
    cast=True)``): the bytes are staged in the stored dtype, then converted (``placers.staged``)."""


@dataclass(slots=True)
class Matching:
    """What a load will do, and what did not fit."""

    reads: list[TensorTarget] = field(default_factory=list)
    """Tensors to read in place."""
    assignments: list[tuple[Any, Any, Any]] = field(default_factory=list)
    """``(container, key, value)``: plain values to store once the reads succeeded."""
    finalizers: list[Callable[[], None]] = field(default_factory=list)
    """Calls that finish a load (e.g. ``load_state_dict`` of Stateful objects), in order."""
    missing: list[str] = field(default_factory=list)
    """Key paths of the target absent from the checkpoint."""
    unexpected: list[str] = field(default_factory=list)
    """Key paths of the checkpoint absent from the target."""
    mismatched: list[str] = field(default_factory=list)
    """Key paths whose shape, dtype or type differ."""
    reasons: list[str] = field(default_factory=list)
    """``"<key path>: <how it differs>"``, one per entry of ``mismatched``."""

    def problems(self) -> list[str]:
        return ([f"missing in checkpoint: {k}" for k in self.missing]
                + [f"unexpected in checkpoint (absent from target): {k}" for k in self.unexpected]
                + [f"mismatch: {m}" for m in self.reasons])

    def apply(self) -> None:
        """Applies the container assignments, then the Stateful ``load_state_dict`` calls."""
        for container, key, value in self.assignments:
            container[key] = value
        for fn in self.finalizers:
            fn()


def _is_module(x: Any) -> bool:
    return torch_values.HAVE_TORCH and isinstance(x, torch_values.torch.nn.Module)


def _holds_state(x: Any) -> bool:
    """True if a target container holds tensors or Stateful objects (worth matching item by item)."""
    if values.is_tensor(x) or is_stateful(x):
        return True
    if isinstance(x, MutableMapping):
        return any(_holds_state(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_holds_state(v) for v in x)
    return False


def _kind(node: Node) -> str:
    if node["t"] == "alias":
        return "tensor"
    return node["t"] if node["t"] in ("dict", "list", "tuple", "tensor") else "plain value"


class _Matcher:
    def __init__(self, index: Index, cast: bool = False) -> None:
        assert index.infos is not None, "a decoded index has its tensor table as columns"
        self.index = index
        self.cast = cast
        self.infos = index.infos
        self.m = Matching()
        self.memo: dict[int, Any] = {}  # tensor id -> new tensor (tied tensors come back tied)
        self.read_into: dict[int, set[Any]] = {}  # tensor id -> alias keys of targets read into
        self._cpu_dtypes = torch_values.cpu_dtype_table()

    def fresh(self, node: Node, path: KeyPath) -> Any:
        """A new value built from the checkpoint; its tensors are allocated and read later."""

        def leaf(_: KeyPath, n: Node) -> Any:
            e = self.index.tensors[n["id"]]
            value, dest = new_tensor(e.kind, e.dtype, e.shape)
            self.m.reads.append(TensorTarget(e, value, dest, tid=n["id"]))
            return value

        return build(node, leaf, path, self.memo)

    def mismatch(self, path: KeyPath, what: str) -> None:
        key = render_path(path)
        self.m.mismatched.append(key)
        self.m.reasons.append(f"{key}: {what}")

    def value(self, target: Any, node: Node, path: KeyPath, open_: bool, copy_: bool = False) -> Any:
        """What should stand at ``path`` after loading (``target`` itself when restored in place).

        ``open_``: keys the target lacks are materialised from the checkpoint (inside
        Stateful objects other than modules). ``copy_``: containers are shallow-copied
        before they change (inside Stateful objects, whose ``state_dict()`` may hand out
        live internals or one list under two keys, as SequentialLR does with ``_last_lr``).
        """
        if type(target) in torch_values.PLAIN_TENSOR_TYPES:  # the common case, decided first
            return self.tensor(target, node, path, open_)
        t = _kind(node)
        if is_stateful(target):
            if t != "dict":
                self.mismatch(path, f"target is a Stateful {type(target).__name__}, checkpoint holds {t}")
                return target
            new_sd = self.mapping(target.state_dict(), node, path, open_=not _is_module(target), copy_=True)
            self.m.finalizers.append(lambda: target.load_state_dict(new_sd))
            return target
        if values.is_tensor(target):
            return self.tensor(target, node, path, open_)
        if isinstance(target, MutableMapping) and t == "dict":
            return self.mapping(target, node, path, open_, copy_)
        if type(target) is argparse.Namespace and node["t"] == "namespace":  # its attributes, in place
            attrs = self.mapping(vars(target), node, path, open_, copy_)
            return target if attrs is vars(target) else argparse.Namespace(**attrs)
        if isinstance(target, (list, tuple)) and t in ("list", "tuple"):
            if len(target) == len(node["v"]):
                return self.sequence(target, node, path, open_, copy_)
            if open_ or not _holds_state(target):
                return self.fresh(node, path)  # e.g. a history list that grew since
            self.mismatch(path, f"target has {len(target)} items, checkpoint {len(node['v'])}")
            return target
        if open_ or not isinstance(target, (MutableMapping, list, tuple)):
            # a plain target value holds no memory worth keeping: the checkpoint's replaces it
            return self.fresh(node, path)
        self.mismatch(path, f"target is {type(target).__name__}, checkpoint holds {t}")
        return target

    def sequence(self, target: list | tuple, node: Node, path: KeyPath, open_: bool, copy_: bool) -> Any:
        vals = [self.value(x, n, path + (i,), open_, copy_)
                for i, (x, n) in enumerate(zip(target, node["v"]))]
        if isinstance(target, tuple) or node["t"] == "tuple":
            return tuple(vals)
        if copy_:
            return vals
        for i, (old, new) in enumerate(zip(target, vals)):
            if new is not old:
                self.m.assignments.append((target, i, new))
        return target

    def mapping(self, target: MutableMapping, node: Node, path: KeyPath, open_: bool,
                copy_: bool = False) -> MutableMapping:
        out = _copy.copy(target) if copy_ else target
        children = list(dict_items(node))
        ckpt_keys = {k for k, _ in children}
        self.m.missing.extend(render_path(path + (k,)) for k in target.keys() if k not in ckpt_keys)
        for k, child in children:
            if k in target:
                new = self.value(target[k], child, path + (k,), open_, copy_)
                if new is not target[k]:
                    self.m.assignments.append((out, k, new))
            elif open_:
                self.m.assignments.append((out, k, self.fresh(child, path + (k,))))
            else:
                self.m.unexpected.append(render_path(path + (k,)))
        return out

    def tensor(self, target: Any, node: Node, path: KeyPath, open_: bool) -> Any:
        if node["t"] not in ("tensor", "alias"):
            if open_:
                return self.fresh(node, path)
            self.mismatch(path, f"target is a tensor, checkpoint holds {_kind(node)}")
            return target
        i = node["id"]
        want_dtype, want_shape = self._header(i)
        plain = type(target) in torch_values.PLAIN_TENSOR_TYPES
        hit = self._cpu_dtypes.get(target.dtype) if plain else None
        if hit is not None:
            dtype, shape = hit[0], tuple(target.shape)
        else:
            adapter = values.adapter_for(target)
            assert adapter is not None, "a target tensor is a tensor of some kind"
            try:
                dtype = adapter.dtype_name(target)
            except (ValueError, TypeError):  # qint8, numpy strings...: nothing could be read into it
                self.mismatch(path, f"target dtype {target.dtype} cannot hold checkpoint "
                                    f"{want_dtype}{list(want_shape)}")
                return target
            shape = adapter.shape(target)
        cast = dtype != want_dtype and shape == want_shape and self.cast and castable(want_dtype, dtype)
        if shape != want_shape or (dtype != want_dtype and not cast):
            self.mismatch(path, f"target {dtype}{list(shape)}, checkpoint {want_dtype}{list(want_shape)}"
                                f"{_cast_hint(want_dtype, dtype, self.cast) if shape == want_shape else ''}")
            return target
        key = values.alias_key(target)
        done = self.read_into.get(i)
        if done is None:
            self.read_into[i] = {key}
        elif key is not None and key in done:  # a tied target already being read needs no second read
            return target
        else:
            done.add(key)
        self.m.reads.append(TensorTarget(None, target, tid=i, cast=cast))
        return target

    def _header(self, i: int) -> tuple[str, tuple[int, ...]]:
        """Dtype and global shape of tensor ``i``, from the index's columns."""
        info = self.infos[i]
        return info.dtype, info.shape


def castable(stored: str, target: str) -> bool:
    """Whether ``load(..., cast=True)`` converts a stored ``stored`` tensor into a ``target``
    one: both floating point (not packed, such as ``float4_e2m1fn_x2``); never integers,
    booleans or complex numbers, never from one kind to another."""
    return stored in CASTABLE and target in CASTABLE


CASTABLE = frozenset({"float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
                      "float8_e4m3fnuz", "float8_e5m2fnuz"})


def _cast_hint(stored: str, target: str, cast: bool) -> str:
    if castable(stored, target):
        return " (pass cast=True to convert floating-point values to the target's dtype)"
    if cast:
        return " (cast=True converts only between floating-point dtypes)"
    return ""


def match(index: Index, target: MutableMapping[str, Any] | Stateful, cast: bool = False) -> Matching:
    """Matches ``target`` against the checkpoint ``index`` without changing either.

    A Stateful target is matched as it would be inside a mapping: through its
    ``state_dict()``, with a ``load_state_dict`` call among the finalizers. ``cast``: a
    floating-point tensor of another floating-point dtype than the target is read and
    converted (``castable``), not refused.
    """
    if index.tree.get("t") != "dict":
        raise TypeError("the checkpoint's root is not a mapping")
    matcher = _Matcher(index, cast)
    if is_stateful(target):
        matcher.value(target, index.tree, (), open_=False)
    else:
        matcher.mapping(target, index.tree, (), open_=False)
    return matcher.m
