"""``shardsafe demo``: crash and preempt a training run, resume it, prove the result is exact.

Modules:
    train: the demo model, data and training loop (a reusable ``DemoTrainer`` with a step hook).
    hook: the step hook that checkpoints through a ``CheckpointManager``.
    worker: the training script (``python -m shardsafe.demo.worker``), reporting JSON events.
    events: the parent's view of a worker's events.
    plan: where the crash and the preemption happen (pure, seeded).
    process: starting and following one training process, sending it SIGKILL or SIGTERM.
    run: the orchestration (reference, crash, preemption, resume) and its result.
    report: the text the CLI prints.

States are compared bit for bit with ``shardsafe.harness.compare``.

``shardsafe demo --nproc N`` (N > 1) runs ``shardsafe.demo.distributed`` instead:
``run_demo(opts: DemoOptions)`` returning a result with ``ok``, and
``report(result) -> str`` (see ``cli/demo.py``).

Only the public ``shardsafe`` API is used, so the demo doubles as an example.
"""
