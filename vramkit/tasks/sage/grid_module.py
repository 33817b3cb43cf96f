"""ARC grid networks as LightningModules: the shared training/validation logic, and the teacher.

Every module here reads only the input fields of a batch (``INPUT_KEYS``); the answer grid is
used by the loss and the scores, never given to the network. Validation reports, for the model
and for the copy-the-input baseline: ``val/cell_acc`` (answer cells, padding never counted),
``val/exact_match`` (whole grid, size included) and ``val/size_acc``
(:mod:`vramkit.tasks.sage.grid_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import nn

from vramkit.core.optim.lr_schedules import WarmupPolySchedule
from vramkit.tasks.sage.arc_examples import INPUT_KEYS
from vramkit.tasks.sage.grid_loss import task_loss
from vramkit.tasks.sage.grid_metrics import GridScoreboard
from vramkit.tasks.sage.grid_outputs import GridOutput, copy_prediction, predict_grid
from vramkit.tasks.sage.teacher_checkpoint import TEACHER_NETWORK_KEY, network_config

OptimizerFactory = Callable[..., torch.optim.Optimizer]
MODEL, COPY = "", "copy_"  # metric-name prefixes of the scored predictors


class GridModelModule(L.LightningModule):
    """Trains a grid network on the answer's cells and size, and scores it every validation."""

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        lr_schedule: dict[str, Any] | None = None,
        size_weight: float = 1.0,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.net = net
        self.optimizer_factory = optimizer
        self.lr_schedule = WarmupPolySchedule(**(lr_schedule or {}))
        if size_weight < 0:
            raise ValueError(f"model.size_weight must be >= 0, got {size_weight}")
        self.size_weight = size_weight
        self.compile_net = compile
        self.scoreboard = GridScoreboard()
        self.last_scores: dict[str, dict[str, float]] = {}

    def configure_model(self) -> None:
        # In place, so checkpoints keep the plain parameter names (no `_orig_mod.` prefix).
        if self.compile_net:
            self.net.compile()

    @staticmethod
    def inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The fields a network may read: the answer is not among them."""
        return {key: batch[key] for key in INPUT_KEYS}

    def forward(self, batch: dict[str, torch.Tensor]) -> GridOutput:
        return self.net(self.inputs(batch))

    def _loss(self, phase: str, output: GridOutput, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training objective of a batch; logs its terms as ``<phase>/<name>``."""
        losses = task_loss(output, batch, size_weight=self.size_weight)
        self._log_losses(phase, losses, batch)
        return losses["loss"]

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._loss("train", self(batch), batch)

    def _log_losses(
        self, phase: str, losses: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]
    ) -> None:
        size = batch["tokens"].shape[0]
        for name, value in losses.items():
            self.log(f"{phase}/{name}", value.detach(), batch_size=size, prog_bar=name == "loss")

    def on_validation_epoch_start(self) -> None:
        self.scoreboard.reset()

    def on_test_epoch_start(self) -> None:
        self.scoreboard.reset()

    def _evaluate(self, phase: str, batch: dict[str, torch.Tensor]) -> None:
        output = self(batch)
        self._loss(phase, output, batch)
        target, target_size = batch["target"], batch["target_size"]
        self.scoreboard.add(MODEL, predict_grid(output, batch["query_grid"]), target, target_size)
        self.scoreboard.add(COPY, copy_prediction(batch["query_grid"]), target, target_size)
        self._score_references(batch)

    def _score_references(self, batch: dict[str, torch.Tensor]) -> None:
        """Score other predictors carried by the batch (none here)."""

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch)

    def _log_scores(self, phase: str) -> None:
        # Sum the counts over processes: the scores are micro averages over the whole set.
        results = self.scoreboard.results(
            lambda counts: self.trainer.strategy.reduce(counts, reduce_op="sum")
        )
        for prefix, scores in results.items():
            for name in ("cell_acc", "exact_match", "size_acc"):
                self.log(f"{phase}/{prefix}{name}", scores[name], prog_bar=not prefix)
        self.last_scores = results

    def on_validation_epoch_end(self) -> None:
        self._log_scores("val")

    def on_test_epoch_end(self) -> None:
        self._log_scores("test")

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.optimizer_factory(params=self.parameters())
        return self.lr_schedule.lightning_config(
            optimizer, int(self.trainer.estimated_stepping_batches)
        )


class ArcTeacherModule(GridModelModule):
    """The embedded SAGE teacher: a larger grid transformer trained on the task.

    Its checkpoints name the network class and sizes (``sage_teacher_network``), so the feature
    extraction rebuilds it from the file alone.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        lr_schedule: dict[str, Any] | None = None,
        size_weight: float = 1.0,
        compile: bool = False,
    ) -> None:
        super().__init__(net, optimizer, lr_schedule, size_weight, compile)
        self.save_hyperparameters(ignore=["net", "optimizer"])
        self.network_config = network_config(net)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[TEACHER_NETWORK_KEY] = self.network_config
