"""``shardsafe bench``: shardsafe against torch.save and DCP, on the same state, in one run.

Cases: (a) large fp32 tensors (default 2 GiB in 64 MiB tensors), (b) 20,000 small
tensors of 1-64 KiB, (c) a small transformer trained on the CPU with an async save every
10 steps vs none, (d) case (a)'s state saved async within host-memory budgets of 1/8,
1/4 and 1/2 of it vs none, (e) 100,000 tiny tensors of 16 floats (the cost per tensor
of a sync save and of loads, against torch and safetensors: DCP takes minutes there); ``compression``:
shardsafe's codecs against zstd on raw bytes and ZipNN on the same tensors
(``bench.compression``); ``pipeline``: a sync save against the direct-I/O write limit,
compressed saves and loads on /dev/shm, and saves and loads through a throttled S3 link
(``bench.pipeline``). The machine's limits (memcpy,
direct-I/O write/read, buffered write)
are measured in the same run, and results are reported as ratios, which stay meaningful
on shared machines where absolute times drift. Medians of ``--repeat`` rounds, after an
unrecorded warm-up round.

Run ``python -m shardsafe.bench --help`` (or ``shardsafe bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
              "g": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """``"2GiB"``, ``"512M"``, ``"1048576"`` -> bytes."""
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    if unit not in SIZE_UNITS or not num:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (use e.g. 2GiB, 512MiB)")
    return int(float(num) * SIZE_UNITS[unit])


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds the benchmark's options to ``p`` (shared by the CLI and ``python -m``)."""
    p.add_argument("--size", type=parse_size, default=parse_size("2GiB"),
                   help="case (a) state size (default 2GiB)")
    p.add_argument("--tensor-size", type=parse_size, default=parse_size("64MiB"),
                   help="case (a) tensor size (default 64MiB)")
    p.add_argument("--small-count", type=int, default=20000, help="case (b) tensor count")
    p.add_argument("--tiny-count", type=int, default=100000, help="case (e) tensor count")
    p.add_argument("--cases", default="a,b,c,d,e",
                   help="comma-separated subset of a,b,c,d,e,compression,pipeline")
    p.add_argument("--compression-size", type=parse_size, default=parse_size("128MiB"),
                   help="case compression: bytes of each tensor (default 128MiB; the end-to-end "
                        "state holds 1.5x this)")
    p.add_argument("--bandwidth", type=parse_size, default=100_000_000,
                   help="case compression: bytes/s of the throttled link to the S3 server "
                        "(default 100000000, i.e. 100 MB/s)")
    p.add_argument("--pipeline-shm-size", type=parse_size, default=parse_size("512MiB"),
                   help="case pipeline: bf16 bytes saved compressed to /dev/shm (default 512MiB)")
    p.add_argument("--pipeline-store-size", type=parse_size, default=parse_size("128MiB"),
                   help="case pipeline: bf16 bytes saved to the throttled S3 server (default 128MiB)")
    p.add_argument("--pipeline-bandwidth", type=parse_size, default=300_000_000,
                   help="case pipeline: bytes/s of the throttled link (default 300000000)")
    p.add_argument("--dir", default=None, help="directory for checkpoints (default: a temp dir)")
    p.add_argument("--repeat", type=int, default=3, help="recorded rounds per case (medians)")
    p.add_argument("--steps", type=int, default=60, help="case (c) training steps per variant")
    p.add_argument("--every", type=int, default=10, help="case (c) save every N steps")
    p.add_argument("--train-threads", type=int, default=0,
                   help="case (c) torch intra-op threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round (a smoke test)")
    p.add_argument("--drop-caches", action="store_true",
                   help="also write /proc/sys/vm/drop_caches for cold loads (root only)")
    p.add_argument("--write-doc", metavar="PATH", help="write the tables into this markdown file")
    p.add_argument("--json", metavar="PATH", help="write raw samples as JSON")
    p.add_argument("--progress", action="store_true", help="log each measurement to stderr")


def _cases(args: argparse.Namespace) -> list[str]:
    """The cases to run (``--quick`` also shrinks every size to a smoke test)."""
    if args.quick:
        args.size, args.tensor_size, args.small_count, args.tiny_count = 4 << 20, 1 << 20, 100, 200
        args.repeat, args.steps, args.every = 1, 4, 2
        args.compression_size = 1 << 20
        args.pipeline_shm_size, args.pipeline_store_size = 4 << 20, 1 << 20
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not set(cases) <= {"a", "b", "c", "d", "e", "compression", "pipeline", "load"}:
        raise ValueError(f"--cases takes a subset of a,b,c,d,e,compression,pipeline,load, got {args.cases!r}")
    return cases


