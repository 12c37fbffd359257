"""Markdown tables of a benchmark run: per-case results, machine limits, targets."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

from .limits import LIMIT_LABELS
from .runner import LOAD, SAVE, CaseResult
from .systems import TORCH_CHECKPOINTING_NOTE

MiB = 1 << 20
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"  # the section write_doc fills by default


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def case_table(c: CaseResult, limits: dict[str, float]) -> str:
    rows = [f"### Case {c.name}: {c.title}",
            "",
            f"{c.ntensors} tensors, {c.nbytes / MiB:.0f} MiB. Medians; seconds.",
            "",
            "| operation | caller blocked (s) | durable / done (s) | GB/s | peak extra RSS (MiB) "
            "| vs dcp (time ratio) | vs torch (time ratio) | vs machine limit |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for o in c.ops:
        s = o.samples
        total = s.median("durable")
        gbs = c.nbytes / total / 1e9 if total else None
        rss = s.median("rss")
        if rss is not None and s.median("retained"):
            rss += s.median("retained")  # buffers kept from one save to the next count too
        vs = _ratio(_peer(c, o, "dcp"), total)
        vs_torch = _ratio(_peer(c, o, "torch"), total)
        if o.kind == SAVE:
            lim = gbs / limits["direct_write"] if gbs and limits.get("direct_write") else None
            blocked = s.median("stall")
        else:
            key = "direct_read_cold" if "(cold)" in o.label else "memcpy_prefaulted"
            lim = gbs / limits[key] if gbs and limits.get(key) else None
            blocked = None
        rows.append(f"| {o.label} | {_f(blocked)} | {_f(total)} | {_f(gbs, '{:.2f}')} | "
                    f"{_f(rss / MiB if rss is not None else None, '{:.0f}')} | "
                    f"{_f(vs, '{:.2f}x')} | {_f(vs_torch, '{:.2f}x')} | {_f(lim, '{:.0%}')} |")
    rows += ["", "*peak extra RSS*: the peak resident memory during the operation above what "
             "the process held before it, plus (shardsafe saves) the buffers the Checkpointer "
             "keeps between saves (staging copy and sync-save bounce buffers). "
             "*vs dcp* / *vs torch*: the peer's time divided by this one's (saves: dcp.save / "
             "torch.save + fsync; loads: dcp.load in place / torch.load weights_only, same cache "
             "state); above 1 is faster than the peer. "
             "*vs machine limit*: GB/s over the direct-I/O write (saves), the direct-I/O read "
             "(cold loads) or memcpy (warm loads) measured in this run."]
    if any(o.system == "torch_checkpointing" for o in c.ops):
        rows += ["", f"*torch_checkpointing* (Meta's torch-checkpointing): {TORCH_CHECKPOINTING_NOTE}; "
                 "its async save returns at once, stages in a background thread (training must "
                 "not change the state until then: its lock()) and writes from a separate process; "
                 "*caller blocked* is until save() returns, the time until staged is in the JSON."]
    return "\n".join(rows)


_PEER_OPS = {("dcp", SAVE): "dcp.save", ("dcp", LOAD): "dcp.load in place",
             ("torch", SAVE): "torch.save + fsync", ("torch", LOAD): "torch.load weights_only",
             ("safetensors", SAVE): "safetensors save_file + fsync",
             ("safetensors", LOAD): "safetensors load_file + copy"}


def _peer_label(peer: str, kind: str, cold: bool) -> str:
    label = _PEER_OPS[(peer, kind)]
    return label if kind == SAVE else f"{label} ({'cold' if cold else 'warm'})"


def _peer(c: CaseResult, o: Any, peer: str) -> float | None:
    """The time of ``peer``'s operation comparable with ``o`` (same kind and cache state)."""
    p = c.op(_peer_label(peer, o.kind, "(cold)" in o.label))
    return p.samples.median("durable") if p else None


