"""Markdown tables of a benchmark run: per-case results, machine limits, targets."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

from .limits import LIMIT_LABELS
from .runner import SAVE, CaseResult

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
            "| vs dcp (time ratio) | vs machine limit |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for o in c.ops:
        s = o.samples
        total = s.median("durable")
        gbs = c.nbytes / total / 1e9 if total else None
        rss = s.median("rss")
        if rss is not None and s.median("retained"):
            rss += s.median("retained")  # buffers kept from one save to the next count too
        peer = _peer(c, o)
        vs = peer / total if peer and total else None
        if o.kind == SAVE:
            lim = gbs / limits["direct_write"] if gbs and limits.get("direct_write") else None
            blocked = s.median("stall")
        else:
            key = "direct_read_cold" if "(cold)" in o.label else "memcpy_prefaulted"
            lim = gbs / limits[key] if gbs and limits.get(key) else None
            blocked = None
        rows.append(f"| {o.label} | {_f(blocked)} | {_f(total)} | {_f(gbs, '{:.2f}')} | "
                    f"{_f(rss / MiB if rss is not None else None, '{:.0f}')} | "
                    f"{_f(vs, '{:.2f}x')} | {_f(lim, '{:.0%}')} |")
    rows += ["", "*peak extra RSS*: the peak resident memory during the operation above what "
             "the process held before it, plus (shardsafe saves) the buffers the Checkpointer "
             "keeps between saves (staging copy and sync-save bounce buffers). "
             "*vs dcp*: the DCP operation's time divided by this one's (saves: dcp.save; "
             "loads: dcp.load in place, same cache state); above 1 is faster than DCP. "
             "*vs machine limit*: GB/s over the direct-I/O write (saves), the direct-I/O read "
             "(cold loads) or memcpy (warm loads) measured in this run."]
    return "\n".join(rows)


def _peer(c: CaseResult, o: Any) -> float | None:
    if o.kind == SAVE:
        p = c.op("dcp.save")
    else:
        p = c.op("dcp.load in place (cold)" if "(cold)" in o.label else "dcp.load in place (warm)")
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


def targets(cases: dict[str, CaseResult], limits: dict[str, float],
            training: dict[str, float] | None) -> list[Target]:
    """The performance targets (goal and whether it is met), computed from this run."""
    a, b = cases.get("a"), cases.get("b")
    out: list[Target] = []

    def add(name: str, value: float | None, goal: str, ok: bool | None) -> None:
        out.append(Target(name, value, goal, None if value is None else ok))

    memcpy_s = a.nbytes / limits["memcpy_prefaulted"] / 1e9 if a and limits.get("memcpy_prefaulted") else None
    blk = _m(a, "shardsafe async_save (blocking)", "stall")
    bg = _m(a, "shardsafe async_save (background)", "stall")
    r = _ratio(blk, _m(a, "dcp.async_save", "stall"))
    add("(a) stall, blocking staging / dcp.async_save stall", r, "<= 0.50", r is not None and r <= 0.5)
    r = _ratio(blk, memcpy_s)
    add("(a) stall, blocking staging / memcpy time", r, "<= 1.5", r is not None and r <= 1.5)
    r = _ratio(bg, memcpy_s)
    add("(a) stall, background staging / memcpy time", r, "<= 0.10", r is not None and r <= 0.1)
    r = _ratio(_m(a, "dcp.save", "durable"), _m(a, "shardsafe save", "durable"))
    add("(a) durable sync save speed-up vs dcp.save", r, ">= 2.5x", r is not None and r >= 2.5)
    gbs = _ratio(a.nbytes / 1e9, _m(a, "shardsafe save", "durable")) if a else None
    r = _ratio(gbs, limits.get("direct_write"))
    add("(a) sync save GB/s / direct-I/O write GB/s", r, ">= 0.60", r is not None and r >= 0.6)
    r = _ratio(_m(a, "dcp.load in place (warm)", "durable"), _m(a, "shardsafe load in place (warm)", "durable"))
    add("(a) in-place load (warm) speed-up vs dcp.load", r, ">= 2.5x", r is not None and r >= 2.5)
    gbs = _ratio(a.nbytes / 1e9, _m(a, "shardsafe load in place (cold)", "durable")) if a else None
    r = _ratio(gbs, limits.get("direct_read_cold"))
    add("(a) in-place load (cold) GB/s / direct-I/O read GB/s", r, ">= 0.70", r is not None and r >= 0.7)
    r = _ratio(_m(b, "dcp.save", "durable"), _m(b, "shardsafe save", "durable"))
    add("(b) sync save speed-up vs dcp.save", r, ">= 4x", r is not None and r >= 4)
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
