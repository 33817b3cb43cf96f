"""A Linear regression on random list batches: the smallest fit a callback test can run."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class TinyRegression(L.LightningModule):
    """One Linear layer, ``[inputs, targets]`` batches, SGD; logs ``val/loss``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(-1), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.mse_loss(self.net(x).squeeze(-1), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def regression_loader(samples: int, batch_size: int) -> DataLoader:
    """``samples`` fixed random points in batches of ``batch_size``."""
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(samples, 4, generator=generator), torch.randn(samples, generator=generator)
    )
    return DataLoader(data, batch_size=batch_size)