def limits_table(limits: dict[str, float], nbytes: int) -> str:
    rows = [f"### Machine limits ({nbytes / MiB:.0f} MiB, same run)", "",
            "| limit | GB/s | seconds |", "|---|---:|---:|"]
    for k, label in LIMIT_LABELS.items():
        if k in limits:
            rows.append(f"| {label} | {limits[k]:.2f} | {nbytes / limits[k] / 1e9:.3f} |")
    return "\n".join(rows)


@dataclass
class Target:
    name: str
    value: float | None
    goal: str
    ok: bool | None


def _m(c: CaseResult | None, label: str, key: str) -> float | None:
    if c is None or c.op(label) is None:
        return None
    return c.op(label).samples.median(key)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _durable(c: CaseResult | None, label: str) -> float | None:
    return _m(c, label, "durable")


def _speedup(c: CaseResult | None, peer: str, mine: str) -> float | None:
    """How many times faster shardsafe's ``mine`` is than ``peer``'s (time ratio)."""
    return _ratio(_durable(c, peer), _durable(c, mine))


def _targets_a(a: CaseResult, limits: dict[str, float], add: Any) -> None:
    memcpy_s = a.nbytes / limits["memcpy_prefaulted"] / 1e9 if limits.get("memcpy_prefaulted") else None
    blk = _m(a, "shardsafe async_save (blocking)", "stall")
    bg = _m(a, "shardsafe async_save (background)", "stall")
    r = _ratio(blk, _m(a, "dcp.async_save", "stall"))
    add("(a) stall, blocking staging / dcp.async_save stall", r, "<= 0.50", r is not None and r <= 0.5)
    r = _ratio(blk, memcpy_s)
    add("(a) stall, blocking staging / memcpy time", r, "<= 1.5", r is not None and r <= 1.5)
    r = _ratio(bg, memcpy_s)
    add("(a) stall, background staging / memcpy time", r, "<= 0.10", r is not None and r <= 0.1)
    r = _speedup(a, "dcp.save", "shardsafe save")
    add("(a) durable sync save speed-up vs dcp.save", r, ">= 2x", r is not None and r >= 2)
    gbs = _ratio(a.nbytes / 1e9, _durable(a, "shardsafe save"))
    r = _ratio(gbs, limits.get("direct_write"))
    add("(a) sync save GB/s / direct-I/O write GB/s", r, ">= 0.85", r is not None and r >= 0.85)
    r = _speedup(a, "dcp.load in place (warm)", "shardsafe load in place (warm)")
    add("(a) in-place load (warm) speed-up vs dcp.load", r, ">= 2.5x", r is not None and r >= 2.5)
    r = _speedup(a, "dcp.load in place (cold)", "shardsafe load in place (cold)")
    add("(a) in-place load (cold) speed-up vs dcp.load", r, ">= 1.5x", r is not None and r >= 1.5)
    gbs = _ratio(a.nbytes / 1e9, _durable(a, "shardsafe load in place (cold)"))
    r = _ratio(gbs, limits.get("direct_read_cold"))
    add("(a) in-place load (cold) GB/s / direct-I/O read GB/s", r, ">= 0.70", r is not None and r >= 0.7)


def _targets_new_loads(c: CaseResult | None, goal: float, add: Any) -> None:
    """Loads into new tensors against torch.load and safetensors, warm and cold."""
    for cache in ("warm", "cold"):
        mine = f"shardsafe load new ({cache})"
        r = _speedup(c, f"torch.load weights_only ({cache})", mine)
        add(f"({c.name}) load new ({cache}) speed-up vs torch.load", r, f">= {goal}x",
            r is not None and r >= goal)
        r = _speedup(c, f"safetensors load_file + copy ({cache})", mine)
        add(f"({c.name}) load new ({cache}) speed-up vs safetensors load_file + copy", r, ">= 1.0x",
            r is not None and r >= 1.0)


def _per_tensor(c: CaseResult, label: str) -> float | None:
    t = _durable(c, label)
    return t / c.ntensors * 1e6 if t is not None and c.ntensors else None


