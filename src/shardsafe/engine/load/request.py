"""A load, as one request: built once at the API edge, read by every stage below.

``shardsafe.load`` (and through it the JAX restore and the integrations),
``Checkpointer.load`` and the manager's tiers describe what they want loaded as a
``LoadRequest``; the engine (``load.run.run``) reads the index once, hands the request to
the one placer its target kind names (``load.placers.placer_for``) and drives the reads.
No layer below the edge takes the options as keywords again. ``shardsafe.dcp.Reader``,
whose reads DCP plans, hands its targets to the same reads (``run.read_placement``); the
CLI's ``export`` and ``diff`` read tensors through the same units (``reader``).

The kind of target is decided here, once: ``new`` (``load(path)``: new tensors),
``mapped`` (``mmap=True``), ``jax`` (a pytree of ``jax.Array`` / ``ShapeDtypeStruct``
leaves) or ``in_place`` (a live state). Whether a state is a JAX target is asked only
when this process imported JAX (``values.jax.imported``): a torch load never reaches
JAX code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ... import values
from ...comm import distributed_active, get_comm
from ...format.tree import MAX_DEPTH
from ...plan.flatten import is_stateful
from ...values import jax as jax_values

if TYPE_CHECKING:
    from ...comm import Comm
    from ...format.index.objects import Index

TargetKind = Literal["new", "mapped", "jax", "in_place"]
"""What a load places its bytes into (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What an in-place ``load(path, state, strict=False)`` skipped (all empty when strict)."""

    missing: list[str] = field(default_factory=list)
    """Key paths of ``state`` that the checkpoint does not hold (left unchanged)."""
    unexpected: list[str] = field(default_factory=list)
    """Key paths in the checkpoint that ``state`` has no place for (not loaded)."""
    mismatched: list[str] = field(default_factory=list)
    """Key paths whose shape, dtype or type differs between checkpoint and ``state`` (not loaded)."""
    problems: list[str] = field(default_factory=list)
    """One line per key path skipped, saying why (as ``StateMismatchError.problems``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadRequest:
    """One load: what to load, into what, and how (see ``shardsafe.load`` for each option).

    Attributes:
        path: The checkpoint's directory or fsspec URL.
        state: The target (a mapping, a Stateful object, a JAX pytree), or None for new tensors.
        check: Called with the validated index before any tensor byte is read; raises a
            ``CheckpointError`` to refuse the checkpoint (the manager checks the step).
        strict: Refuse a target whose keys, shapes or dtypes differ (else skip them).
        storage_options: fsspec options for URLs.
        mmap: Map the data files (local checkpoints, no ``state``).
        process_group: The group of a collective load (None: the world).
        comm: The ranks of a collective load, as a ``Comm`` (a ``Checkpointer``'s); None:
            those of ``process_group``.
        collective: None: collective under torch.distributed; False: this rank alone.
        timeout: Seconds a rank waits for the others; an object store's deadline.
        cast: Convert floating-point tensors into the target's dtype.
        target: The kind of target, derived from ``state`` and ``mmap`` (not an argument).

    Raises:
        TypeError: ``state`` is nothing a load can place tensors into.
        ValueError: Options that do not go together (``mmap`` with a state, ``cast``
            without a torch or numpy target).
    """

    path: str
    state: Any = None
    check: Callable[[Index], None] | None = None
    strict: bool = True
    storage_options: dict | None = None
    mmap: bool = False
    process_group: Any = None
    comm: Comm | None = None
    collective: bool | None = None
    timeout: float | None = None
    cast: bool = False
    target: TargetKind = field(init=False)

    def __post_init__(self) -> None:
        kind = target_kind(self.state, self.mmap)
        if self.mmap and self.state is not None:
            raise ValueError("mmap=True applies to load(path) of a local checkpoint, without a state")
        if self.cast and kind in ("new", "mapped", "jax"):
            raise ValueError("cast=True converts into the dtypes of a torch or numpy target state: "
                             + ("a JAX target is restored in the stored dtypes" if kind == "jax"
                                else "load(path) without a state returns the stored dtypes"))
        if kind == "in_place" and not isinstance(self.state, MutableMapping) and not is_stateful(self.state):
            raise TypeError(f"state must be a mutable mapping (dict) or a Stateful object (with "
                            f"state_dict() and load_state_dict()) to load into, got "
                            f"{type(self.state).__name__}")
        object.__setattr__(self, "target", kind)

    def ranks(self) -> Comm:
        """The ranks this load involves (a single process outside torch.distributed)."""
        return self.comm if self.comm is not None else get_comm(self.process_group)

    def is_collective(self) -> bool:
        """Whether every rank of ``ranks()`` takes part (reads the index once for all)."""
        if self.collective is False:
            return False
        return self.comm.world_size > 1 if self.comm is not None else distributed_active(self.process_group)


def target_kind(state: Any, mmap: bool = False) -> TargetKind:
    """The kind of target ``state`` is (see the module docstring)."""
    if state is None:
        return "mapped" if mmap else "new"
    return "jax" if holds_jax(state) else "in_place"


def holds_jax(state: Any) -> bool:
    """Whether ``state`` is a target for a JAX restore: it holds ``jax.Array`` or
    ``jax.ShapeDtypeStruct`` leaves, or is a JAX pytree node shardsafe has no other rule
    for. False at the cost of one lookup when this process never imported JAX."""
    jax = jax_values.imported()
    return jax is not None and _holds(state, (jax.Array, jax.ShapeDtypeStruct), 0)


def _holds(x: Any, types: tuple[type, ...], depth: int) -> bool:
    """Walks containers (not ``jax.tree_util``: it sorts dict keys, which mixed key types
    refuse, and a Stateful object's state is not a JAX target's)."""
    if isinstance(x, types):
        return True
    if depth > MAX_DEPTH or isinstance(x, (str, bytes)) or is_stateful(x):
        return False
    if isinstance(x, Mapping):
        return any(_holds(v, types, depth + 1) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_holds(v, types, depth + 1) for v in x)
    if x is None or isinstance(x, (int, float, complex)) or values.is_tensor(x):
        return False
    node_of = jax_values.children(x)
    return node_of is not None and any(_holds(v, types, depth + 1) for v in node_of[1])


__all__ = ["LoadRequest", "LoadResult", "TargetKind", "holds_jax", "target_kind"]
