"""Hugging Face ``transformers.Trainer`` with shardsafe checkpoints: async, verified, unpickled.

Usage::

    from shardsafe.transformers import Trainer      # instead of transformers.Trainer
    trainer = Trainer(model=model, args=TrainingArguments("out", save_steps=500), ...)
    trainer.train()                                  # or train(resume_from_checkpoint=True)

Each ``output_dir/checkpoint-<step>`` is a shardsafe checkpoint, written in the background
while training goes on: the training loop waits only while the tensors are copied into
host buffers, and the copy itself overlaps the next step's forward and backward pass (the
next optimizer step waits for it). The checkpoint holds the model's weights under their
own names (``transformer.h.0.attn.c_attn.weight``), the optimizer, the LR scheduler, the
gradient scaler, every random generator of every rank and every rank's ``TrainerState``
with the callbacks' states: everything the Trainer's own checkpoints hold, checksummed, nothing
pickled. The directory appears only once the checkpoint is committed; then
``config.json``, ``trainer_state.json`` and ``model.safetensors.index.json`` are written
beside it, so ``AutoModel*.from_pretrained(checkpoint_dir)`` loads the weights straight
from shardsafe's data files (valid safetensors files: no second copy of the weights).

``save_steps``/``save_strategy``, ``save_total_limit`` (applied once a checkpoint is
committed, so one being written is never deleted; ``load_best_model_at_end`` keeps the
best), ``resume_from_checkpoint=True`` (the newest *committed* checkpoint) or a path
(also a checkpoint the plain Trainer wrote), ``save_only_model`` and
``load_best_model_at_end`` work as with the plain Trainer; ``push_to_hub`` is left to it.
``train()`` returns only once every checkpoint it started is committed, and a SIGTERM
(a preemption) waits for the checkpoint in flight before the process ends.

``CheckpointingMixin`` gives the same to any Trainer subclass:
``class MyTrainer(CheckpointingMixin, SFTTrainer): ...``. Needs the extra
``shardsafe[transformers]``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import threading
from collections.abc import Callable
from typing import Any

import transformers
from transformers.trainer_callback import ExportableState, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .api.checkpointer import Checkpointer
from .api.delete import delete
from .api.load import load, read_checkpoint_index
from .engine.save.handle import SaveHandle
from .errors import CheckpointError
from .format import INDEX_NAME, tree
from .per_rank import PerRank
from .rng import RNGState

log = logging.getLogger("shardsafe")

TRAINER_STATE_NAME = "trainer_state.json"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
OWN_KEYS = ("optimizer", "lr_scheduler", "scaler", "rng", "trainer_state")
"""Top-level keys of a checkpoint beside the model's weights (which keep their own names)."""
_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def committed_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every committed shardsafe checkpoint in ``output_dir``, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        m = _CHECKPOINT.match(name)
        path = os.path.join(output_dir, name)
        if m and not os.path.islink(path) and os.path.isfile(os.path.join(path, INDEX_NAME)):
            found.append((int(m.group(1)), path))
    return sorted(found)


def is_shardsafe_checkpoint(path: str) -> bool:
    """Whether ``path`` is a committed shardsafe checkpoint (else a plain Trainer's, or none)."""
    return os.path.isfile(os.path.join(path, INDEX_NAME))


class _WaitBeforeOptimizerStep(TrainerCallback):
    """Holds the optimizer step until the checkpoint in flight has copied the tensors it
    changes (the copy overlaps the forward and backward pass before it)."""

    def __init__(self, trainer: CheckpointingMixin) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._wait_staged()


