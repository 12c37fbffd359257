"""PyTorch Lightning integration: shardsafe checkpoints through Lightning's CheckpointIO.

Usage::

    from shardsafe.lightning import ShardsafeCheckpointIO
    trainer = Trainer(plugins=[ShardsafeCheckpointIO()])               # or (async_save=True)
    trainer.fit(model, ckpt_path="last")
    model = shardsafe.lightning.load_from_checkpoint(MyModel, "ckpts/epoch=1.ckpt")

Each Lightning checkpoint (``epoch=1.ckpt``, ``last.ckpt``) is a shardsafe checkpoint
directory. Lightning saves from global rank 0 only, so the plugin saves with
``collective=False`` (no communication) and every rank loads on its own. The plugin
adds the random number generators (Python, NumPy, torch) to each checkpoint, which
Lightning itself does not save, and restores them on load, so a resumed run draws the
same dropout masks and shuffles as one that never stopped. Needs the extra
``shardsafe[lightning]``; importing this module imports Lightning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.plugins.io import CheckpointIO

from .api.async_save import async_save as _async_save
from .api.delete import delete
from .api.load import load
from .api.save import save
from .engine.save.handle import SaveHandle
from .errors import CheckpointNotFoundError
from .format.codec import Compression, check_compression
from .rng import RNGState

log = logging.getLogger("shardsafe")

RNG_KEY = "shardsafe_rng"  # where the plugin keeps the generators inside a checkpoint


def _storable(value: Any) -> Any:
    """Lightning's values that shardsafe does not store natively, mapped to ones it does.

    A class object (``hparams_type``) becomes its qualified name (Lightning reads a
    string there as ``AttributeDict``); an OmegaConf container becomes plain dicts and
    lists. Everything else is left to ``shardsafe.save``, which raises a ``TypeError``
    naming the key path of a value it cannot store safely.
    """
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_storable(v) for v in value)
    return value


def _to_device(value: Any, map_location: Any) -> Any:
    """Moves the loaded tensors where ``map_location`` (a device or its name) says."""
    if map_location is None or callable(map_location) or isinstance(map_location, Mapping):
        return value  # torch.load's storage remapping has no meaning here: tensors stay on the CPU
    device = torch.device(map_location)
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_device(v, device) for v in value)
    return value


class ShardsafeCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` that writes shardsafe checkpoints.

    Args:
        async_save: Save in the background: ``save_checkpoint`` returns once the state
            is copied into host buffers, and writing and committing overlap training.
            The next save, a load, a removal and the end of ``fit`` (``teardown``) wait
            for it and raise its error if it failed.
        rng: Store the random number generators in each checkpoint (key
            ``"shardsafe_rng"``) and restore them on load. Under DDP, rank 0's
            generators are saved and every rank restores them (exact when every rank
            seeds alike, e.g. ``seed_everything(seed)``, as Lightning recommends).
        storage_options: Passed to fsspec for URL paths.
        compression: None, ``"zstd"`` or ``"auto"``: store the checkpoints' tensors
            losslessly compressed (see ``shardsafe.save``).

    On load the generators are restored whatever the load is for, ``validate`` and
    ``test`` with a ``ckpt_path`` included (Lightning does not tell a CheckpointIO why
    it loads); pass ``rng=False`` where that matters.
    """

    def __init__(self, *, async_save: bool = False, rng: bool = True,
                 storage_options: dict | None = None, compression: Compression | None = None) -> None:
        self.async_save = async_save
        self.rng = rng
        self.storage_options = storage_options
        self.compression = check_compression(compression)
        self._handle: SaveHandle | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        """Saves Lightning's checkpoint dict at ``path`` (replacing a checkpoint there).

        Raises:
            TypeError: a value of the checkpoint (e.g. a hyperparameter) cannot be stored
                safely; the message names its key path.
        """
        self.wait()
        state = _storable(checkpoint)
        if self.rng:
            state[RNG_KEY] = RNGState().state_dict()
        options = storage_options or self.storage_options
        kwargs = {"overwrite": True, "storage_options": options, "collective": False,
                  "compression": self.compression}
        try:
            if self.async_save:
                self._handle = _async_save(state, os.fspath(path), **kwargs)
            else:
                save(state, os.fspath(path), **kwargs)
        except TypeError as e:
            raise TypeError(f"Lightning checkpoint {os.fspath(path)!r}: {e} (store hyperparameters "
                            f"as numbers, strings, lists and dicts)") from None

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Loads the checkpoint dict at ``path`` on this rank alone; restores the generators.

        Nothing is unpickled, so ``weights_only`` has nothing to restrict.
        """
        self.wait()
        checkpoint = load(os.fspath(path), storage_options=self.storage_options, collective=False)
        rng = checkpoint.pop(RNG_KEY, None)
        if rng is not None and self.rng:
            RNGState().load_state_dict(rng)
        return _to_device(checkpoint, map_location)

    def remove_checkpoint(self, path: Any) -> None:
        """Deletes the checkpoint at ``path`` (index first); nothing there is no error."""
        self.wait()
        try:
            delete(os.fspath(path), storage_options=self.storage_options)
        except CheckpointNotFoundError:
            log.debug("remove_checkpoint: no committed checkpoint at %s", path)

    def wait(self) -> None:
        """Waits for the background save in flight (if any); raises its error if it failed."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.result()

    def teardown(self) -> None:
        """Called by Lightning at the end of ``fit``/``validate``: finishes the save in flight."""
        self.wait()


def load_checkpoint(path: str | os.PathLike[str], map_location: Any | None = None,
                    storage_options: dict | None = None) -> dict[str, Any]:
    """Lightning's checkpoint dict from a shardsafe checkpoint (no generators restored)."""
    io = ShardsafeCheckpointIO(rng=False, storage_options=storage_options)
    return io.load_checkpoint(path, map_location)  # drops the generators without restoring them


def load_from_checkpoint(cls: type, path: str | os.PathLike[str], map_location: Any | None = None,
                         strict: bool | None = None, **kwargs: Any) -> Any:
    """``cls.load_from_checkpoint(path, ...)`` for a shardsafe checkpoint.

    Lightning's own ``load_from_checkpoint`` reads files with ``torch.load``; this builds
    the LightningModule (or LightningDataModule) ``cls`` the same way from the saved
    hyperparameters (``kwargs`` override them) and loads its weights.
    """
    import lightning.pytorch as pl
    from lightning.pytorch.core.saving import _load_state

    checkpoint = load_checkpoint(path, map_location)
    checkpoint.setdefault(cls.CHECKPOINT_HYPER_PARAMS_KEY, {})
    checkpoint[cls.CHECKPOINT_HYPER_PARAMS_KEY].update(kwargs)
    if issubclass(cls, pl.LightningDataModule):
        return _load_state(cls, checkpoint, **kwargs)
    return _load_state(cls, checkpoint, strict=strict, **kwargs)


__all__ = ["RNG_KEY", "ShardsafeCheckpointIO", "load_checkpoint", "load_from_checkpoint"]
