"""Case (d): async saves under a host-memory budget (``max_staging_bytes``).

The state of case (a) is saved with ``staging="blocking"`` under budgets of 1/8, 1/4 and
1/2 of the state and without one, interleaved in each round. What a budget trades: the
call returns once the part that does not fit has been *written* (so the stall grows
towards the write time of ``state - budget``), while the extra host memory falls from a
copy of the state to the budget.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import shardsafe

from ..engine.save.units import UNIT_SIZE
from .measure import PeakRSS, remove, settle
from .states import nbytes

MiB = 1 << 20
FRACTIONS: tuple[float | None, ...] = (1 / 8, 1 / 4, 1 / 2, None)
"""Budgets as fractions of the state; None: no budget (a copy of the whole state)."""


@dataclass
class BudgetRow:
    """Samples of one budget: seconds of stall and to durable, bytes of extra peak RSS."""

    label: str
    budget: int | None
    stall: list[float] = field(default_factory=list)
    durable: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)


def unit_for(total: int) -> int:
    """The staging unit: the default, or smaller so that 1/8 of a small state holds one."""
    return max(4096, min(UNIT_SIZE, total // 8 // 4096 * 4096))


def run_budget_case(state: dict[str, Any], directory: str, repeat: int, *, warmup: bool = True,
                    log: Any = None) -> tuple[int, list[BudgetRow]]:
    """Saves ``state`` under each budget ``repeat`` times; returns its size and the rows."""
    total = nbytes(state)
    unit = unit_for(total)
    rows = [BudgetRow("unlimited" if f is None else f"1/{round(1 / f)} of the state",
                      None if f is None else max(unit, int(total * f) // unit * unit))
            for f in FRACTIONS]
    # one Checkpointer per budget, kept across rounds as in a training job (the warm-up
    # round allocates the buffers); RSS counts the buffers it keeps between saves too
    savers = [shardsafe.Checkpointer(unit_size=unit, max_staging_bytes=row.budget) for row in rows]
    try:
        for r in range(-1 if warmup else 0, repeat):
            for row, ckpt in zip(rows, savers):
                path = os.path.join(directory, f"d-{r}-{row.label[:3]}")
                gc.collect()
                settle()
                rss = PeakRSS()
                with rss.track():
                    t = time.perf_counter()
                    h = ckpt.async_save(state, path)
                    stall = time.perf_counter() - t
                    h.result()
                    durable = time.perf_counter() - t
                if r >= 0:
                    row.stall.append(stall)
                    row.durable.append(durable)
                    if rss.extra is not None:
                        row.rss.append(rss.extra + ckpt.retained_bytes)
                if log:
                    log(f"  d round {r}: {row.label}: stall {stall:.3f}s, durable {durable:.3f}s")
                remove(path)
    finally:
        for ckpt in savers:
            ckpt.close()
    return total, rows


def budget_table(total: int, rows: list[BudgetRow], limits: dict[str, float]) -> str:
    """The markdown table of case (d)."""
    med = statistics.median
    base = next((med(r.stall) for r in rows if r.budget is None and r.stall), None)
    wr = limits.get("direct_write")
    out = [f"### Case d: async_save (blocking) of {total / MiB:.0f} MiB under max_staging_bytes", "",
           "Medians of saves after a warm-up save (buffers already allocated); seconds. "
           "*write time of the rest*: (state - budget) at the direct-I/O write + fsync speed "
           "of this run, for reference: the caller waits for those writes (not their fsync). *peak extra RSS*: peak resident "
           "memory during the save above what the process held before it, plus the buffers "
           "the Checkpointer keeps between saves.", "",
           "| budget | MiB | caller blocked (s) | vs unlimited | write time of the rest (s) "
           "| durable (s) | peak extra RSS (MiB) | RSS / budget |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if not r.stall:
            continue
        stall, rss = med(r.stall), med(r.rss) if r.rss else None
        rest = (total - r.budget) / wr / 1e9 if wr and r.budget is not None else None
        mib = "–" if r.budget is None else f"{r.budget / MiB:.4g}"
        out.append(f"| {r.label} | {mib} | {stall:.3f} | "
                   f"{'–' if not base else f'{stall / base:.1f}x'} | "
                   f"{'–' if rest is None else f'{rest:.3f}'} | {med(r.durable):.3f} | "
                   f"{'–' if rss is None else f'{rss / MiB:.0f}'} | "
                   f"{'–' if rss is None or r.budget is None else f'{rss / r.budget:.2f}'} |")
    return "\n".join(out)