class CheckpointingMixin:
    """Makes a ``transformers.Trainer`` (or a subclass) checkpoint through shardsafe.

    Put it first among the bases: ``class MyTrainer(CheckpointingMixin, SFTTrainer)``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._checkpointer = Checkpointer()
        self._in_flight: SaveHandle | None = None
        self._after_commit: list[threading.Thread] = []
        self._background_errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.add_callback(_WaitBeforeOptimizerStep(self))

    # ------------------------------------------------------------------ saving
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Starts an async shardsafe save of ``checkpoint-<global step>``; returns once the
        save is planned (the tensors are copied in the background until the next optimizer
        step)."""
        self._raise_background_errors()
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        run_dir = self._get_output_dir(trial=trial)
        output_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.state.best_global_step:
            best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}")
            if self.state.best_global_step == self.state.global_step or os.path.exists(best):
                self.state.best_model_checkpoint = best
        if self.args.should_save:
            for cb in [c for c in self.callback_handler.callbacks + [self.control] if isinstance(c, ExportableState)]:
                name = cb.__class__.__name__
                if isinstance(self.state.stateful_callbacks.get(name), list):
                    self.state.stateful_callbacks[name].append(cb.state())
                else:
                    self.state.stateful_callbacks[name] = cb.state()
        self._wait_staged()  # at most one save in flight: the previous one has copied its tensors
        for earlier in self._after_commit[:-1]:  # the ones before it committed and rotated: only
            earlier.join()  # the newest commits may exceed save_total_limit, while they are rotated
        if self._checkpointer.closed:  # train() freed the staging buffers when it returned
            self._checkpointer = Checkpointer()
        state = self._checkpoint_state()
        handle = self._checkpointer.async_save(state, output_dir, staging="background", overwrite=True)
        weights = frozenset(k for k in state if k not in OWN_KEYS)
        self._in_flight = handle
        state_json = _state_json(dataclasses.asdict(self.state)) if self.args.should_save else None
        t = threading.Thread(target=self._finish_checkpoint, args=(handle, output_dir, run_dir, state_json, weights),
                             name="shardsafe-trainer-commit", daemon=True)
        t.start()
        self._after_commit = [x for x in self._after_commit if x.is_alive()] + [t]
        if self.state.global_step >= self.state.max_steps > 0:
            # the last save: the Trainer's own clean-up at the end of training (a limit of 1
            # with a best checkpoint) lists the directory next, so it must be settled
            self.wait_for_checkpoints()
        if self.args.push_to_hub:
            handle.result()  # the Trainer uploads the directory: it must be complete
            self._push_from_checkpoint(output_dir)

    def _checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint holds: the model's weights under their own names and ``OWN_KEYS``."""
        model = self.accelerator.unwrap_model(self.model)
        state: dict[str, Any] = dict(model.state_dict())
        clash = sorted(k for k in state if k.split(".")[0] in OWN_KEYS)
        if clash:
            raise CheckpointError(f"the model's weights {clash[:3]} clash with the checkpoint's own keys {OWN_KEYS}")
        if not self.args.save_only_model:
            state["optimizer"] = self.optimizer
            if self.lr_scheduler is not None:
                state["lr_scheduler"] = self.lr_scheduler
            scaler = getattr(self.accelerator, "scaler", None)
            if scaler is not None:
                state["scaler"] = scaler
            state["rng"] = PerRank(RNGState())
        state["trainer_state"] = PerRank(dataclasses.asdict(self.state))  # flags and callbacks differ per rank
        return state

    def _finish_checkpoint(self, handle: SaveHandle, path: str, run_dir: str, state_json: str | None,
                           weights: frozenset[str]) -> None:
        """After the commit (a background thread): the files the ecosystem reads, then the
        retention of ``save_total_limit``. Errors reach the training thread at the next
        save or at the end of ``train()``."""
        try:
            handle.result()
            if state_json is not None:
                _write_beside(path, self.accelerator.unwrap_model(self.model), state_json, weights)
                self._rotate(run_dir)
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            with self._lock:
                self._background_errors.append(e)

    def _rotate(self, run_dir: str) -> None:
        """Deletes the oldest committed checkpoints beyond ``save_total_limit``, as the
        Trainer would (the best one is kept: it moves to just before the newest, and a limit
        of 1 keeps both); one still being written is not committed, so never a candidate."""
        limit = self.args.save_total_limit
        if not limit or limit <= 0:
            return
        with self._lock:
            found = [path for _, path in committed_checkpoints(run_dir)]
            best = self.state.best_model_checkpoint
            best = next((p for p in found if best is not None and os.path.abspath(p) == os.path.abspath(best)), None)
            if best is not None:
                found.remove(best)
                found.insert(max(len(found) - 1, 0), best)
                if limit == 1 and found[-1] != best:
                    limit = 2
            for path in found[: max(0, len(found) - limit)]:
                log.info("deleting %s (save_total_limit=%d)", path, self.args.save_total_limit)
                delete(path)
                shutil.rmtree(path, ignore_errors=True)  # the files written beside the checkpoint

    def _wait_staged(self) -> None:
        handle = self._in_flight
        if handle is not None:
            handle.wait_staged()

    def wait_for_checkpoints(self, timeout: float | None = None) -> None:
        """Waits until every checkpoint started so far is committed (and its ecosystem files
        written); raises the first background error."""
        handle = self._in_flight
        if handle is not None:
            handle.result(timeout)
        for t in list(self._after_commit):
            t.join(timeout)
        self._raise_background_errors()

    def _raise_background_errors(self) -> None:
        with self._lock:
            errors, self._background_errors = self._background_errors, []
        if errors:
            raise errors[0]

    # ------------------------------------------------------------------ resuming
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``transformers.Trainer.train``; ``resume_from_checkpoint=True`` takes the newest
        committed checkpoint. Returns once every checkpoint it started is committed."""
        if isinstance(resume_from_checkpoint, bool) and resume_from_checkpoint:
            found = committed_checkpoints(self.args.output_dir)
            if not found:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
            resume_from_checkpoint = found[-1][1]
        if isinstance(resume_from_checkpoint, str) and is_shardsafe_checkpoint(resume_from_checkpoint):
            _restore_state_file(resume_from_checkpoint)
        with _wait_on_preemption(self):
            try:
                out = super().train(resume_from_checkpoint, *args, **kwargs)
            except BaseException:
                try:
                    self.wait_for_checkpoints()
                except BaseException as e:  # noqa: BLE001 - the training error is the one to raise
                    log.error("a checkpoint also failed: %s", e)
                raise
        self.wait_for_checkpoints()
        self._checkpointer.close()  # frees the host buffers the saves reused (the size of the state)
        return out

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        if not is_shardsafe_checkpoint(resume_from_checkpoint):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        self._load_weights(resume_from_checkpoint, model)

    def _load_weights(self, path: str, model: Any = None) -> None:
        """The checkpoint's weights into the model's parameters, in place."""
        target = self.accelerator.unwrap_model(model if model is not None else self.model)
        result = _load_subset(path, target.state_dict())
        if result.missing or result.mismatched:
            raise CheckpointError(f"{path} does not hold the model's weights: missing {result.missing[:5]}, "
                                  f"mismatched {result.mismatched[:5]}")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None or not is_shardsafe_checkpoint(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)
        # what the checkpoint lacks (a save_only_model one) is left as it is: strict=False
        _load_subset(checkpoint, {k: v for k, v in (("optimizer", self.optimizer), ("lr_scheduler", self.lr_scheduler))
                                  if v is not None})

    def _load_scaler(self, checkpoint: str | None) -> None:
        if checkpoint is None or not is_shardsafe_checkpoint(checkpoint):
            return super()._load_scaler(checkpoint)
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            _load_subset(checkpoint, {"scaler": scaler})

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if checkpoint is None or not is_shardsafe_checkpoint(checkpoint):
            return super()._load_rng_state(checkpoint)
        _load_subset(checkpoint, {"rng": PerRank(RNGState(), missing="keep")})

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        if best is None or not is_shardsafe_checkpoint(best):
            return super()._load_best_model()
        log.info("loading the best model from %s (score: %s)", best, self.state.best_metric)
        self._load_weights(best, self.model_wrapped)


class Trainer(CheckpointingMixin, transformers.Trainer):
    """``transformers.Trainer`` whose checkpoints are shardsafe checkpoints saved in the
    background (same constructor and arguments; see the module documentation)."""


# ----------------------------------------------------------------------------- helpers


class _SkipReport(logging.Filter):
    """Drops the report of what a ``strict=False`` load skipped: loading one part of a
    checkpoint (the optimizer, the generators) skips the rest by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and "strict=False) skipped" in record.msg)


