"""``shardsafe demo --nproc N``: the crash-and-resume demo on N ranks (FSDP2, gloo, CPU).

Four jobs of N processes each run one after another, as ``torchrun`` would start them
(``python -m shardsafe.demo.distributed`` with RANK/WORLD_SIZE/MASTER_* set):

1. *reference*: trains all steps uninterrupted and saves its final state (collectively).
2. *crashed*: trains with a ``CheckpointManager`` on every rank; once rank 0 reports the
   planned step, every rank gets SIGKILL (a lost node takes the whole job down).
3. *preempted*: a new job resumes from the newest committed step; at the planned step
   every rank gets SIGTERM, as a scheduler sends it. The signals land at different
   steps on different ranks; the managers agree on one step, save it and exit 0.
4. *resumed*: a new job resumes from exactly that step, trains to the end and saves.

The final states, loaded here without any process group (full tensors), must be
bit-identical: FSDP2-sharded parameters and AdamW state, the LR schedule, and each
rank's own data-loader position and dropout RNG (``shardsafe.PerRank``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import shardsafe

from ..harness.processes import start_ranks
from ..harness.compare import differences, fingerprint, summarize
from .events import WorkerLog
from .plan import Interruptions, plan_interruptions
from .process import DemoError
from .report import continued, labelled
from .run import DemoOptions, Verdict, in_demo_directory
from .train import TrainConfig


BATCH_SIZE = 32  # per rank


def job_config(steps: int, seed: int, nproc: int) -> TrainConfig:
    """The distributed demo job (every rank of every run uses the same values)."""
    return TrainConfig(steps=steps, seed=seed, nproc=nproc, batch_size=BATCH_SIZE)


# ----------------------------------------------------------------------------- one rank


def build_state(cfg: TrainConfig, rank: int, world: int) -> dict[str, Any]:
    """The complete training state of one rank (step 0)."""
    import numpy as np
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchdata.stateful_dataloader import StatefulDataLoader

    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.samples, cfg.features, generator=g)
    y = (x @ torch.randn(cfg.features, cfg.classes, generator=g)).argmax(dim=1)
    data = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed)
    # the loader's own generator takes its per-iterator seed draw, which would otherwise
    # come from (and shift) the global RNG that drives dropout
    loader = StatefulDataLoader(data, batch_size=cfg.batch_size, sampler=sampler,
                                generator=torch.Generator().manual_seed(cfg.seed + 2 + rank))

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = nn.Sequential(
        nn.Linear(cfg.features, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden, cfg.classes))
    mesh = init_device_mesh("cpu", (world,))
    for i in (0, 3, 6):
        fully_shard(model[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warmup = max(1, cfg.steps // 10)
    sched = torch.optim.lr_scheduler.LinearLR(optim, start_factor=0.1, total_iters=warmup)
    # each rank its own generators (dropout masks differ from rank to rank)
    random.seed(cfg.seed + 1 + rank)
    np.random.seed(cfg.seed + 1 + rank)
    torch.manual_seed(cfg.seed + 1 + rank)
    return {"app": shardsafe.ModelOptimizerState(model, optim), "sched": sched,
            "loader": shardsafe.PerRank(loader), "rng": shardsafe.PerRank(shardsafe.RNGState()),
            "epoch": 0, "step": 0}


class RankTrainer:
    """Trains one rank; the loop only sees ``state`` and a per-step hook."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self._batches: Any = None

    def _next_batch(self) -> Any:
        loader = self.state["loader"].value
        if self._batches is None:
            loader.sampler.set_epoch(self.state["epoch"])
            self._batches = iter(loader)
        try:
            return next(self._batches)
        except StopIteration:  # epoch over: the next one shuffles differently
            self.state["epoch"] += 1
            loader.sampler.set_epoch(self.state["epoch"])
            self._batches = iter(loader)
            return next(self._batches)

    def step(self) -> None:
        import torch.nn.functional as F

        s = self.state
        x, y = self._next_batch()
        model, optim = s["app"].model, s["app"].optimizers[0]
        model.train()
        loss = F.cross_entropy(model(x), y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        s["sched"].step()
        s["step"] += 1


def _emit(rank: int, event: str, **fields: Any) -> None:
    if rank == 0:
        print(json.dumps({"event": event, **fields}), flush=True)


def worker(argv: Sequence[str] | None = None) -> int:
    """One rank of a demo job (``python -m shardsafe.demo.distributed [options]``)."""
    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser(prog="python -m shardsafe.demo.distributed")
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--every", type=int, default=0, help="checkpoint interval (0: none)")
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sync", action="store_true")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--final", help="save the final state here (collectively)")
    p.add_argument("--forget-rng", action="store_true")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    trainer = RankTrainer(build_state(job_config(args.steps, args.seed, world), rank, world))
    mgr = shardsafe.CheckpointManager(args.dir, save_interval_steps=args.every or None,
                                      max_to_keep=args.keep, async_save=not args.sync,
                                      preemption_signals=(signal.SIGTERM,) if args.every else ())
    with mgr:
        resumed_from = mgr.restore(trainer.state) if args.resume else None
        if args.forget_rng:
            torch.manual_seed(12345)
        _emit(rank, "start", step=trainer.state["step"], resumed_from=resumed_from, pid=os.getpid())
        while trainer.state["step"] < args.steps:
            trainer.step()
            step = trainer.state["step"]
            _emit(rank, "step", step=step)
            if not args.every:
                continue
            start = time.perf_counter()
            if mgr.save(step, trainer.state):
                _emit(rank, "save", step=step, stall_s=time.perf_counter() - start,
                      reason="preemption" if mgr.reached_preemption(step) else "schedule")
            if mgr.reached_preemption(step):
                t = time.perf_counter()
                mgr.wait_until_finished()  # every rank: the step is committed
                _emit(rank, "preempted", step=step, wait_s=time.perf_counter() - t)
                break
    if args.final and trainer.state["step"] == args.steps:
        shardsafe.save(trainer.state, args.final)
        _emit(rank, "done", step=trainer.state["step"], fingerprint="")
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ----------------------------------------------------------------------------- orchestration


