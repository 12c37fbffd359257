"""``shardsafe demo``: crash a training run with SIGKILL, resume it, prove the result is exact.

Modules:
    train: the demo model, data and training loop (a reusable ``Trainer``).
    checkpointer: where the loop's periodic checkpoints go (``shardsafe.save``/``load``).
    worker: one training process (``python -m shardsafe.demo.worker``), reporting JSON events.
    compare: bit-exact comparison and fingerprints of training states.
    run: the orchestration (reference run, crashed run, resumed run) and the report.

Only the public ``shardsafe`` API is used, so the demo doubles as an example.
"""
