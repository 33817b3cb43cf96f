"""The run's last lines name the best metric with its epoch and checkpoint, and a max_time stop
short of the plan with how far it got."""

from __future__ import annotations

import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.run.records.run_summary import summary_lines


class _ScoreRisesEachEpoch(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/score", float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)


def _fit(tmp_path, **trainer_args) -> L.Trainer:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", monitor="val/score", mode="max")
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint],
        default_root_dir=tmp_path,
        **trainer_args,
    )
    trainer.fit(_ScoreRisesEachEpoch(), _loader(), _loader())
    return trainer


def test_a_finished_run_names_its_best_metric_epoch_and_checkpoint(tmp_path):
    trainer = _fit(tmp_path, max_epochs=3)
    (line,) = summary_lines(trainer)
    best = trainer.checkpoint_callback.best_model_path
    assert line == f"best val/score 2.0000 at epoch 2: {best}"


def test_a_run_max_time_stopped_says_how_far_it_got(tmp_path):
    trainer = _fit(tmp_path, max_epochs=50, max_time={"seconds": 0})
    lines = summary_lines(trainer)
    assert lines[-1].startswith(
        f"trainer.max_time stopped the run at step {trainer.global_step} of 200 planned"
    )
    assert trainer.global_step < 200


class _SlowSteps(_ScoreRisesEachEpoch):
    def training_step(self, batch, batch_idx):
        time.sleep(0.4)
        return super().training_step(batch, batch_idx)


def test_a_max_time_stop_names_the_epoch_it_stopped_in(tmp_path):
    # 1 s of 0.4-s steps: the Timer stops the run after step 3 of epoch 0's 4, mid-epoch.
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", monitor="val/score", mode="max")
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint],
        max_epochs=50,
        max_time={"seconds": 1},
        default_root_dir=tmp_path,
    )
    trainer.fit(_SlowSteps(), _loader(), _loader())
    assert 0 < trainer.global_step < 4  # stopped inside the first epoch
    assert summary_lines(trainer)[-1].endswith(
        "of its plan, in epoch 0); resume with ckpt_path=<run>/checkpoints/last.ckpt to train "
        "the rest"
    )