def run_job(name: str, nproc: int, args: list[str], *, timeout_s: float,
            signal_at: tuple[int, signal.Signals] | None = None) -> WorkerLog:
    """Runs one job of ``nproc`` ranks, following rank 0's events; once rank 0 reports step
    ``signal_at[0]``, sends ``signal_at[1]`` to every rank (SIGKILL: a lost job; SIGTERM: a
    preemption notice, after which every rank must save and exit 0).

    Raises:
        DemoError: a rank failed, the job timed out, or it ended before the signal.
    """
    log = WorkerLog(name)
    start = time.perf_counter()
    errs = [tempfile.TemporaryFile(mode="w+") for _ in range(nproc)]
    procs = start_ranks(["-m", "shardsafe.demo.distributed", *args], nproc, text=True,
                        per_rank=lambda r: {"stdout": subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                                            "stderr": errs[r]})

    def signal_all(sig: signal.Signals) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    watchdog = threading.Timer(timeout_s, signal_all, (signal.SIGKILL,))
    watchdog.start()
    try:
        for line in procs[0].stdout:  # type: ignore[union-attr]
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            log.handle(ev)
            if signal_at is not None and log.signal_sent_at is None and \
                    ev.get("event") == "step" and log.last_step >= signal_at[0]:
                signal_all(signal_at[1])
                log.signal_sent_at = log.last_step
        codes = [p.wait() for p in procs]
    finally:
        watchdog.cancel()
        signal_all(signal.SIGKILL)
        for p in procs:
            p.wait()
    log.returncode = codes[0]
    log.wall_s = time.perf_counter() - start
    stderr = _stderr_tails(errs)
    _check_job(log, codes, stderr, signal_at, timed_out=log.wall_s >= timeout_s)
    return log


def _stderr_tails(errs: list[Any]) -> list[str]:
    """The end of each rank's stderr (the files are closed)."""
    out = []
    for r, f in enumerate(errs):
        f.seek(0)
        out.append(f"--- rank {r}\n{f.read()[-2000:]}")
        f.close()
    return out


def _check_job(log: WorkerLog, codes: list[int], stderr: list[str],
               signal_at: tuple[int, signal.Signals] | None, *, timed_out: bool) -> None:
    """Raises ``DemoError`` unless the job ended as planned (see ``run_job``)."""
    name = log.name
    sig = None if signal_at is None else signal_at[1]
    if sig == signal.SIGKILL and log.signal_sent_at is not None and \
            all(c == -signal.SIGKILL for c in codes):
        return
    if any(codes):
        why = "timed out" if timed_out else f"exited with {codes}"
        raise DemoError(f"the {name} job {why}:\n" + "\n".join(stderr))
    if signal_at is not None and (log.signal_sent_at is None or sig == signal.SIGKILL):
        raise DemoError(f"the {name} job ended before {signal_at[1].name} at step {signal_at[0]}")
    if sig == signal.SIGTERM and log.preempted_step is None:
        raise DemoError(f"the {name} job got SIGTERM but saved no preemption checkpoint:\n"
                        + "\n".join(stderr))


