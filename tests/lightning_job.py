"""A small real Lightning job for tests/test_lightning.py (in-process and under DDP).

Run as a script it is one rank of a 2-process CPU DDP job (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set): it trains 4 epochs without a stop, then 2 epochs and
a resume to 4 from ``last``, and writes both final weights with ``torch.save`` (not
through the library under test) to ``OUT/final-r<rank>-{full,resumed}.pt``.
"""

from __future__ import annotations

import os
import sys
import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import shardsafe
from shardsafe.lightning import RNG_KEY, ShardsafeCheckpointIO

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*LightningModule.*log.*")


class Net(pl.LightningModule):
    """An MLP with dropout (its masks use the torch generator), SGD with momentum, StepLR."""

    def __init__(self, hidden: int = 16, lr: float = 0.05, tags: list | None = None,
                 extra: object = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 1))

    def training_step(self, batch: tuple, _: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: tuple, _: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self) -> dict:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)}


def data(n: int = 96, shuffle: bool = True) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=shuffle)


def trainer(dirpath: str, epochs: int, io: ShardsafeCheckpointIO | None = None, **kw: object
            ) -> tuple[pl.Trainer, ModelCheckpoint]:
    ckpt = ModelCheckpoint(dirpath=dirpath, monitor="val_loss", save_top_k=2, save_last=True,
                           filename="{epoch}")
    t = pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=[ckpt],
                   plugins=[io or ShardsafeCheckpointIO()], **kw)
    return t, ckpt


def weights(model: pl.LightningModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def resume(root: str, ckpt_path: str, io: ShardsafeCheckpointIO | None = None, run: str = "run",
           **kw: object) -> tuple[pl.Trainer, ModelCheckpoint, Net]:
    """A new model and trainer continuing to epoch 4, as a restarted script would.

    The script seeds as before, so the generators start where the first run's started,
    not where it stopped; and Lightning's DistributedSampler shuffles with that seed.
    """
    pl.seed_everything(1, verbose=False)
    model = Net(tags=["a", 1])
    t, ckpt = trainer(os.path.join(root, run), 4, io, **kw)
    t.fit(model, data(), data(48, False), ckpt_path=ckpt_path)
    return t, ckpt, model


def full_and_resumed(root: str, io: ShardsafeCheckpointIO | None = None, **kw: object
                     ) -> tuple[dict, dict, pl.Trainer, ModelCheckpoint]:
    """Final weights of 4 uninterrupted epochs and of 2 epochs + a resume from ``last``."""
    pl.seed_everything(1, verbose=False)
    full = Net(tags=["a", 1])
    trainer(os.path.join(root, "full"), 4, io, **kw)[0].fit(full, data(), data(48, False))
    pl.seed_everything(1, verbose=False)
    first = Net(tags=["a", 1])
    t, _ = trainer(os.path.join(root, "run"), 2, io, **kw)
    t.fit(first, data(), data(48, False))
    if t.is_global_zero:  # a copy without the generators, for the negative control
        saved = shardsafe.load(os.path.join(root, "run", "last.ckpt"), collective=False)
        del saved[RNG_KEY]
        shardsafe.save(saved, os.path.join(root, "stop2-no-rng.ckpt"), collective=False)
    t, ckpt, resumed = resume(root, "last", io, **kw)
    return weights(full), weights(resumed), t, ckpt


def main(out: str) -> None:
    full, resumed, _, _ = full_and_resumed(out, ShardsafeCheckpointIO(async_save=True),
                                           strategy="ddp", devices=2)
    rank = int(os.environ["RANK"])
    torch.save(full, os.path.join(out, f"final-r{rank}-full.pt"))
    torch.save(resumed, os.path.join(out, f"final-r{rank}-resumed.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