def _load_subset(path: str, target: dict[str, Any]) -> Any:
    """``load(path, target, strict=False)``: the parts of a checkpoint ``target`` names."""
    quiet = _SkipReport()
    log.addFilter(quiet)
    try:
        return load(path, target, strict=False)
    finally:
        log.removeFilter(quiet)


def _top_level(index: Any) -> dict[Any, Any]:
    """The nodes under the root of a checkpoint's tree, by key."""
    return dict(tree.dict_items(index.tree)) if index.tree.get("t") == "dict" else {}


def _write_beside(path: str, model: Any, state_json: str, weights: frozenset[str]) -> None:
    """``config.json`` (and the generation config), ``trainer_state.json`` and
    ``model.safetensors.index.json`` in a committed checkpoint's directory, each written
    to a temporary name and renamed. The weights index is written only when every weight
    lies whole in one data file (not for a sharded FSDP checkpoint: ``shardsafe export``
    writes the standard layout of one)."""
    _write_atomically(os.path.join(path, TRAINER_STATE_NAME), state_json)
    config = getattr(model, "config", None)
    if config is not None:
        config.save_pretrained(path)
        gen = getattr(model, "generation_config", None)
        if gen is not None and getattr(model, "can_generate", lambda: False)():
            gen.save_pretrained(path)
    index = read_checkpoint_index(path)
    weight_map, total = {}, 0
    for t in index.tensors:
        if len(t.key) != 1 or t.key[0] not in weights:
            continue
        if len(t.chunks) != 1 or any(c.stored is not None for c in t.chunks):
            log.info("%s: not writing %s (weights sharded or compressed; `shardsafe export` writes the "
                     "standard layout)", path, WEIGHTS_INDEX_NAME)
            return
        weight_map[t.key[0]] = t.chunks[0].file
        total += t.chunks[0].nbytes
    if weight_map:
        _write_atomically(os.path.join(path, WEIGHTS_INDEX_NAME), json.dumps(
            {"metadata": {"total_size": total, "format": "pt"}, "weight_map": dict(sorted(weight_map.items()))},
            indent=2))


