"""Run the I/O cases: every system saves and loads the same state, repeatedly, interleaved."""

from __future__ import annotations

import gc
import importlib.util
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import shardsafe

from . import systems
from .measure import PeakRSS, Samples, remove, settle, warm_cache
from .states import nbytes, zeros_like

SAVE = "save"
LOAD = "load"
PEERS = ("torch", "dcp", "safetensors", "torch_checkpointing")  # the systems shardsafe is compared with
OPTIONAL_PEERS = {"safetensors": "safetensors", "torch_checkpointing": "torch_checkpointing"}
# Case (e) measures the cost per tensor of the sync save and of the loads, nothing else
PER_TENSOR_SKIP = ("shardsafe async_save (blocking)", "shardsafe async_save (background)",
                   "shardsafe load mmap=True (cold)")


def available_peers(peers: Collection[str] = PEERS) -> tuple[str, ...]:
    """``peers`` without the optional ones that are not installed (safetensors, torch_checkpointing)."""
    return tuple(p for p in peers if p not in OPTIONAL_PEERS or importlib.util.find_spec(OPTIONAL_PEERS[p]))


@dataclass
class OpResult:
    """One operation's samples and what it is."""

    label: str
    kind: str  # SAVE or LOAD
    system: str  # "shardsafe" or one of PEERS
    samples: Samples = field(default_factory=Samples)


@dataclass
class CaseResult:
    """All operations of one case, on a state of ``nbytes`` bytes in ``ntensors`` tensors."""

    name: str
    title: str
    nbytes: int
    ntensors: int
    ops: list[OpResult]

    def op(self, label: str) -> OpResult | None:
        return next((o for o in self.ops if o.label == label), None)


def _save_ops(ckpt: shardsafe.Checkpointer, peers: Collection[str], stager: Any,
              tc: Any) -> list[tuple[OpResult, Any, str]]:
    ops = [
        (OpResult("shardsafe save", SAVE, "shardsafe"), systems.shardsafe_save(ckpt), "ss"),
        (OpResult("shardsafe async_save (blocking)", SAVE, "shardsafe"),
         systems.shardsafe_async(ckpt, "blocking"), "ss"),
        (OpResult("shardsafe async_save (background)", SAVE, "shardsafe"),
         systems.shardsafe_async(ckpt, "background"), "ss"),
        (OpResult("torch.save + fsync", SAVE, "torch"), systems.torch_save, "torch"),
        (OpResult("dcp.save", SAVE, "dcp"), systems.dcp_save, "dcp"),
        (OpResult("dcp.async_save", SAVE, "dcp"), systems.dcp_async_save, "dcp"),
        (OpResult("dcp.async_save + shardsafe Writer, Stager", SAVE, "dcp"),
         systems.dcp_async_save_stager(stager), "ssdcp"),
        (OpResult("safetensors save_file + fsync", SAVE, "safetensors"), systems.safetensors_save, "st"),
    ]
    if tc is not None:
        ops += [(OpResult("torch_checkpointing save", SAVE, "torch_checkpointing"), tc.save, "tc"),
                (OpResult("torch_checkpointing async save", SAVE, "torch_checkpointing"), tc.async_save, "tc")]
    return [op for op in ops if op[0].system == "shardsafe" or op[0].system in peers]


def _load_ops(state: dict[str, Any], system_drop: bool, peers: Collection[str],
              tc: Any) -> list[tuple[OpResult, Any, str, bool]]:
    ss_target = zeros_like(state)
    dcp_target = zeros_like(state) if "dcp" in peers else None
    out = []
    for cold in (True, False):
        c = "cold" if cold else "warm"
        out += [
            (OpResult(f"shardsafe load in place ({c})", LOAD, "shardsafe"),
             systems.shardsafe_load_in_place(ss_target, cold, system_drop), "ss", cold),
            (OpResult(f"shardsafe load new ({c})", LOAD, "shardsafe"),
             systems.shardsafe_load_new(cold, system_drop), "ss", cold),
            (OpResult(f"torch.load weights_only ({c})", LOAD, "torch"),
             systems.torch_load(cold, system_drop), "torch", cold),
            (OpResult(f"safetensors load_file + copy ({c})", LOAD, "safetensors"),
             systems.safetensors_load(cold, system_drop), "st", cold),
        ]
        if dcp_target is not None:
            out.append((OpResult(f"dcp.load in place ({c})", LOAD, "dcp"),
                        systems.dcp_load_in_place(dcp_target, cold, system_drop), "dcp", cold))
        if tc is not None:
            out.append((OpResult(f"torch_checkpointing load in place ({c})", LOAD, "torch_checkpointing"),
                        tc.load_in_place(zeros_like(state), cold, system_drop), "tc", cold))
    out.append((OpResult("shardsafe load mmap=True (cold)", LOAD, "shardsafe"),
                systems.shardsafe_load_new(True, system_drop, mmap=True), "ss", True))
    return [op for op in out if op[0].system == "shardsafe" or op[0].system in peers]


def run_io_case(name: str, title: str, state: dict[str, Any], directory: str, repeat: int, *,
                system_drop: bool = False, warmup: bool = True, log: Any = None,
                peers: Collection[str] = PEERS, skip: Collection[str] = ()) -> CaseResult:
    """Saves and loads ``state`` with shardsafe and every system of ``peers`` ``repeat``
    times (after a warm-up round), leaving out the operations labelled in ``skip``."""
    peers = available_peers(peers)
    ckpt = shardsafe.Checkpointer()
    stager = systems.dcp_stager() if "dcp" in peers else None
    tc = systems.TorchCheckpointing() if "torch_checkpointing" in peers else None
    if tc is not None and log:
        log(f"  note: {systems.TORCH_CHECKPOINTING_NOTE}")
    saves = [op for op in _save_ops(ckpt, peers, stager, tc) if op[0].label not in skip]
    loads = [op for op in _load_ops(state, system_drop, peers, tc) if op[0].label not in skip]
    try:
        for r in range(-1 if warmup else 0, repeat):  # round -1 warms up (allocations, imports)
            latest: dict[str, str] = {}
            for i, (res, op, fmt) in enumerate(saves):
                path = os.path.join(directory, f"{name}-{fmt}-{i}-{r}")
                gc.collect()
                settle()
                rss = PeakRSS()
                with rss.track():
                    m = op(state, path)
                if r >= 0:
                    res.samples.add(**m, rss=rss.extra)
                if fmt in latest:
                    remove(latest[fmt])
                latest[fmt] = path
                if log:
                    log(f"  {name} round {r}: {res.label}: " + ", ".join(f"{k} {v:.3f}s" for k, v in m.items()))
            for res, op, fmt, cold in loads:
                if not cold:
                    warm_cache(latest[fmt])
                gc.collect()
                settle()
                rss = PeakRSS()
                with rss.track():
                    m = op(state, latest[fmt])
                if r >= 0:
                    res.samples.add(**m, rss=rss.extra)
                if log:
                    log(f"  {name} round {r}: {res.label}: {m['durable']:.3f}s")
            for p in latest.values():
                remove(p)
    finally:
        ckpt.close()
        if stager is not None:
            stager.close()
        if tc is not None:
            tc.close()
    return CaseResult(name, title, nbytes(state), len(state), [o for o, *_ in saves + loads])
