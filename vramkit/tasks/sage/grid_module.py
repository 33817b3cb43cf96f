"""ARC grid networks as LightningModules: the shared training/validation logic, and the teacher.

Every module here reads only the input fields of a batch (``INPUT_KEYS``); the answer grid is
used by the loss and the scores, never given to the network. Validation reports, for the model
and for the copy-the-input baseline: ``val/cell_acc`` (answer cells, padding never counted),
``val/changed_cell_acc`` (only the cells the answer changes from the input: copying scores 0),
``val/exact_match`` (whole grid, size included) and ``val/size_acc``
(:mod:`vramkit.tasks.sage.grids.grid_metrics`), and the loss and its parts.

The loss is a weighted sum of means over different units: ``cell_ce`` over the answer cells,
``size_ce`` over the examples (and the student's feature terms over the input tokens). A
training step split by an out-of-memory error (:class:`OOMResilientModule`) weights each of
these by the micro-batch's share of its units (:meth:`GridModelModule.micro_batch_weight`), so
its gradients are those of the whole batch; validation and test sum each mean times its units
over the epoch, so their losses, like the scores, do not depend on how a batch was cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from vramkit.core.oom.guarded_steps import LOSS_TERMS
from vramkit.core.oom.resilient_module import OOMResilientModule
from vramkit.core.optim.scheduled_module import OptimizerFactory, ScheduledOptimization
from vramkit.core.report.task_figures import ReportFigure
from vramkit.tasks.sage.data.arc_examples import INPUT_KEYS
from vramkit.tasks.sage.grids.grid_loss import task_loss
from vramkit.tasks.sage.grids.grid_metrics import SCORE_NAMES, GridScoreboard
from vramkit.tasks.sage.grids.grid_outputs import GridOutput, copy_prediction, predict_grid
from vramkit.tasks.sage.grids.grid_tokens import PAD
from vramkit.tasks.sage.report_figures import grid_figures
from vramkit.tasks.sage.teacher_features.teacher_checkpoint import (
    TEACHER_NETWORK_KEY,
    network_config,
)

MODEL, COPY = "", "copy_"  # metric-name prefixes of the scored predictors
# checkpoint entry: the validation scores of the saved weights, so a report can score that file
SCORES_KEY = "sage_validation_scores"


def unit_counts(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the loss's means average over, counted in ``batch`` (0-d tensors on its device):
    ``cells`` of the answers (padding excluded), ``samples``, non-padding input ``tokens``."""
    return {
        "cells": (batch["target"] != PAD).sum(),
        "samples": torch.tensor(batch["target"].shape[0], device=batch["target"].device),
        "tokens": (~batch["padding_mask"]).sum(),
    }


class MeanTotals:
    """Each mean of the loss times its units, summed over an epoch's batches: the epoch's mean
    per unit, whatever the batches (or their micro-batches) were."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._units: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        self._sums, self._units = {}, {}

    def add(self, means: Mapping[str, torch.Tensor], units: Mapping[str, torch.Tensor]) -> None:
        """Add a batch's ``means``, each with the count of the units it averages over."""
        for name, mean in means.items():
            count = units[name].to(torch.float64)
            total = mean.detach().to(torch.float64) * count
            self._sums[name] = self._sums.get(name, 0.0) + total
            self._units[name] = self._units.get(name, 0.0) + count

    def means(
        self, reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    ) -> dict[str, torch.Tensor]:
        """The epoch's means, by name; ``reduce_sum`` sums the totals over processes first."""
        names = sorted(self._sums)
        if not names:
            return {}
        sums = reduce_sum(torch.stack([self._sums[name] for name in names]))
        units = reduce_sum(torch.stack([self._units[name] for name in names]))
        means = sums / units.clamp(min=1.0)
        return {name: means[i].float() for i, name in enumerate(names)}


