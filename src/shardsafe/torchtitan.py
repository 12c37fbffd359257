"""torchtitan integration: torchtitan's checkpointer seam, on a shardsafe ``CheckpointManager``.

torchtitan (0.3) builds its checkpointer from ``Trainer.Config.checkpoint``, any
``BaseCheckpointManager.Config``; its own are the DCP ``CheckpointManager`` and the
``torch_checkpointing`` one. ``ShardsafeCheckpointManager`` is a third::

    from shardsafe.torchtitan import ShardsafeCheckpointManager
    config = Trainer.Config(..., checkpoint=ShardsafeCheckpointManager.Config(
        enable=True, folder="checkpoint", interval=500, keep_latest_k=3,
        async_mode="async", compression="auto"))

It saves what torchtitan's checkpointers save (the model through torchtitan's
``ModelWrapper``, the ``OptimizersContainer``, the ``LRSchedulersContainer``, the data
loader, the trainer's own state) as one state of a shardsafe ``CheckpointManager`` under
``<dump_folder>/<folder>``: steps ``step_00000500``..., each committed atomically with
checksums; ``keep_latest_k`` is the manager's ``max_to_keep``; ``async_mode`` other than
``"disabled"`` is the manager's ``async_save`` (training continues once the state is
copied into reused, page-locked where CUDA is present, host buffers); ``load(step=-1)``
restores the newest step that verifies (falling back to an older one). The last step's
model-only export (``last_save_model_only``, in ``export_dtype``) and a seed checkpoint
(step 0) restore only the model, as with torchtitan's DCP checkpointer. Needs the extra
``shardsafe[torchtitan]``; importing this module imports torchtitan.
"""

from __future__ import annotations

import logging
import os
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torchtitan.components.checkpointer import BaseCheckpointManager, ModelWrapper
from torchtitan.components.checkpointer.base import DATALOADER, LR_SCHEDULER, MODEL, OPTIMIZER

from .api.load import load
from .errors import CheckpointError, CheckpointNotFoundError
from .manager import CheckpointManager

log = logging.getLogger("shardsafe")

