"""Finite or stopped: a NaN loss or gradient stops the run (or is skipped, or rolled back), a NaN
metric is never best, and no checkpoint with non-finite weights is written."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from tiny_regression import TinyRegression, regression_loader
from torch.nn import functional as F

from vramkit.core.callbacks.checkpoints.finite_model_checkpoint import FiniteModelCheckpoint
from vramkit.core.callbacks.checkpoints.resume_checkpoint import ResumeCheckpoint
from vramkit.core.callbacks.finite_guard import (
    FiniteGuard,
    TrainingDiverged,
    all_finite,
)
from vramkit.core.config.schema import ConfigError
from vramkit.core.run.refusal.exit_codes import EXIT_DIVERGED, refusals_as_messages

STEPS_PER_EPOCH = 4  # 16 samples in batches of 4


class Diverging(TinyRegression):
    """TinyRegression whose loss is NaN at the given optimizer steps (0-based ``global_step``)
    and whose validation loss is NaN in the given epochs; records its weights after each step."""

    def __init__(self, nan_steps: set[int] = frozenset(), nan_val_epochs: set[int] = frozenset()):
        super().__init__()
        self.nan_steps, self.nan_val_epochs = set(nan_steps), set(nan_val_epochs)
        self.weights_after: dict[int, torch.Tensor] = {}

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if self.global_step in self.nan_steps else loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        loss = F.mse_loss(self.net(x).squeeze(-1), y)
        self.log("val/loss", loss * math.nan if self.current_epoch in self.nan_val_epochs else loss)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self.weights_after[self.global_step] = self.net.weight.detach().clone()


def _fit(folder: Path, model: L.LightningModule, guard: L.Callback | None, epochs: int = 2):
    last = ResumeCheckpoint(dirpath=str(folder), every_n_train_steps=1, min_interval_s=0)
    best = FiniteModelCheckpoint(dirpath=str(folder), monitor="val/loss", mode="min")
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=[c for c in (guard, best, last) if c is not None],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(folder),
        num_sanity_val_steps=0,
    )
    trainer.fit(model, regression_loader(16, 4), regression_loader(8, 4))
    return trainer, best, last


def _finite_weights(path: Path) -> bool:
    state = torch.load(path, weights_only=False)["state_dict"]
    return all(bool(torch.isfinite(t).all()) for t in state.values())


def test_a_nan_loss_stops_the_run_and_keeps_the_last_finite_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(TrainingDiverged) as stopped:
        _fit(tmp_path, Diverging(nan_steps={5}), FiniteGuard())
    last = tmp_path / "last.ckpt"
    assert str(stopped.value).startswith("training diverged: non-finite gradients at step 6 ")
    assert "(epoch 1)" in str(stopped.value)
    assert f"the last finite checkpoint is {last}" in str(stopped.value)
    assert torch.load(last, weights_only=False)["global_step"] == 5  # the step before the NaN
    files = sorted(tmp_path.glob("*.ckpt"))
    assert files and all(_finite_weights(path) for path in files)


def test_without_the_guard_the_same_run_writes_nan_checkpoints(tmp_path: Path) -> None:
    # What the guard prevents (the report): NaN weights saved as last.ckpt.
    _fit(tmp_path, Diverging(nan_steps={5}), guard=None)
    assert not _finite_weights(tmp_path / "last.ckpt")


def test_skip_step_drops_the_step_and_goes_on(tmp_path: Path, caplog) -> None:
    model, guard = Diverging(nan_steps={5}), FiniteGuard(on_non_finite="skip_step")
    with caplog.at_level(logging.WARNING, logger="vramkit.core.callbacks.finite_guard"):
        trainer, _, _ = _fit(tmp_path, model, guard)
    assert trainer.global_step == 2 * STEPS_PER_EPOCH
    assert guard.skipped_steps == 1
    assert torch.equal(model.weights_after[6], model.weights_after[5])  # step 6 skipped
    assert not torch.equal(model.weights_after[7], model.weights_after[6])
    assert "optimizer step skipped (1 in a row, 1 in all" in caplog.text
    assert all(_finite_weights(path) for path in tmp_path.glob("*.ckpt"))


def test_skip_step_stops_after_too_many_in_a_row(tmp_path: Path) -> None:
    guard = FiniteGuard(on_non_finite="skip_step", max_non_finite_in_a_row=2)
    with pytest.raises(TrainingDiverged, match=r"at step 7 \(epoch 1\) after 3 in a row"):
        _fit(tmp_path, Diverging(nan_steps={4, 5, 6}), guard)


def test_rollback_reloads_the_last_checkpoint_and_halves_the_learning_rate(
    tmp_path: Path, caplog
) -> None:
    model, guard = Diverging(nan_steps={5}), FiniteGuard(on_non_finite="rollback")
    with caplog.at_level(logging.WARNING, logger="vramkit.core.callbacks.finite_guard"):
        trainer, _, _ = _fit(tmp_path, model, guard)
    assert guard.rollbacks == 1
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05)
    # Rolled back to last.ckpt of step 5, the newest checkpoint then.
    assert torch.equal(model.weights_after[6], model.weights_after[5])
    assert "rolled back to the weights, buffers and optimizer state of" in caplog.text
    assert "halved the learning rate (now 0.05" in caplog.text


class NaNStateAt(TinyRegression):
    """TinyRegression with a buffer and a parameter the loss never reads; the one named
    ``which`` turns NaN in the forward of optimizer step ``step`` (0-based), while the loss and
    gradients stay finite (the issue's "stops after 0 in a row")."""

    def __init__(self, which: str, step: int) -> None:
        super().__init__()
        self.register_buffer("running", torch.ones(2))
        self.unused = torch.nn.Parameter(torch.ones(2))
        self.which, self.step = which, step
        self.state_after: dict[int, torch.Tensor] = {}

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_step == self.step:
            with torch.no_grad():
                getattr(self, self.which).fill_(math.nan)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self.state_after[self.global_step] = getattr(self, self.which).detach().clone()


@pytest.mark.parametrize("which", ["running", "unused"])
def test_rollback_restores_a_non_finite_buffer_or_weight(tmp_path: Path, which, caplog) -> None:
    model, guard = NaNStateAt(which, step=5), FiniteGuard(on_non_finite="rollback")
    with caplog.at_level(logging.WARNING, logger="vramkit.core.callbacks.finite_guard"):
        trainer, _, _ = _fit(tmp_path, model, guard)
    assert trainer.global_step == 2 * STEPS_PER_EPOCH  # went on to the end
    assert guard.rollbacks == 1
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05)
    assert torch.equal(getattr(model, which).detach(), torch.ones(2))
    assert f"non-finite weights ({which}) at step 6 (epoch 1): rolled back" in caplog.text
    assert all(_finite_weights(path) for path in tmp_path.glob("*.ckpt"))


