"""Bit-exact comparison of training states, and a fingerprint to compare across processes.

Both work on live states (Stateful objects are replaced by their ``state_dict()``) and
on the nested dicts ``shardsafe.load(path)`` returns, so a live run and a checkpoint
of it compare equal exactly when every tensor has the same dtype, shape and bytes and
every plain value is equal (NaN equals NaN: the bits are what counts).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

_MAX_REPORTED = 20


def _is_stateful(x: Any) -> bool:
    return (not isinstance(x, (Mapping, list, tuple, torch.Tensor, np.ndarray))
            and callable(getattr(x, "state_dict", None)))


def _raw(t: torch.Tensor | np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """dtype name, shape and row-major bytes of a tensor or array."""
    if isinstance(t, np.ndarray):
        return str(t.dtype), tuple(t.shape), np.ascontiguousarray(t).tobytes()
    c = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    return str(c.dtype).removeprefix("torch."), tuple(c.shape), \
        c.reshape(-1).view(torch.uint8).numpy().tobytes()


def _path(path: tuple[Any, ...]) -> str:
    return ".".join(map(str, path)) or "<root>"


def _feed(h: Any, x: Any) -> None:
    if _is_stateful(x):
        x = x.state_dict()
    if isinstance(x, (torch.Tensor, np.ndarray)):
        dtype, shape, data = _raw(x)
        h.update(f"T{dtype}{shape}{len(data)}:".encode())
        h.update(data)
    elif isinstance(x, Mapping):
        h.update(f"D{len(x)}:".encode())
        for k, v in x.items():
            h.update(f"{type(k).__name__}{k!r}=".encode())
            _feed(h, v)
    elif isinstance(x, (list, tuple)):
        h.update(f"{type(x).__name__}{len(x)}:".encode())
        for v in x:
            _feed(h, v)
    else:
        h.update(f"{type(x).__name__}{x!r};".encode())


def fingerprint(state: Any) -> str:
    """SHA-256 (hex) of a state's structure, dtypes, shapes, tensor bytes and plain values."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


def snapshot(state: Any) -> Any:
    """A frozen copy of a live state: Stateful objects as their ``state_dict()``, tensors cloned.

    Needed to keep a live run's final state while the process goes on: ``RNGState``
    reads the process-global generators, so a live state compared later would compare
    whatever the generators hold by then.
    """
    if _is_stateful(state):
        state = state.state_dict()
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, np.ndarray):
        return state.copy()
    if isinstance(state, Mapping):
        return {k: snapshot(v) for k, v in state.items()}
    if isinstance(state, list):
        return [snapshot(v) for v in state]
    if isinstance(state, tuple):
        return tuple(snapshot(v) for v in state)
    return state


def _is_plain(x: Any) -> bool:
    return x is None or isinstance(x, (bool, int, float, str, bytes))


def _same_plain(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _tensor_diff(a: Any, b: Any) -> str | None:
    (da, sa, ba), (db, sb, bb) = _raw(a), _raw(b)
    if (da, sa) != (db, sb):
        return f"{da}{list(sa)} vs {db}{list(sb)}"
    if ba == bb:
        return None
    if isinstance(a, torch.Tensor) and a.is_floating_point():
        diff = (a.detach().double() - b.detach().double()).abs().max().item()
        return f"values differ (max abs difference {diff:.3g})"
    return "values differ"


def differences(a: Any, b: Any, path: tuple[Any, ...] = ()) -> list[str]:
    """Every key path where ``a`` and ``b`` differ (bit for bit), one line each."""
    if _is_stateful(a):
        a = a.state_dict()
    if _is_stateful(b):
        b = b.state_dict()
    here = _path(path)
    if isinstance(a, (torch.Tensor, np.ndarray)) or isinstance(b, (torch.Tensor, np.ndarray)):
        if type(a) is not type(b):
            return [f"{here}: {type(a).__name__} vs {type(b).__name__}"]
        d = _tensor_diff(a, b)
        return [] if d is None else [f"{here}: {d}"]
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = [f"{_path(path + (k,))}: only in the first state" for k in a if k not in b]
        out += [f"{_path(path + (k,))}: only in the second state" for k in b if k not in a]
        for k in a:
            if k in b:
                out += differences(a[k], b[k], path + (k,))
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return [f"{here}: {type(a).__name__} of {len(a)} vs {type(b).__name__} of {len(b)}"]
        if len(a) > 8 and all(_is_plain(x) for x in (*a, *b)):  # e.g. an RNG state: one line
            n = sum(not _same_plain(x, y) for x, y in zip(a, b))
            return [f"{here}: {n} of {len(a)} values differ"] if n else []
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, path + (i,))]
    if _same_plain(a, b):
        return []
    return [f"{here}: {a!r} vs {b!r}"]


def summarize(diffs: list[str], limit: int = _MAX_REPORTED) -> list[str]:
    """The first ``limit`` differences, plus a line counting the rest."""
    if len(diffs) <= limit:
        return list(diffs)
    return diffs[:limit] + [f"... and {len(diffs) - limit} more"]
