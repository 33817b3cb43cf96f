"""The LightningModule of the minimal workload: what the workload contract asks and no more."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.optim.scheduled_module import OptimizerFactory, ScheduledOptimization


class MinimalRegression(ScheduledOptimization, OOMResilientModule):
    """A Linear layer fitted with mean squared error; logs ``train/loss`` and ``val/loss``."""

    @classmethod
    def logged_metrics(cls, model_cfg: Any = None) -> frozenset[str]:
        """Every metric name a run logs, so a misspelt monitor is refused before any work."""
        return frozenset({"train/loss", "val/loss"})

    def __init__(
        self,
        *,
        features: int,
        optimizer: OptimizerFactory,
        lr_schedule: dict[str, Any] | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.net = nn.Linear(features, 1)
        self.init_optimization(optimizer, lr_schedule, compile=compile, network="net")

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(self.net(batch["inputs"]).squeeze(-1), batch["targets"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss.detach(), batch_size=len(batch["targets"]))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch), batch_size=len(batch["targets"]))
