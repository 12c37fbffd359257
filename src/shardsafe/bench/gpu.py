"""``python -m shardsafe.bench.gpu``: checkpointing a state that lives on a GPU, in one run
against ``dcp.async_save`` (DCP's pinned, cached staging) and ``torch.save``.

A state of ``--size`` bytes (8 GiB by default: half bf16, half fp32, in 256 MiB tensors)
lives on the GPU. Measured in one run, in this order (a phase that would start after
``--deadline`` seconds is skipped and says so):

1. the device-to-host copy limits: ``Tensor.copy_`` into page-locked and into pageable
   host memory;
2. saves, interleaved, after a warm-up round of each: shardsafe's ``async_save``
   (blocking staging into its reused, page-locked buffers) and ``dcp.async_save``: how
   long the training thread is blocked, staging GB/s, time to durable;
3. a matmul-heavy training step (which also updates the saved state in place, as an
   optimizer does) with no save, and while each system's background save writes;
4. ``torch.save`` of the same state (+ fsync);
5. loading back onto the GPU in place: ``shardsafe.load`` against ``dcp.load``.

The results, with the device name and driver, go to ``--out`` (``gpu-bench.json``, raw
samples, rewritten after every phase; ``gpu-bench.md``, the tables) and to stdout; the
targets are checked and printed. ``--dry-run`` runs every phase on tiny CPU tensors (no
GPU needed, nothing it prints is a measurement), so that this code runs in the default
test suite before it ever runs on a GPU. Without a GPU and without ``--dry-run`` it says
so and measures nothing. ``scripts/gpu-check`` runs it on a lent GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import shardsafe

from ..format.checksum import HARDWARE
from . import gpu_phases as ph
from . import parse_size
from .gpu_report import BASELINE, DCP, DCP_LOAD, SHARDSAFE, SHARDSAFE_LOAD, TORCH, gpu_markdown, targets_met
from .measure import remove
from .report import write_doc
from .systems import torch_save

JSON_NAME, MD_NAME = "gpu-bench.json", "gpu-bench.md"
NO_GPU = "no GPU is present (torch sees no CUDA device): nothing measured"
DRY = dict(size=4 << 20, tensor_size=1 << 20, rounds=1, steps=3, dim=64, matmuls=2)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for gpu-bench.json and gpu-bench.md")
    p.add_argument("--size", type=parse_size, default=parse_size("8GiB"), help="state size (default 8GiB)")
    p.add_argument("--tensor-size", type=parse_size, default=parse_size("256MiB"),
                   help="bytes per tensor (default 256MiB)")
    p.add_argument("--rounds", type=int, default=2, help="recorded rounds of each save and load (medians)")
    p.add_argument("--steps", type=int, default=40, help="training steps with no save, before and after")
    p.add_argument("--dim", type=int, default=8192, help="training step: square bf16 matrices of this size")
    p.add_argument("--matmuls", type=int, default=8, help="training step: matrix products per step")
    p.add_argument("--dir", default=None, help="directory for the checkpoints (default: a temporary one)")
    p.add_argument("--deadline", type=float, default=270.0,
                   help="seconds after which the phases not yet started are skipped (default 270)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny CPU tensors, one round: runs the code without a GPU (not a measurement)")
    p.add_argument("--check-targets", action="store_true", help="exit 3 when a target is missed or unmeasured")
    p.add_argument("--write-doc", metavar="PATH", help="also write the tables into this Markdown file's "
                   "'gpu' section (<!-- gpu:begin --> ... <!-- gpu:end -->)")


class Run:
    """One benchmark run: its raw results, rewritten to ``--out`` after every phase."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args, self.device = args, device
        self.started = time.monotonic()
        self.raw: dict[str, Any] = {"env": environment(device), "config": {}, "limits": {}, "saves": {},
                                    "training": {}, "loads": {}, "skipped": []}

    def log(self, msg: str) -> None:
        print(f"[gpu-bench {time.monotonic() - self.started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def phase(self, name: str, fn: Callable[[], None]) -> None:
        """Runs ``fn`` unless the deadline has passed; records the results either way."""
        if time.monotonic() - self.started > self.args.deadline:
            self.raw["skipped"].append(f"{name} (past the --deadline of {self.args.deadline:.0f} s)")
            self.log(f"skipped {name}: past the deadline")
        else:
            self.log(f"{name} ...")
            fn()
        self.dump()

    def dump(self) -> None:
        with open(os.path.join(self.args.out, JSON_NAME), "w", encoding="utf-8") as f:
            json.dump(self.raw, f, indent=1)

    def add(self, section: str, system: str, **metrics: float) -> None:
        got = self.raw[section].setdefault(system, {})
        for k, v in metrics.items():
            got.setdefault(k, []).append(v)


def environment(device: torch.device) -> dict[str, Any]:
    """Where the run happens: device name, driver, torch and CUDA versions, host."""
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "host": platform.node(), "cpus": os.cpu_count(),
                           "shardsafe": shardsafe.__version__, "crc32c_hardware": HARDWARE}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(device=p.name, capability=f"{p.major}.{p.minor}", memory_gib=p.total_memory / (1 << 30),
                   driver=ph.driver_version())
    else:
        env["device"] = "cpu (dry run)"
    return env