class GridModelModule(ScheduledOptimization, OOMResilientModule):
    """Trains a grid network on the answer's cells and size, and scores it every validation."""

    # the unit each mean of the loss averages over (keys of unit_counts)
    MEAN_UNITS: Mapping[str, str] = {"cell_ce": "cells", "size_ce": "samples"}

    # predictors scored at every validation (metric-name prefixes), and the extra losses logged
    SCORED: tuple[str, ...] = (MODEL, COPY)
    EXTRA_LOSSES: tuple[str, ...] = ()

    @classmethod
    def logged_metrics(cls, model_cfg: Any = None) -> frozenset[str]:
        """Every metric name a run of this module may log (monitors are checked against it)."""
        losses = ("loss", *cls.MEAN_UNITS, *cls.EXTRA_LOSSES)
        scores = [f"{p}{s}" for p in cls.SCORED for s in SCORE_NAMES]
        names = [f"train/{name}" for name in losses]
        names += [f"{phase}/{name}" for phase in ("val", "test") for name in (*losses, *scores)]
        return frozenset(names)

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        lr_schedule: dict[str, Any] | None = None,
        size_weight: float = 1.0,
        compile: bool = False,
        changed_weight: float = 1.0,
    ) -> None:
        super().__init__()
        self.net = net
        self.init_optimization(optimizer, lr_schedule, compile=compile, network="net")
        if size_weight < 0:
            raise ValueError(f"model.size_weight must be >= 0, got {size_weight}")
        self.size_weight = size_weight
        if changed_weight < 0:
            raise ValueError(f"model.changed_weight must be >= 0, got {changed_weight}")
        self.changed_weight = changed_weight
        self.scoreboard = GridScoreboard()
        self.loss_totals = MeanTotals()
        self.last_scores: dict[str, dict[str, float]] = {}
        self.last_scores_step = -1  # the global step whose weights last_scores scored

    @staticmethod
    def inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The fields a network may read: the answer is not among them."""
        return {key: batch[key] for key in INPUT_KEYS}

    def forward(self, batch: dict[str, torch.Tensor]) -> GridOutput:
        return self.net(self.inputs(batch))

    def _means(self, output: GridOutput, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The means the loss is made of, by name (keys of ``MEAN_UNITS``)."""
        losses = task_loss(
            output, batch, size_weight=self.size_weight, changed_weight=self.changed_weight
        )
        return {name: value for name, value in losses.items() if name in self.MEAN_UNITS}

    def _mean_weights(self) -> dict[str, float]:
        """The weight of each mean in the loss."""
        return {"cell_ce": 1.0, "size_ce": self.size_weight}

    def _losses(
        self, means: Mapping[str, torch.Tensor], loss: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """What is logged as ``<phase>/<name>``: the loss and the means it is made of."""
        return {"loss": loss, **means}

    def _terms_by_unit(self, means: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The loss as one term per unit it averages over; the loss is their sum."""
        weights = self._mean_weights()
        terms = {unit: torch.zeros((), device=self.device) for unit in self.MEAN_UNITS.values()}
        for name, mean in means.items():
            terms[self.MEAN_UNITS[name]] = terms[self.MEAN_UNITS[name]] + weights[name] * mean
        return terms

    def micro_batch_weight(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The units of ``batch`` that each term of the loss averages over: a split training
        step weights every micro-batch's term by its share of them."""
        counts = unit_counts(batch)
        return {unit: counts[unit] for unit in set(self.MEAN_UNITS.values())}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, Any]:
        means = self._means(self(batch), batch)
        terms = self._terms_by_unit(means)
        loss = sum(terms.values())
        self._log_losses("train", self._losses(means, loss), batch)
        return {"loss": loss, LOSS_TERMS: terms}

    def _log_losses(
        self, phase: str, losses: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]
    ) -> None:
        size = batch["tokens"].shape[0]
        for name, value in losses.items():
            self.log(f"{phase}/{name}", value.detach(), batch_size=size, prog_bar=name == "loss")

    def on_validation_epoch_start(self) -> None:
        self.scoreboard.reset()
        self.loss_totals.reset()

    def on_test_epoch_start(self) -> None:
        self.scoreboard.reset()
        self.loss_totals.reset()

    def _evaluate(self, batch: dict[str, torch.Tensor]) -> None:
        output = self(batch)
        means = self._means(output, batch)
        counts = unit_counts(batch)
        self.loss_totals.add(means, {name: counts[unit] for name, unit in self.MEAN_UNITS.items()})
        answer = batch["target"], batch["target_size"], batch["query_grid"]
        self.scoreboard.add(MODEL, predict_grid(output, batch["query_grid"]), *answer)
        self.scoreboard.add(COPY, copy_prediction(batch["query_grid"]), *answer)
        self._score_references(batch)

    def _score_references(self, batch: dict[str, torch.Tensor]) -> None:
        """Score other predictors carried by the batch (none here)."""

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch)

    def _log_scores(self, phase: str) -> None:
        # Sum the counts over processes: the scores are micro averages over the whole set.
        def reduce_sum(counts: torch.Tensor) -> torch.Tensor:
            return self.trainer.strategy.reduce(counts, reduce_op="sum")

        results = self.scoreboard.results(reduce_sum)
        for prefix, scores in results.items():
            for name in SCORE_NAMES:
                self.log(f"{phase}/{prefix}{name}", scores[name], prog_bar=not prefix)
        self.last_scores = results
        # a sanity check scores a few batches: no checkpoint may carry that as its scores
        self.last_scores_step = -1 if self.trainer.sanity_checking else self.trainer.global_step
        means = self.loss_totals.means(reduce_sum)
        if means:
            loss = sum(self._terms_by_unit(means).values())
            for name, value in self._losses(means, loss).items():
                self.log(f"{phase}/{name}", value, prog_bar=name == "loss")

    def on_validation_epoch_end(self) -> None:
        self._log_scores("val")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Scores of other weights (a save before this step's validation) are not these weights'.
        if self.last_scores and self.last_scores_step == self.trainer.global_step:
            checkpoint[SCORES_KEY] = self.last_scores

    def report_figures(self, trainer: Any, samples: int) -> list[ReportFigure]:
        """Query, expected and predicted grids of the best, worst and random validation
        queries (for report.html)."""
        return grid_figures(self, trainer, samples)

    def on_test_epoch_end(self) -> None:
        self._log_scores("test")


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
        changed_weight: float = 1.0,
    ) -> None:
        super().__init__(net, optimizer, lr_schedule, size_weight, compile, changed_weight)
        self.save_hyperparameters(ignore=["net", "optimizer"])
        self.network_config = network_config(net)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[TEACHER_NETWORK_KEY] = self.network_config