def _io_cases(args: argparse.Namespace, cases: list[str], directory: str,
              log: Callable[[str], None] | None) -> tuple[dict[str, Any], dict[str, float]]:
    """Cases (a), (b) and (e), with the machine limits measured in the same run."""
    from . import limits, runner, states

    results: dict[str, runner.CaseResult] = {}
    lim: dict[str, float] = {}
    if {"a", "b", "d"} & set(cases):
        lim = limits.measure_limits(args.size, directory, max(1, args.repeat))
    opts = dict(system_drop=args.drop_caches, warmup=not args.quick, log=log)
    if "a" in cases:
        st = states.large_tensors(args.size, args.tensor_size)
        results["a"] = runner.run_io_case(
            "a", f"{args.size / (1 << 20):.0f} MiB fp32 in {args.tensor_size >> 20} MiB tensors",
            st, directory, args.repeat, **opts)
        del st
    if "b" in cases:
        st = states.small_tensors(args.small_count)
        results["b"] = runner.run_io_case("b", f"{args.small_count} small tensors (1-64 KiB)", st,
                                          directory, args.repeat, **opts)
        del st
    if "e" in cases:
        st = states.tiny_tensors(args.tiny_count)
        results["e"] = runner.run_io_case("e", f"{args.tiny_count} tiny tensors (16 fp32 each)", st,
                                          directory, args.repeat, peers=("torch", "safetensors"),
                                          skip=runner.PER_TENSOR_SKIP, **opts)
        del st
    return results, lim


def _budget_case(args: argparse.Namespace, directory: str, lim: dict[str, float],
                 log: Callable[[str], None] | None) -> tuple[str, dict[str, Any]]:
    """Case (d): its table and the raw samples."""
    from . import budget, states

    st = states.large_tensors(args.size, args.tensor_size)
    total, rows = budget.run_budget_case(st, directory, args.repeat, warmup=not args.quick, log=log)
    del st
    raw = {r.label: {"budget": r.budget, "stall": r.stall, "durable": r.durable, "rss": r.rss}
           for r in rows}
    return budget.budget_table(total, rows, lim), raw


def _training_case(args: argparse.Namespace, directory: str) -> tuple[str, dict[str, float], Any]:
    """Case (c): its table, the throughput ratios and the raw rates."""
    import torch

    from . import report, training

    size = training.QUICK if args.quick else training.ModelSize()
    if args.train_threads:
        torch.set_num_threads(args.train_threads)
    rates, sbytes = training.run_training(directory, size, args.steps, args.every, args.repeat,
                                          warmup_steps=0 if args.quick else 2)
    desc = (f"d_model {size.d_model}, {size.layers} layers, seq {size.seq}, batch {size.batch}, "
            f"{args.steps} steps, save every {args.every}, {torch.get_num_threads()} torch threads")
    table, ratios = report.training_table(rates, sbytes, desc)
    return table, ratios, rates


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark described by parsed ``args``; prints the markdown report."""
    from . import report

    cases = _cases(args)
    own_dir = args.dir is None
    directory = tempfile.mkdtemp(prefix="shardsafe-bench-") if own_dir else args.dir
    os.makedirs(directory, exist_ok=True)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.progress else None
    started = time.time()
    train_ratios = None
    more_targets: list[report.Target] = []
    raw: dict[str, object] = {}
    try:
        results, lim = _io_cases(args, cases, directory, log)
        if {"a", "b", "d"} & set(cases):
            raw["limits"] = lim
        sections = [report.case_table(c, lim) for c in results.values()]
        raw.update({c.name: {o.label: o.samples.values for o in c.ops} for c in results.values()})
        if "d" in cases:
            table, raw["d"] = _budget_case(args, directory, lim, log)
            sections.append(table)
        if "c" in cases:
            table, train_ratios, raw["c"] = _training_case(args, directory)
            sections.append(table)
        if "compression" in cases:
            from . import compression, compression_e2e

            table, more_targets, raw["compression"] = compression.section(
                args.compression_size, args.repeat, log)
            sections.append(table)
            table, raw["compression_e2e"] = compression_e2e.section(
                args.compression_size // 2, args.repeat, directory, args.bandwidth, log)
            sections.append(table)
        if "pipeline" in cases:
            from . import pipeline

            table, targets, raw["pipeline"] = pipeline.section(
                directory, args.size, args.pipeline_shm_size, args.pipeline_store_size,
                args.pipeline_bandwidth, args.repeat, log)
            more_targets += targets
            sections.append(table)
        if "load" in cases:
            from . import load

            table, targets, raw["load"] = load.section(directory, args.size, args.pipeline_shm_size,
                                                       args.small_count, args.repeat, log)
            more_targets += targets
            sections.append(table)
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
    cmd = "shardsafe bench " + " ".join(getattr(args, "argv", []) or [])
    body = "\n\n".join([
        f"Command: `{cmd.strip()}`  ",
        f"Machine: {report.machine_line(directory)}  ",
        f"Run: {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}, "
        f"{time.time() - started:.0f} s, medians of {args.repeat} round(s)"
        + (" (--quick: tiny sizes, no warm-up; not a measurement)." if args.quick else " after a warm-up round."),
        report.targets_table(report.targets(results, lim, train_ratios) + more_targets),
        *sections,
        report.limits_table(lim, args.size) if lim else "",
    ]).rstrip()
    print(body)
    if args.write_doc:
        report.write_doc(args.write_doc, body)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shardsafe.bench``."""
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.argv = argv
    return run(args)