@pytest.mark.parametrize("which", ["running", "unused"])
def test_skip_step_undoes_a_non_finite_buffer_or_weight_keeping_the_rate(
    tmp_path: Path, which, caplog
) -> None:
    model, guard = NaNStateAt(which, step=5), FiniteGuard(on_non_finite="skip_step")
    with caplog.at_level(logging.WARNING, logger="vramkit.core.callbacks.finite_guard"):
        trainer, _, _ = _fit(tmp_path, model, guard)
    assert trainer.global_step == 2 * STEPS_PER_EPOCH
    assert (guard.skipped_steps, guard.rollbacks) == (1, 0)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1)
    assert all(bool(torch.isfinite(state).all()) for state in model.state_after.values())
    assert "learning rate kept (now 0.1; 1 in a row" in caplog.text


def test_stop_names_a_non_finite_buffer_without_a_count_in_a_row(tmp_path: Path) -> None:
    # The default checks weights only where a checkpoint is written: no per-step cost.
    with pytest.raises(TrainingDiverged) as stopped:
        _fit(tmp_path, NaNStateAt("running", step=5), FiniteGuard())
    assert "non-finite weights at step 6 (epoch 1) (the checkpoint" in str(stopped.value)
    assert "in a row" not in str(stopped.value)


def test_a_nan_metric_is_never_best(tmp_path: Path) -> None:
    # Lightning's ModelCheckpoint keeps any value while it holds fewer than save_top_k files:
    # a first validation at NaN became the "best" checkpoint.
    _, best, _ = _fit(tmp_path, Diverging(nan_val_epochs={0}), FiniteGuard(), epochs=1)
    assert best.best_model_path == ""
    assert best.best_model_score is None
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["last.ckpt"]


def test_a_checkpoint_with_non_finite_weights_is_not_written() -> None:
    trainer = SimpleNamespace(
        ckpt_path=None, checkpoint_callbacks=[], global_step=3, current_epoch=0
    )
    checkpoint = {"state_dict": {"w": torch.tensor([1.0, math.inf]), "n": torch.tensor([2])}}
    with pytest.raises(TrainingDiverged, match=r"non-finite weights at step 3 .*not written"):
        FiniteGuard().on_save_checkpoint(trainer, None, checkpoint)
    FiniteGuard().on_save_checkpoint(trainer, None, {"state_dict": {"w": torch.ones(2)}})


def test_the_fused_gradient_check_finds_nan_and_inf_and_changes_nothing() -> None:
    grads = [torch.randn(3, 3), torch.randn(5, dtype=torch.float64)]
    before = [g.clone() for g in grads]
    assert all_finite(grads)
    assert all(torch.equal(a, b) for a, b in zip(grads, before, strict=True))
    grads[1][2] = math.inf
    assert not all_finite(grads)
    grads[1][2], grads[0][1, 1] = 0.0, math.nan
    assert not all_finite(grads)


def test_a_learning_rate_whose_step_overflows_is_refused(tmp_path: Path) -> None:
    class Overflowing(TinyRegression):
        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e38)

    with pytest.raises(ConfigError, match=r"learning rate 1e\+38 .* lower the learning rate"):
        _fit(tmp_path, Overflowing(), FiniteGuard())


def test_a_diverged_run_exits_with_its_own_status(capsys) -> None:
    with pytest.raises(SystemExit) as exited, refusals_as_messages():
        raise TrainingDiverged("training diverged: non-finite loss at step 2 (epoch 0)")
    assert exited.value.code == EXIT_DIVERGED == 3
    assert (
        capsys.readouterr().err == "error: training diverged: non-finite loss at step 2 (epoch 0)\n"
    )


def test_a_bad_setting_is_refused_naming_the_key_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"callbacks\.finite_guard\.on_non_finite: 'skip' is not"):
        FiniteGuard(on_non_finite="skip")
