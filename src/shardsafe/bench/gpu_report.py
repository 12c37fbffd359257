"""The GPU benchmark's arithmetic and report: medians, ratios, targets and Markdown.

Pure functions of the raw results that ``bench.gpu`` collects (a JSON-able dict), so the
targets and the tables are tested on machines without a GPU. The raw results hold, per
system, the samples of each metric in seconds (``saves``: ``stall`` = time the training
thread was blocked, ``durable`` = until committed and on disk; ``training``: the step
times of the training loop with no save and while each system's background save wrote;
``loads``: loading back onto the device in place), and ``limits``: the device-to-host
copy rates (GB/s) measured in the same run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .measure import median
from .report import Target, targets_table

GiB = 1 << 30
SHARDSAFE = "shardsafe async_save"
DCP = "dcp.async_save"
TORCH = "torch.save"
BASELINE = "no save"
SHARDSAFE_LOAD = "shardsafe.load in place"
DCP_LOAD = "dcp.load in place"
PINNED = "pinned"
PAGEABLE = "pageable"

BLOCKED_GOAL = 0.5  # shardsafe's blocked time over dcp.async_save's, at most
D2H_GOAL = 0.8  # shardsafe's staging GB/s over the pinned copy_ limit, at least
OVERHEAD_GOAL = 0.05  # slower training steps while shardsafe's background save writes, at most

SYSTEM_LABELS = {SHARDSAFE: "shardsafe async_save (blocking staging, reused pinned buffers)",
                 DCP: "dcp.async_save (DCP's pinned, cached staging)",
                 TORCH: "torch.save + fsync"}



def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``; None when either is unknown or ``b`` is zero."""
    return a / b if a is not None and b else None


def _metric(raw: Mapping[str, Any], section: str, system: str, key: str | None = None) -> float | None:
    got = raw.get(section, {}).get(system)
    if isinstance(got, Mapping):
        got = got.get(key or "", None)
    return median(got)


