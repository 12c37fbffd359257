"""The placer of a JAX target: each array restored onto its target's sharding.

``shardsafe.load(path, target)`` comes here when ``target`` holds ``jax.Array`` or
``jax.ShapeDtypeStruct`` leaves (or is a JAX pytree node such as a registered
dataclass). JAX arrays are immutable, so the restore builds new arrays and returns the
restored pytree, as Orbax's ``restore(path, target)`` does; mutable containers of the
target (dicts, lists) also get the new values in place, so a ``CheckpointManager``
restores a dict of JAX values like any other state.

For every array, ``plan`` lists the distinct boxes its target sharding puts on this
process's devices (a replicated box once) as reads into host arrays; the load's
``run`` hands them to the chunk reader, which reads only the byte ranges of those boxes (and
verifies the checksum blocks they touch), whatever the layout the checkpoint was saved
with. ``finish`` then puts each box on its devices and assembles the arrays
(``jax.make_array_from_single_device_arrays``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .... import values
from ....format.index.objects import Index
from ....format.tree import KeyPath, Node, build, dict_items, render_path
from ....values import jax as jax_values
from ....values.numpy import dtype_name
from ...buffers import new_tensor
from ..match import TensorTarget
from ..request import LoadRequest
from . import Placement, named_as_target, region_bytes, skipped, target_regions
from .new import any_cold

if TYPE_CHECKING:
    from ..index_exchange import IndexRead

Build = Callable[[], Any]


@dataclass(slots=True)
class BoxRead:
    """One host array to fill from tensor ``tid``: the box at ``offsets`` (None: the whole)."""

    tid: int
    host: Any
    offsets: tuple[int, ...] | None


@dataclass(slots=True)
class JaxRestore:
    """What a restore into a JAX target reads, and how it builds the result.

    Attributes:
        reads: Host arrays to fill, each a box of a checkpoint tensor.
        problems: Missing, unexpected and mismatched key paths (as ``load`` reports them).
        build: Builds the restored pytree once the reads are done.
    """

    reads: list[BoxRead] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    build: Build = lambda: None

    def finish(self) -> Any:
        """The restored pytree (call after every read succeeded)."""
        return self.build()


def plan(index: Index, target: Any, huge: bool = False) -> JaxRestore:
    """Matches ``target`` against ``index`` and plans the reads; changes nothing yet."""
    p = _Planner(index, huge)
    build_root = p.value(target, index.tree, ())
    p.out.build = build_root
    return p.out


class _Planner:
    def __init__(self, index: Index, huge: bool = False) -> None:
        self.huge = huge  # host boxes on huge pages: their bytes come with direct I/O
        self.index = index
        self.out = JaxRestore()
        self.memo: dict[int, Any] = {}

    def header(self, i: int) -> tuple[str, str, tuple[int, ...]]:
        """Kind, dtype and global shape of tensor ``i``."""
        infos = self.index.infos
        if infos is not None:
            return infos[i].kind, infos[i].dtype, infos[i].shape
        e = self.index.tensors[i]
        return e.kind, e.dtype, e.shape

    def problem(self, kind: str, path: KeyPath, what: str = "") -> None:
        label = {"missing": "missing in checkpoint", "unexpected": "unexpected in checkpoint (absent from target)",
                 "mismatch": "mismatch"}[kind]
        self.out.problems.append(f"{label}: {render_path(path)}{': ' + what if what else ''}")

    def value(self, target: Any, node: Node, path: KeyPath) -> Build:
        """How to build what stands at ``path`` after the restore."""
        if jax_values.is_array(target) or jax_values.is_abstract(target):
            return self.array(target, node, path)
        t = node["t"]
        if values.is_tensor(target):
            if t not in ("tensor", "alias"):
                self.problem("mismatch", path, f"target is an array, checkpoint holds {t}")
                return lambda: target
            return self.fresh(node, path)
        if isinstance(target, Mapping):
            if t != "dict":
                self.problem("mismatch", path, f"target is a mapping, checkpoint holds {t}")
                return lambda: target
            return self.mapping(target, node, path)
        if isinstance(target, (list, tuple)):
            if t not in ("list", "tuple") or len(node["v"]) != len(target):
                self.problem("mismatch", path, f"target is a {type(target).__name__} of {len(target)}, "
                                               f"checkpoint holds {t}")
                return lambda: target
            return self.sequence(target, node, path)
        node_of = jax_values.children(target)
        if node_of is not None:
            if t != "dict":
                self.problem("mismatch", path, f"target is a {type(target).__name__}, checkpoint holds {t}")
                return lambda: target
            keys, vals, treedef = node_of
            children = self.keyed(dict(zip(keys, vals)), node, path)
            return lambda: treedef.unflatten([children[k]() for k in keys])
        return self.fresh(node, path)  # a plain value: the checkpoint's replaces it

    def keyed(self, target: Mapping[Any, Any], node: Node, path: KeyPath) -> dict[Any, Build]:
        """A builder per key of ``target`` (the target's own value where the checkpoint has none)."""
        out: dict[Any, Build] = {}
        for k, child in dict_items(node):
            if k in target:
                out[k] = self.value(target[k], child, path + (k,))
            else:
                self.problem("unexpected", path + (k,))
        for k, v in target.items():
            if k not in out:
                self.problem("missing", path + (k,))
                out[k] = lambda v=v: v
        return out

    def mapping(self, target: Mapping[Any, Any], node: Node, path: KeyPath) -> Build:
        children = self.keyed(target, node, path)

        def done() -> Any:
            if isinstance(target, MutableMapping):  # in place: a manager's state dict
                for k, b in children.items():
                    target[k] = b()
                return target
            return type(target)({k: b() for k, b in children.items()})

        return done

    def sequence(self, target: list[Any] | tuple[Any, ...], node: Node, path: KeyPath) -> Build:
        children = [self.value(x, n, path + (i,)) for i, (x, n) in enumerate(zip(target, node["v"]))]

        def done() -> Any:
            vals = [b() for b in children]
            if isinstance(target, list):
                target[:] = vals
                return target
            make = getattr(type(target), "_make", None)  # a NamedTuple
            return make(vals) if make is not None else tuple(vals)

        return done

    def fresh(self, node: Node, path: KeyPath) -> Build:
        """The checkpoint's own value at ``path``; its arrays are read whole onto the host."""

        def leaf(_: KeyPath, n: Node) -> Any:
            kind, dtype, shape = self.header(n["id"])
            host, _dest = new_tensor(kind, dtype, shape, huge=self.huge)
            self.out.reads.append(BoxRead(n["id"], host, None))
            return host

        value = build(node, leaf, path, self.memo)
        return lambda: value

    def array(self, target: Any, node: Node, path: KeyPath) -> Build:
        """A ``jax.Array`` (or ``ShapeDtypeStruct``) target: the boxes of its sharding."""
        if node["t"] not in ("tensor", "alias"):
            self.problem("mismatch", path, f"target is a jax.Array, checkpoint holds {node['t']}")
            return lambda: target
        tid = node["id"]
        kind, dtype, shape = self.header(tid)
        want = dtype_name(target.dtype, f"target at key path {render_path(path)!r}")
        if tuple(target.shape) != shape or want != dtype:
            self.problem("mismatch", path, f"target {want}{list(target.shape)}, checkpoint {dtype}{list(shape)}")
            return lambda: target
        sharding = getattr(target, "sharding", None)
        jax = jax_values.imported()
        if sharding is None or getattr(target, "committed", True) is False:
            # no sharding, or an uncommitted array (``jnp.asarray``): an uncommitted array on
            # the default device, which a jitted step may move where its other inputs are
            host, _dest = new_tensor("jax", dtype, shape, huge=self.huge)
            self.out.reads.append(BoxRead(tid, host, None))
            return lambda: jax.device_put(host, may_alias=True)
        boxes: dict[tuple[tuple[int, ...], tuple[int, ...]], Any] = {}
        placed = []
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            b = jax_values.box(index, shape)
            if b not in boxes:
                host, _dest = new_tensor("jax", dtype, b[1], huge=self.huge)
                whole = b[1] == shape
                self.out.reads.append(BoxRead(tid, host, None if whole else b[0]))
                boxes[b] = host
            placed.append((device, b))

        def done() -> Any:
            # the host boxes are this restore's own: a device may use one as its buffer
            arrays = [jax.device_put(boxes[b], d, may_alias=True) for d, b in placed]
            return jax.make_array_from_single_device_arrays(shape, sharding, arrays)

        return done


class JaxArrays:
    """Restores into ``request.state``, a JAX pytree (see the module docstring)."""

    def __init__(self, request: LoadRequest) -> None:
        self.request = request
        self._restore: JaxRestore | None = None

    def place(self, read: IndexRead) -> Placement:
        r = self.request
        index = named_as_target(read.index, r.state)  # names nested one way, flat the other
        restore = plan(index, r.state, huge=any_cold(read))
        skipped(r.path, restore.problems, r.strict)
        self._restore = restore
        targets = [TensorTarget(None, b.host, offsets=b.offsets, tid=b.tid) for b in restore.reads]
        regions = target_regions(targets, index)
        return Placement(read.narrow(regions), targets, nbytes=region_bytes(index, regions))

    def finish(self) -> Any:
        assert self._restore is not None, "finish() follows place()"
        return self._restore.finish()


__all__ = ["BoxRead", "JaxArrays", "JaxRestore", "plan"]