def _state_json(state: dict[str, Any]) -> str:
    """``trainer_state.json`` as ``TrainerState.save_to_json`` writes it."""
    return json.dumps(state, indent=2, sort_keys=True) + "\n"


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _restore_state_file(path: str) -> None:
    """Writes ``trainer_state.json`` from the checkpoint when a crash came between the
    commit and the files written beside it (the Trainer reads that file to resume)."""
    target = os.path.join(path, TRAINER_STATE_NAME)
    if os.path.isfile(target):
        return
    per_rank = _top_level(read_checkpoint_index(path)).get("trainer_state")
    node = dict(tree.dict_items(per_rank)).get("0") if per_rank is not None and per_rank.get("t") == "dict" else None
    if node is None:
        raise CheckpointError(f"{path} holds no trainer_state: not a checkpoint of shardsafe.transformers.Trainer")

    def no_tensor(key: Any, n: Any) -> Any:
        raise CheckpointError(f"{path}: trainer_state holds a tensor at {key}")

    _write_atomically(target, _state_json(tree.build(node, no_tensor, ("trainer_state",))))


class _wait_on_preemption:
    """While ``train()`` runs (on the main thread), a SIGTERM first waits for the
    checkpoint in flight, then goes to the handler that was there before."""

    def __init__(self, trainer: CheckpointingMixin) -> None:
        self.trainer = trainer
        self.previous: Callable[..., Any] | int | None = None

    def __enter__(self) -> _wait_on_preemption:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    def _handle(self, signum: int, frame: Any) -> None:
        log.warning("SIGTERM: waiting for the checkpoint in flight before stopping")
        try:
            self.trainer.wait_for_checkpoints()
        except BaseException as e:  # noqa: BLE001 - the process is stopping either way
            log.error("the checkpoint in flight failed: %s", e)
        previous = self.previous
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)


__all__ = ["CheckpointingMixin", "Trainer", "committed_checkpoints"]