def _targets_e(e: CaseResult, add: Any) -> None:
    """Case (e): microseconds per tensor, and the speed-ups they imply over torch."""
    us = _per_tensor(e, "shardsafe save")
    add("(e) sync save, microseconds per tensor", us, "<= 15", us is not None and us <= 15)
    r = _speedup(e, "torch.save + fsync", "shardsafe save")
    add("(e) sync save speed-up vs torch.save + fsync", r, ">= 2x", r is not None and r >= 2)
    for cache in ("warm", "cold"):
        us = _per_tensor(e, f"shardsafe load new ({cache})")
        add(f"(e) load new ({cache}), microseconds per tensor", us, "<= 15", us is not None and us <= 15)
        r = _speedup(e, f"torch.load weights_only ({cache})", f"shardsafe load new ({cache})")
        add(f"(e) load new ({cache}) speed-up vs torch.load", r, ">= 4x", r is not None and r >= 4)
    us = _per_tensor(e, "shardsafe load in place (warm)")
    add("(e) load in place (warm), microseconds per tensor", us, "<= 15", us is not None and us <= 15)


def targets(cases: dict[str, CaseResult], limits: dict[str, float],
            training: dict[str, float] | None) -> list[Target]:
    """The performance targets (goal and whether it is met), computed from this run."""
    a, b, e = cases.get("a"), cases.get("b"), cases.get("e")
    out: list[Target] = []

    def add(name: str, value: float | None, goal: str, ok: bool | None) -> None:
        out.append(Target(name, value, goal, None if value is None else ok))

    if a is not None:  # the targets of the cases that ran
        _targets_a(a, limits, add)
        _targets_new_loads(a, 1.2, add)
    if b is not None:
        r = _speedup(b, "dcp.save", "shardsafe save")
        add("(b) sync save speed-up vs dcp.save", r, ">= 4x", r is not None and r >= 4)
        r = _speedup(b, "torch.save + fsync", "shardsafe save")
        add("(b) sync save speed-up vs torch.save + fsync", r, ">= 1.5x", r is not None and r >= 1.5)
        _targets_new_loads(b, 1.5, add)
    if e is not None:
        _targets_e(e, add)
    if training:
        for k, v in training.items():
            if k != "none":
                add(f"(c) training throughput with {k} / without checkpoints", v, ">= 0.97", v >= 0.97)
    return out


def targets_table(ts: list[Target]) -> str:
    rows = ["### Targets, from this run", "", "| target | measured | goal | met |",
            "|---|---:|---:|:---:|"]
    for t in ts:
        met = "–" if t.ok is None else ("yes" if t.ok else "**no**")
        rows.append(f"| {t.name} | {_f(t.value, '{:.2f}')} | {t.goal} | {met} |")
    return "\n".join(rows)


def training_table(rates: dict[str, list[float]], state_bytes: int, desc: str) -> tuple[str, dict[str, float]]:
    import statistics

    med = {k: statistics.median(v) for k, v in rates.items() if v}
    base = med.get("none")
    ratios = {k: v / base for k, v in med.items()} if base else {}
    rows = [f"### Case c: training loop ({desc}; state {state_bytes / MiB:.0f} MiB)", "",
            "| variant | steps/s (median) | vs no checkpointing |", "|---|---:|---:|"]
    for k, v in med.items():
        rows.append(f"| {k} | {v:.2f} | {ratios.get(k, 0):.1%} |")
    return "\n".join(rows), ratios


def machine_line(directory: str) -> str:
    return (f"{platform.node() or 'host'}: {os.cpu_count()} CPUs, {platform.machine()}, "
            f"Linux {platform.release()}, Python {platform.python_version()}; bench dir {directory}")


def write_doc(path: str, body: str, section: str = "bench") -> None:
    """Replaces ``section`` of the Markdown file ``path`` with ``body``: the text between
    ``<!-- SECTION:begin -->`` and ``<!-- SECTION:end -->``, appended when the file has no
    such section (or written as a new file)."""
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    block = f"{begin}\n{body}\n{end}"
    if os.path.exists(path):
        text = open(path, encoding="utf-8").read()
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            text = head + block + tail
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        text = "# Benchmarks\n\n" + block + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