def _fit_size(run: Run, directory: str) -> int:
    """``--size``, shrunk (and noted) when the checkpoint directory cannot hold three copies."""
    size, free = run.args.size, ph.free_bytes(directory)
    if 3 * size > free:
        fitted = max(run.args.tensor_size * 2, free // 3 // run.args.tensor_size * run.args.tensor_size)
        run.raw["skipped"].append(f"--size {size >> 20} MiB (only {free >> 20} MiB free in {directory}: "
                                  f"{fitted >> 20} MiB measured)")
        size = fitted
    return size


def _saves(run: Run, systems: ph.Systems, state: dict[str, torch.Tensor], directory: str,
           keep: dict[str, str]) -> None:
    """Warm-up, then ``--rounds`` interleaved rounds of both background saves; the last
    round's checkpoints are kept for the loads."""
    for r in range(run.args.rounds + 1):
        for system in (SHARDSAFE, DCP):
            path = os.path.join(directory, f"{system.split('.')[0]}-{r}")
            got = ph.timed_save(systems, system, state, path)
            run.log(f"  {system} round {r}{' (warm-up)' if not r else ''}: blocked {got['stall']:.3f} s, "
                    f"durable {got['durable']:.3f} s")
            if r:
                run.add("saves", system, **got)
            remove(keep.get(system, ""))
            keep[system] = path


def _training(run: Run, systems: ph.Systems, state: dict[str, torch.Tensor], directory: str) -> None:
    """Step times with no save (before and after), and while each background save writes."""
    trainer = ph.MatmulSteps(run.device, run.args.dim, run.args.matmuls, state)
    trainer.run(3)  # warm-up: kernels chosen, memory allocated
    base = trainer.run(run.args.steps)
    for system in (SHARDSAFE, DCP):
        path = os.path.join(directory, f"train-{system.split('.')[0]}")
        times, got = ph.save_while_training(systems, system, state, path, trainer, cap=100_000)
        run.raw["training"][system] = times
        run.log(f"  {system}: {len(times)} steps while it wrote; blocked {got['stall']:.3f} s, "
                f"durable {got['durable']:.3f} s")
        remove(path)
    base += trainer.run(run.args.steps)
    run.raw["training"][BASELINE] = base


def _torch_save(run: Run, state: dict[str, torch.Tensor], directory: str) -> None:
    path = os.path.join(directory, "torch.pt")
    got = torch_save(state, path)
    run.add("saves", TORCH, stall=got["stall"], durable=got["durable"])
    remove(path)


def _loads(run: Run, state: dict[str, torch.Tensor], keep: dict[str, str]) -> None:
    """In-place loads of the kept checkpoints onto the device: a warm-up, then rounds."""
    for r in range(run.args.rounds + 1):
        for system, label in ((SHARDSAFE, SHARDSAFE_LOAD), (DCP, DCP_LOAD)):
            if system not in keep:
                continue
            t = ph.timed_load(system, state, keep[system])
            run.log(f"  {label} round {r}: {t:.3f} s")
            if r:
                run.raw["loads"].setdefault(label, []).append(t)


def measure_all(run: Run, directory: str) -> None:
    """Every phase, in the order of the module docstring."""
    args, raw = run.args, run.raw
    size = _fit_size(run, directory)
    state = ph.make_state(size, run.device, args.tensor_size)
    raw["config"] = {"nbytes": ph.state_bytes(state), "tensors": len(state), "rounds": args.rounds,
                     "device": str(run.device), "dry_run": args.dry_run, "steps": args.steps,
                     "dim": args.dim, "matmuls": args.matmuls}
    systems = ph.Systems(shardsafe.Checkpointer(), ph.dcp_stager(run.device))
    keep: dict[str, str] = {}
    try:
        run.phase("device-to-host copy limits", lambda: raw["limits"].update(ph.copy_limits(state, 3)))
        run.phase("saves", lambda: _saves(run, systems, state, directory, keep))
        run.phase("training while saving", lambda: _training(run, systems, state, directory))
        run.phase("torch.save", lambda: _torch_save(run, state, directory))
        run.phase("loads", lambda: _loads(run, state, keep))
    finally:
        systems.close()
        for path in keep.values():
            remove(path)


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark that ``args`` describe; prints the tables. Returns the exit status."""
    if args.dry_run:
        for k, v in DRY.items():
            setattr(args, k, v)
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        print(f"shardsafe.bench.gpu: {NO_GPU}")
        return 0
    if not HARDWARE and not args.dry_run:
        print("shardsafe.bench.gpu: the 'crc32c' package is missing (checksums would take hours); "
              "carry its wheel (docs/development.md, 'GPU check')", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    own_dir = args.dir is None
    directory = tempfile.mkdtemp(prefix="shardsafe-gpu-bench-") if own_dir else args.dir
    os.makedirs(directory, exist_ok=True)
    bench = Run(args, device)
    try:
        measure_all(bench, directory)
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
        bench.dump()
    command = "python -m shardsafe.bench.gpu " + " ".join(getattr(args, "argv", []))
    body = gpu_markdown(bench.raw, command.strip())
    with open(os.path.join(args.out, MD_NAME), "w", encoding="utf-8") as f:
        f.write(body + "\n")
    if args.write_doc:
        write_doc(args.write_doc, body, section="gpu")
    print(body)
    return 3 if args.check_targets and not targets_met(bench.raw) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shardsafe.bench.gpu``."""
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.gpu", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.argv = argv
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
