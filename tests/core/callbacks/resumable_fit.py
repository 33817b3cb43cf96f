"""A tiny fit that exercises everything exact resume needs: a shuffled vramkit loader with a
random augmentation, dropout, Adam and a per-step schedule sized by
``trainer.estimated_stepping_batches`` (the case where Lightning drops loader states)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import Dataset

from vramkit.core.callbacks.checkpoints.loader_position import LoaderPosition
from vramkit.core.callbacks.checkpoints.random_state import RandomState
from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.data.loaders import build_loader
from vramkit.core.optim.lr_schedules import WarmupDecaySchedule

SAMPLES, BATCH = 24, 4
STEPS_PER_EPOCH = SAMPLES // BATCH


class NoisyPoints(Dataset):
    """Fixed points plus fresh noise from torch's global generator (an 'augmentation')."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        point = torch.randn(4, generator=torch.Generator().manual_seed(index))
        return point + 0.1 * torch.randn(4)


class DropoutRegression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 1))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return (self.net(batch).squeeze(1) - batch.sum(1)).pow(2).mean()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val/loss", (self.net(batch).squeeze(1) - batch.sum(1)).pow(2).mean())

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        steps = int(self.trainer.estimated_stepping_batches)
        return WarmupDecaySchedule(warmup_steps=2).lightning_config(optimizer, steps)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return build_loader(
            NoisyPoints(), collate_fn=torch.stack, num_workers=0, pin_memory=False,
            batch_size=BATCH, shuffle=True, drop_last=True,
        )  # fmt: skip

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return build_loader(
            NoisyPoints(), collate_fn=torch.stack, num_workers=0, pin_memory=False, batch_size=8
        )


def fit(
    folder: Path,
    *,
    epochs: int = 2,
    ckpt_path: Path | None = None,
    callbacks: Sequence[L.Callback] = (),
    restore_random_state: bool = True,
    every_n_train_steps: int | None = 1,
    **trainer_args: Any,
) -> tuple[L.Trainer, DropoutRegression]:
    """Fit from seed 0 with the resume callbacks (checkpoints in ``folder``); the trainer, model."""
    L.seed_everything(0, verbose=False)
    model = DropoutRegression()
    resume = [
        ResumeCheckpoint(
            dirpath=str(folder), every_n_train_steps=every_n_train_steps, min_interval_s=0
        )
    ]
    resume += [LoaderPosition()] + ([RandomState()] if restore_random_state else [])
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        callbacks=[*callbacks, *resume],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=folder,
        **trainer_args,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model


def weights(model: L.LightningModule) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def same(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