def summarize(raw: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per system: median blocked and durable seconds, staging GB/s (state bytes over the
    time until the device state was copied into host memory, its device-to-host rate;
    the blocked time where a run recorded no copied time), step-time overhead while its background save wrote (a
    fraction: 0.05 is 5% slower steps than with no save), and load seconds and GB/s."""
    nbytes = raw.get("config", {}).get("nbytes", 0)
    base = median(raw.get("training", {}).get(BASELINE))
    out: dict[str, dict[str, float | None]] = {}
    for system in (SHARDSAFE, DCP, TORCH):
        stall = _metric(raw, "saves", system, "stall")
        copied = _metric(raw, "saves", system, "copied")
        during = median(raw.get("training", {}).get(system))
        out[system] = {"blocked_s": stall, "durable_s": _metric(raw, "saves", system, "durable"),
                       "staging_gbs": ratio(nbytes / 1e9, stall if copied is None else copied),
                       "step_overhead": None if during is None or not base else during / base - 1}
    for system in (SHARDSAFE_LOAD, DCP_LOAD):
        t = median(raw.get("loads", {}).get(system))
        out[system] = {"load_s": t, "load_gbs": ratio(nbytes / 1e9, t)}
    return out


def gpu_targets(raw: Mapping[str, Any]) -> list[Target]:
    """The GPU targets, from one run: blocked time against dcp.async_save's, staging
    GB/s against the pinned copy limit, training-step overhead of a background save."""
    s = summarize(raw)
    pinned = median(raw.get("limits", {}).get(PINNED))
    out = []

    def add(name: str, value: float | None, goal: str, ok: bool) -> None:
        out.append(Target(name, value, goal, None if value is None else ok))

    r = ratio(s[SHARDSAFE]["blocked_s"], s[DCP]["blocked_s"])
    add("blocked: shardsafe async_save / dcp.async_save (pinned, cached)", r, f"<= {BLOCKED_GOAL:.2f}",
        r is not None and r <= BLOCKED_GOAL)
    r = ratio(s[SHARDSAFE]["staging_gbs"], pinned)
    add("device-to-host: shardsafe staging GB/s / pinned copy_ GB/s", r, f">= {D2H_GOAL:.2f}",
        r is not None and r >= D2H_GOAL)
    r = s[SHARDSAFE]["step_overhead"]
    add("training step time while shardsafe's save writes: overhead", r, f"<= {OVERHEAD_GOAL:.2f}",
        r is not None and r <= OVERHEAD_GOAL)
    return out


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def _size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / (1 << 20):.1f} MiB"


def _env_line(env: Mapping[str, Any]) -> str:
    device = env.get("device", "?")
    if env.get("driver"):
        device += f", driver {env['driver']}"
    if env.get("capability"):
        device += f", compute capability {env['capability']}, {env.get('memory_gib', 0):.0f} GiB"
    return (f"Device: {device}; torch {env.get('torch', '?')} (CUDA {env.get('cuda') or 'none'}), "
            f"Python {env.get('python', '?')}, {env.get('cpus', '?')} CPUs; "
            f"crc32c {'hardware' if env.get('crc32c_hardware') else 'SOFTWARE (slow)'}")


def _saves_table(raw: Mapping[str, Any], s: Mapping[str, Mapping[str, float | None]]) -> list[str]:
    base = median(raw.get("training", {}).get(BASELINE))
    rows = ["| system | blocked (s) | staging GB/s | durable (s) | training step while it writes |",
            "|---|---:|---:|---:|---:|"]
    for system in (SHARDSAFE, DCP, TORCH):
        m = s[system]
        ov = m["step_overhead"]
        step = "–" if ov is None else f"{ov:+.1%}"
        rows.append(f"| {SYSTEM_LABELS[system]} | {_f(m['blocked_s'])} | {_f(m['staging_gbs'], '{:.1f}')} | "
                    f"{_f(m['durable_s'])} | {step} |")
    rows += ["", f"Training step with no save: {_f(base and base * 1e3, '{:.1f}')} ms (median). "
             "*blocked*: how long the call held the training thread; *staging GB/s*: state bytes "
             "over the time until they were copied off the GPU; torch.save blocks until durable and is not run in the background."]
    return rows


def gpu_markdown(raw: Mapping[str, Any], command: str) -> str:
    """The run as Markdown: where and what, the targets, saves, loads and the limits."""
    cfg, env = raw.get("config", {}), raw.get("env", {})
    s = summarize(raw)
    limits = raw.get("limits", {})
    dry = " **Dry run on the CPU: not a measurement.**" if cfg.get("dry_run") else ""
    lines = [f"Command: `{command}`  ", _env_line(env) + "  ",
             f"State: {_size(cfg.get('nbytes', 0))} on {cfg.get('device', '?')} "
             f"({cfg.get('tensors', 0)} tensors, half bf16 and half fp32 by bytes); "
             f"medians of {cfg.get('rounds', 0)} round(s) after a warm-up.{dry}", "",
             targets_table(gpu_targets(raw)), "", "#### Saves", ""]
    lines += _saves_table(raw, s)
    lines += ["", "#### Loading back onto the device, in place (files in the page cache)", "",
              "| system | seconds | GB/s |", "|---|---:|---:|"]
    for system in (SHARDSAFE_LOAD, DCP_LOAD):
        lines.append(f"| {system} | {_f(s[system]['load_s'])} | {_f(s[system]['load_gbs'], '{:.1f}')} |")
    r = ratio(s[DCP_LOAD]["load_s"], s[SHARDSAFE_LOAD]["load_s"])
    lines += ["", f"shardsafe's load is {_f(r, '{:.2f}')}x as fast as dcp.load.", "",
              "#### Device-to-host copy limits (same run)", "", "| copy_ into | GB/s |", "|---|---:|"]
    for kind in (PINNED, PAGEABLE):
        lines.append(f"| {kind} host memory | {_f(median(limits.get(kind)), '{:.1f}')} |")
    skipped = raw.get("skipped") or []
    if skipped:
        lines += ["", "Not measured: " + "; ".join(skipped) + "."]
    return "\n".join(lines)


def targets_met(raw: Mapping[str, Any]) -> bool:
    """True when every target was measured and met."""
    return all(t.ok for t in gpu_targets(raw))