MODEL_ONLY = "model_only"  # the step metric that marks a model-only export
EXPORT_DTYPE = "export_dtype"  # the step metric naming its floats' dtype (EXPORT_DTYPES)
EXPORT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_EXPORT_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ShardsafeCheckpointManager(BaseCheckpointManager):
    """torchtitan's checkpointer contract (``BaseCheckpointManager``) on shardsafe.

    Built by torchtitan's trainer from ``ShardsafeCheckpointManager.Config`` (with the
    data loader, model parts, optimizers, LR schedulers and the trainer's own state); every
    rank makes the same calls. Hugging Face loads and exports (``initial_load_in_hf``,
    ``last_save_in_hf``) are refused when the config is made: use torchtitan's DCP
    checkpointer for those.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseCheckpointManager.Config):
        """torchtitan's checkpoint policies, plus how shardsafe writes."""

        async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "disabled"
        """``"disabled"``: each save returns once committed. ``"async"`` and
        ``"async_with_pinned_mem"`` (the same here: staging memory is page-locked whenever
        CUDA is present): a save returns once the state is copied, and is written and
        committed in the background."""

        compression: Literal["none", "zstd", "auto"] = "none"
        """Lossless compression of the data (``"auto"``: shardsafe's float codec)."""

        max_staging_bytes: int | None = None
        """Host memory an async save may hold (None: one copy of the state)."""

        def __post_init__(self) -> None:
            BaseCheckpointManager.Config.__post_init__(self)
            if self.initial_load_in_hf or self.last_save_in_hf:
                raise ValueError("the shardsafe checkpointer does not read or write Hugging Face "
                                 "safetensors checkpoints (initial_load_in_hf, last_save_in_hf): "
                                 "use torchtitan's DCP checkpointer for those")

    def __init__(self, config: Config, *, dataloader: Any, model_parts: list[torch.nn.Module],
                 optimizers: Any, lr_schedulers: Any, states: dict[str, Any], sd_adapter: Any,
                 base_folder: str = "") -> None:
        self.enable = config.enable
        if not self.enable:
            return
        self.save_future: Future | None = None
        self.config = config
        self.folder = os.path.join(base_folder, config.folder)
        self.states = states
        self.states.update({MODEL: ModelWrapper(model_parts), OPTIMIZER: optimizers,
                            DATALOADER: dataloader, LR_SCHEDULER: lr_schedulers})
        self.export_dtype = _EXPORT_NAMES[config.export_dtype]
        if config.load_only:
            self._mgr = CheckpointManager(self.folder, read_only=True)
        else:
            self._mgr = CheckpointManager(
                self.folder, save_interval_steps=config.interval, max_to_keep=config.keep_latest_k or None,
                async_save=config.async_mode != "disabled", max_staging_bytes=config.max_staging_bytes,
                compression=None if config.compression == "none" else config.compression)
        # a checkpointer nobody closed (the trainer raised) is closed at garbage collection or
        # exit, while the interpreter is still whole; never from a __del__, which may run
        # during its teardown
        self._finalizer = weakref.finalize(self, _close_unclosed, self._mgr, self.folder)

    @property
    def manager(self) -> CheckpointManager:
        """The shardsafe ``CheckpointManager`` underneath (``all_steps()``, ``latest_step()``...)."""
        return self._mgr

    # ------------------------------------------------------------------ saving
    @torch.no_grad()
    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        c = self.config
        if c.load_only:
            return False
        extra = last_step or (curr_step == 1 and c.enable_first_step_checkpoint)
        if not (extra or self._mgr.should_save(curr_step)):
            return False
        if last_step and c.last_save_model_only:
            self._mgr.save(curr_step, {MODEL: self._export_model()}, force=True,
                           metrics={MODEL_ONLY: 1, EXPORT_DTYPE: EXPORT_DTYPES.index(self.export_dtype)})
        else:
            self._mgr.save(curr_step, self._state(model_only=False), force=extra)
        if c.async_mode != "disabled":
            self.save_future = Future()
        if last_step:
            self._wait_for_saving()
        return True

    def _export_model(self) -> dict[str, Any]:
        """The model's state for the final export, floats in ``export_dtype``."""
        return {k: v.to(self.export_dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in self.states[MODEL].state_dict().items()}

    def _state(self, model_only: bool) -> dict[str, Any]:
        if model_only:
            return {MODEL: self.states[MODEL]}
        skip = set(self.config.exclude_from_loading)
        missing = skip - set(self.states)
        if missing:
            raise ValueError(f"exclude_from_loading names {sorted(missing)}, which are not in the state")
        return {k: v for k, v in self.states.items() if v is not None and k not in skip}

    def _wait_for_saving(self) -> None:
        fut, self.save_future = self.save_future, None
        try:
            self._mgr.wait_until_finished()
        except BaseException as e:
            if fut is not None:
                fut.set_exception(e)
            raise
        if fut is not None:
            fut.set_result(None)

    def _maybe_wait_for_staging(self) -> None:
        """Nothing to wait for: a save returns once the state has been copied."""

    # ------------------------------------------------------------------ loading
    @torch.no_grad()
    def _load(self, step: int = -1) -> bool:
        c = self.config
        steps = self._mgr.all_steps()
        if step != -1 and step not in steps:
            raise CheckpointNotFoundError(f"checkpoint.load_step={step} is not a committed step in "
                                          f"{self.folder!r} (it has {steps[-5:]})")
        if not steps:
            if not c.initial_load_path:
                log.info("no checkpoint in %s: a fresh start", self.folder)
                return False
            load(c.initial_load_path, self._state(model_only=c.initial_load_model_only), strict=False)
            log.info("loaded the initial checkpoint %s", c.initial_load_path)
            return True
        want = steps[-1] if step == -1 else step
        metrics = self._mgr.metrics(want) or {}
        if metrics.get(MODEL_ONLY) == 1:
            self._restore_export(want, EXPORT_DTYPES[int(metrics.get(EXPORT_DTYPE, 0))])
        elif step != -1 or want == 0:
            self._mgr.restore(self._state(model_only=want == 0), want)
        else:
            got = self._mgr.restore(self._state(model_only=False))
            log.info("restored step %s of %s", got, self.folder)
        return True

    def _restore_export(self, step: int, dtype: torch.dtype) -> None:
        """Loads a model-only export whose floats are ``dtype`` into the model (cast)."""
        live = self.states[MODEL].state_dict()
        into = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in live.items()}
        self._mgr.restore({MODEL: into}, step)
        for k, v in into.items():
            if v is not live[k]:
                live[k].copy_(v)
        self.states[MODEL].load_state_dict(live)

    def _close(self) -> None:
        if hasattr(self, "_mgr"):
            self._finalizer.detach()
            self._mgr.close()


def _close_unclosed(mgr: CheckpointManager, folder: str) -> None:
    """Closes the manager of a checkpointer that was never closed (waiting for its save in
    flight); a failure is logged: a finalizer has nobody to raise to."""
    try:
        mgr.close()
    except (CheckpointError, OSError) as e:
        log.error("closing the checkpointer of %s, which nobody closed, failed: %s", folder, e)


__all__ = ["EXPORT_DTYPE", "EXPORT_DTYPES", "MODEL_ONLY", "ShardsafeCheckpointManager"]
