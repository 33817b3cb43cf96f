"""One host read per optimizer step: the loss Lightning backpropagates is checked with the
gradients, and when that check finds something, the loss, the gradients or both are named
exactly as when each was read on its own."""

from __future__ import annotations

import logging
import math

import lightning as L
import pytest
import torch
from tiny_regression import TinyRegression, regression_loader

from vramkit.core.callbacks import finite_guard
from vramkit.core.callbacks.finite_guard import FiniteGuard, TrainingDiverged

BAD_STEP = 2  # 0-based global_step of the batch that goes wrong


class Broken(TinyRegression):
    """TinyRegression whose batch at ``BAD_STEP`` has a NaN loss term without a gradient
    (``loss``), a NaN gradient with a finite loss (``gradient``), or a NaN through the graph
    (``both``)."""

    def __init__(self, what: str = "") -> None:
        super().__init__()
        self.what = what

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.global_step != BAD_STEP or self.what not in ("loss", "both"):
            return loss
        return loss + torch.tensor(math.nan) if self.what == "loss" else loss * math.nan

    def on_after_backward(self) -> None:
        if self.global_step == BAD_STEP and self.what == "gradient":
            self.net.weight.grad[0, 0] = math.nan


class ManualBroken(Broken):
    """The same under manual optimization, whose returned loss the guard reads on its own."""

    def __init__(self, what: str = "") -> None:
        super().__init__(what)
        self.automatic_optimization = False

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        self.on_after_backward()
        optimizer.step()
        return loss


def _fit(model: L.LightningModule, guard: FiniteGuard, accumulate: int = 1) -> L.Trainer:
    trainer = L.Trainer(
        max_epochs=1,
        callbacks=[guard],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=accumulate,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, regression_loader(16, 2))
    return trainer


@pytest.mark.parametrize(
    ("what", "named"),
    [("loss", "loss (nan) at step 3 "), ("gradient", "gradients at step 3 ")],
)
def test_stop_names_the_loss_or_the_gradients_that_are_not_finite(what, named) -> None:
    with pytest.raises(TrainingDiverged) as stopped:
        _fit(Broken(what), FiniteGuard())
    assert str(stopped.value).startswith(f"training diverged: non-finite {named}")


@pytest.mark.parametrize(
    ("what", "named"),
    [("loss", "loss (nan)"), ("gradient", "gradients"), ("both", "loss (nan) and gradients")],
)
def test_skip_step_names_what_is_not_finite_and_counts_it_once(what, named, caplog) -> None:
    guard = FiniteGuard(on_non_finite="skip_step")
    with caplog.at_level(logging.WARNING, logger="vramkit.core.callbacks.finite_guard"):
        _fit(Broken(what), guard)
    assert f"non-finite {named} at step 3 (epoch 0): optimizer step skipped" in caplog.text
    assert guard.skipped_steps == 1
    assert guard.non_finite_in_a_row == 0  # the steps after it were finite


def test_a_nan_loss_inside_an_accumulation_window_stops_at_its_own_batch() -> None:
    model = Broken("loss")
    with pytest.raises(TrainingDiverged, match=r"non-finite loss \(nan\) at step 2 "):
        # batches 4 and 5 make step 3 (0-based global_step 2): the NaN is in batch 4
        _fit(model, FiniteGuard(), accumulate=2)
    assert model.trainer.fit_loop.epoch_loop.batch_progress.current.completed == 4


@pytest.mark.parametrize(
    ("model", "accumulate", "loss_reads"),
    [(Broken(), 1, 0), (Broken(), 2, 4), (ManualBroken(), 1, 8)],
    ids=["automatic", "accumulating", "manual"],
)
def test_the_loss_is_read_alone_only_where_it_is_not_checked_with_the_gradients(
    model, accumulate, loss_reads, monkeypatch
) -> None:
    reads = {"loss": 0, "gradients": 0}

    def counted(name, function):
        def count(*args):
            reads[name] += 1
            return function(*args)

        return count

    monkeypatch.setattr(finite_guard, "_finite_loss", counted("loss", finite_guard._finite_loss))
    monkeypatch.setattr(finite_guard, "all_finite", counted("gradients", finite_guard.all_finite))
    _fit(model, FiniteGuard(), accumulate)
    assert reads == {"loss": loss_reads, "gradients": 8 // accumulate}


class ClosureRunsAgain(TinyRegression):
    """TinyRegression under L-BFGS, which runs the training step several times per optimizer
    step (twice here): the second run of the first step has a NaN loss term without a
    gradient, after the first one was checked."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.runs += 1
        loss = super().training_step(batch, batch_idx)
        return loss + torch.tensor(math.nan) if self.runs == 2 else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=2)


def test_the_loss_of_a_closure_run_again_after_the_check_is_checked() -> None:
    model = ClosureRunsAgain()
    with pytest.raises(TrainingDiverged, match=r"non-finite loss \(nan\) at step 1 "):
        _fit(model, FiniteGuard())
    assert model.runs == 2
