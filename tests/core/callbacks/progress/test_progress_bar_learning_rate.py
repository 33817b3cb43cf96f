"""The progress bar's ``lr`` is the rate the last optimizer step used, not the scheduler's next."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vramkit.core.callbacks.progress.progress_bar import RunProgressBar

PEAK_LR = 0.01
STEPS = 4


class _DecayToZero(L.LightningModule):
    """Four steps at 1, 0.75, 0.5, 0.25 x PEAK_LR; the scheduler's step after the last sets 0."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.used: list[float] = []  # the rate of each step, as the optimizer saw it

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.used.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=PEAK_LR)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / STEPS)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(2 * STEPS, 4)), batch_size=2)


def _fit(bar: RunProgressBar) -> tuple[L.Trainer, _DecayToZero]:
    module = _DecayToZero()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[bar],
    )
    trainer.fit(module)
    return trainer, module


def test_after_the_last_step_the_bar_shows_the_rate_that_step_used() -> None:
    bar = RunProgressBar(refresh_rate=0)
    trainer, module = _fit(bar)
    assert module.used == [PEAK_LR * f for f in (1.0, 0.75, 0.5, 0.25)]
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.0  # the scheduler's next rate
    assert bar.get_metrics(trainer, module)["lr"] == f"{module.used[-1]:.2e}" == "2.50e-03"


def test_before_the_first_step_the_bar_shows_the_rate_it_will_use() -> None:
    bar = RunProgressBar(refresh_rate=0)
    trainer, module = _fit(bar)
    bar.on_train_start(trainer, module)  # a new fit: no step taken yet
    trainer.optimizers[0].param_groups[0]["lr"] = 0.5
    assert bar.get_metrics(trainer, module)["lr"] == "5.00e-01"