@dataclass(slots=True)
class DistResult(Verdict):
    """What the distributed demo report shows."""

    options: DemoOptions
    config: TrainConfig
    plan: Interruptions
    reference: WorkerLog
    crashed: WorkerLog
    preempted: WorkerLog
    resumed: WorkerLog
    differences: list[str]
    fingerprint: str

    @property
    def problems(self) -> list[str]:
        """Ways the preemption failed its promise (resume from exactly the saved step)."""
        pre, res = self.preempted, self.resumed
        if res.resumed_from != pre.preempted_step:
            return [f"the preempted job saved step {pre.preempted_step}, but the next job "
                    f"resumed from step {res.resumed_from}"]
        return []


def _run_in(directory: str, opts: DemoOptions) -> DistResult:
    plan = plan_interruptions(opts.steps, opts.every, opts.seed)
    n, ckpts = opts.nproc, os.path.join(directory, "checkpoints")
    ref_final, res_final = os.path.join(directory, "final-reference"), os.path.join(directory, "final-resumed")
    common = ["--steps", str(opts.steps), "--seed", str(opts.seed)]
    managed = [*common, "--dir", ckpts, "--every", str(opts.every), "--keep", str(opts.keep),
               *(["--sync"] if opts.sync else [])]
    t = opts.timeout_s
    reference = run_job("reference", n, [*common, "--dir", os.path.join(directory, "reference"),
                                         "--final", ref_final], timeout_s=t)
    crashed = run_job("crashed", n, managed, timeout_s=t, signal_at=(plan.crash_at, signal.SIGKILL))
    preempted = run_job("preempted", n, [*managed, "--resume"], timeout_s=t,
                        signal_at=(plan.preempt_at, signal.SIGTERM))
    extra = ["--forget-rng"] if opts.corrupt_resume else []
    resumed = run_job("resumed", n, [*managed, "--resume", "--final", res_final, *extra], timeout_s=t)
    ref_state, res_state = shardsafe.load(ref_final), shardsafe.load(res_final)
    return DistResult(opts, job_config(opts.steps, opts.seed, n), plan, reference, crashed,
                      preempted, resumed, differences(ref_state, res_state), fingerprint(res_state))


def run_demo(opts: DemoOptions) -> DistResult:
    """Runs the distributed demo on ``opts.nproc`` ranks (the seam ``cli/demo.py`` calls).

    Raises:
        DemoError: A job failed.
        ValueError: ``opts.directory`` exists and is not empty.
    """
    return in_demo_directory(opts, _run_in)


def report(r: DistResult) -> str:
    """A short readable report of a distributed demo run."""
    o, crash, pre, res = r.options, r.crashed, r.preempted, r.resumed
    stalls = [s.stall_s for w in (crash, pre, res) for s in w.saves] or [0.0]
    lines = [
        f"shardsafe demo on {r.config.nproc} ranks: SIGKILL and preempt a distributed training "
        f"job, resume it, compare with an uninterrupted job",
        "",
        labelled("job", r.config.describe()),
        labelled("steps", f"{o.steps}, a checkpoint every {o.every} steps ({'sync' if o.sync else 'async'} "
                       f"CheckpointManager on every rank, max_to_keep {o.keep}, seed {o.seed})"),
        labelled("crash", f"SIGKILL to all {r.config.nproc} ranks once step {crash.signal_sent_at} was "
                       f"reported (planned {r.plan.crash_at}); the next job resumed from step "
                       f"{pre.resumed_from}"),
        labelled("preemption", f"SIGTERM to all ranks once step {pre.signal_sent_at} was reported "
                            f"(planned {r.plan.preempt_at}); the ranks agreed on step "
                            f"{pre.preempted_step}, saved it and exited; the next job resumed "
                            f"from step {res.resumed_from}"),
        labelled("checkpoints", f"{sum(len(w.saves) for w in (crash, pre, res))} saves, one data "
                             f"file per rank each; per save the loop stalled "
                             f"{sum(stalls) / len(stalls) * 1e3:.1f} ms on rank 0 (mean)"),
        labelled("wall time", f"reference {r.reference.wall_s:.1f} s, crashed {crash.wall_s:.1f} s, "
                           f"preempted {pre.wall_s:.1f} s, resumed {res.wall_s:.1f} s"),
    ]
    for p in r.problems:
        lines.append(labelled("problem", p))
    if r.identical:
        lines.append(labelled("result", f"IDENTICAL: sharded parameters and optimizer state, LR "
                                     f"schedule, every rank's data loader and RNG match the "
                                     f"uninterrupted job bit for bit (sha256 {r.fingerprint[:16]}...)"))
    else:
        lines.append(labelled("result", f"DIFFERENT: {len(r.differences)} key path(s) differ from "
                                     f"the uninterrupted job:"))
        lines += [continued(d) for d in summarize(r.differences)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(worker())
