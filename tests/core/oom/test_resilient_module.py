"""Injected OOMs are survived with the same effective batch: the same weights, the same metrics."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from vramkit.core.callbacks.memory.oom_fault_injection import OOMFaultInjection
from vramkit.core.oom.guarded_steps import LAST_RESORT_CHECKPOINT
from vramkit.core.oom.resilient_module import OOMResilientModule

SAMPLES = 16


class _Points(Dataset):
    """A fixed regression set: 4 features, one target."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(SAMPLES, 4, generator=generator)
        self.y = torch.randn(SAMPLES, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index], "name": f"point_{index}"}


class _OOMInBackward(torch.autograd.Function):
    """Identity whose backward pass runs out of memory for more than ``limit`` samples: the
    layers after it have accumulated their gradients by then (AccumulateGrad runs first)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, limit: int) -> torch.Tensor:
        ctx.limit = limit
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if grad.shape[0] > ctx.limit:
            raise torch.cuda.OutOfMemoryError(f"backward of {grad.shape[0]} samples")
        return grad, None


class TinyRegressor(OOMResilientModule):
    def __init__(
        self,
        optimizer: str = "sgd",
        backward_limit: int | None = None,
        limit_from_batch: int = 0,
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(4, 8)
        self.second = nn.Linear(8, 1)
        self.optimizer = optimizer
        self.backward_limit = backward_limit
        self.limit_from_batch = limit_from_batch  # batches before it run without the limit
        self.limit_now: int | None = None
        self.seen_names: list[str] = []
        self.step_sizes: list[int] = []  # samples of each training_step call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.first(x))
        if self.limit_now is not None:
            hidden = _OOMInBackward.apply(hidden, self.limit_now)
        return self.second(hidden).squeeze(-1)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.limit_now = self.backward_limit if batch_idx >= self.limit_from_batch else None
        self.step_sizes.append(len(batch["y"]))
        loss = F.mse_loss(self(batch["x"]), batch["y"])
        self.log("train/loss", loss, on_step=True, on_epoch=True, batch_size=len(batch["y"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        error = (self(batch["x"]) - batch["y"]).abs()
        self.log("val/mae", error.mean(), batch_size=len(error))
        self.log("val/max_error", error.max(), reduce_fx="max")
        self.seen_names.extend(batch["name"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=0.05)
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(
    tmp_path: Path,
    module: TinyRegressor,
    *,
    batch_size: int = 8,
    accumulate: int = 1,
    epochs: int = 1,
    fault: OOMFaultInjection | None = None,
) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        callbacks=[fault] if fault else [],
    )
    loader = DataLoader(_Points(), batch_size=batch_size, shuffle=False)
    trainer.fit(module, train_dataloaders=loader)
    return trainer


def _assert_same_weights(recovered: nn.Module, reference: nn.Module) -> None:
    for (name, value), expected in zip(
        recovered.state_dict().items(), reference.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(value, expected, atol=1e-5, rtol=0, msg=name)


def _moved(module: nn.Module) -> bool:
    return any(
        not torch.equal(p, q)
        for p, q in zip(module.parameters(), TinyRegressor().parameters(), strict=True)
    )


@pytest.mark.parametrize("accumulate", [1, 2])
def test_training_oom_is_redone_in_micro_batches_with_the_same_updates(tmp_path, accumulate):
    batch_size = 8 // accumulate
    reference = TinyRegressor()
    _fit(tmp_path, reference, batch_size=batch_size, accumulate=accumulate)
    recovered = TinyRegressor()
    trainer = _fit(
        tmp_path,
        recovered,
        batch_size=batch_size,
        accumulate=accumulate,
        fault=OOMFaultInjection(oom_train_above=batch_size // 2),
    )
    assert _moved(reference)
    _assert_same_weights(recovered, reference)
    assert recovered.oom_state.train_micro_batch == batch_size // 2  # kept for later batches
    assert recovered.oom_state.train_recoveries == 1
    metrics = trainer.callback_metrics
    assert metrics["oom/train_micro_batch"] == batch_size // 2
    assert metrics["oom/train_accumulation"] == 2 * accumulate
    # the merged per-step logs give the loss of the whole batch, as without the split
    assert metrics["train/loss_epoch"] == pytest.approx(float(_epoch_loss(reference)), abs=1e-5)


def _epoch_loss(reference: TinyRegressor) -> torch.Tensor:
    # The logged training loss is the mean over the epoch's batches, each computed before its
    # update; recompute it by replaying the fit without the guard's help.
    module = TinyRegressor()
    optimizer = module.configure_optimizers()
    data = _Points()
    losses = []
    for start in range(0, SAMPLES, 8):
        loss = F.mse_loss(module(data.x[start : start + 8]), data.y[start : start + 8])
        losses.append(loss.detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    _assert_same_weights(module, reference)
    return torch.stack(losses).mean()


@pytest.mark.parametrize("accumulate", [1, 2])
def test_oom_in_the_middle_of_backward_adds_each_gradient_once(tmp_path, accumulate):
    reference = TinyRegressor(backward_limit=None)
    _fit(tmp_path, reference, batch_size=4, accumulate=accumulate, epochs=2)
    # With accumulation the second batch of each window fails: its gradients add to the
    # first batch's, which the redo must keep.
    recovered = TinyRegressor(backward_limit=2, limit_from_batch=accumulate - 1)
    _fit(tmp_path, recovered, batch_size=4, accumulate=accumulate, epochs=2)
    # `second` had its gradient when the backward pass failed; a redo that added it again
    # would move it by twice the step.
    assert _moved(reference)
    _assert_same_weights(recovered, reference)
    assert recovered.oom_state.train_micro_batch == 2


def test_a_whole_batch_that_ran_out_of_memory_is_not_tried_again(tmp_path):
    module = TinyRegressor(backward_limit=4)
    _fit(tmp_path, module, batch_size=8)
    # first batch: the whole batch fails in its backward pass, then its two halves; the second
    # batch starts with the halves. Trying the whole batch twice would show as [8, 8, 4, 4, ...]
    assert module.step_sizes == [8, 4, 4, 4, 4]
    assert (module.oom_state.train_recoveries, module.oom_state.last_resorts) == (1, 0)


class _CountsItsLogCalls(TinyRegressor):
    def __init__(self) -> None:
        super().__init__()
        self.log_calls = 0

    def log(self, name: str, value, *args, **kwargs) -> None:
        self.log_calls += 1
        super().log(name, value, *args, **kwargs)


@pytest.mark.parametrize("oom_train_above", [None, 4])
def test_a_log_override_runs_once_per_call(tmp_path, oom_train_above):
    module = _CountsItsLogCalls()
    fault = OOMFaultInjection(oom_train_above=oom_train_above) if oom_train_above else None
    _fit(tmp_path, module, batch_size=8, fault=fault)
    # one self.log per training_step call (a split step calls it once per micro-batch); the
    # split step adds its own oom/* metrics through the module's log
    oom_metrics = 4 * module.oom_state.train_recoveries * (SAMPLES // 8)
    assert module.log_calls == len(module.step_sizes) + oom_metrics


def test_last_resort_saves_a_checkpoint_and_continues_from_it(tmp_path, caplog):
    reference = TinyRegressor(optimizer="adamw")
    _fit(tmp_path / "reference", reference, epochs=2)
    recovered = TinyRegressor(optimizer="adamw")
    with caplog.at_level(logging.WARNING):
        trainer = _fit(
            tmp_path / "recovered",
            recovered,
            epochs=2,
            fault=OOMFaultInjection(oom_train_above=2),
        )
    # 8 fails, 4 fails again: the last resort, then micro-batches of 2 with 4x accumulation
    state = recovered.oom_state
    assert (state.train_micro_batch, state.train_recoveries, state.last_resorts) == (2, 2, 1)
    checkpoint_path = tmp_path / "recovered" / "checkpoints" / LAST_RESORT_CHECKPOINT
    assert state.last_resort_checkpoint == str(checkpoint_path)
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["epoch"] == 0 and checkpoint["global_step"] == 0
    # AdamW's moments went through the file and back: the run still matches the reference
    _assert_same_weights(recovered, reference)
    assert trainer.callback_metrics["oom/last_resorts"] == 1
    assert trainer.callback_metrics["oom/train_accumulation"] == 4
    assert "hw.batch_size=2 hw.accumulate_grad_batches=4" in caplog.text


def test_a_sample_that_never_fits_stops_the_run_with_advice(tmp_path):
    module = TinyRegressor(backward_limit=0)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="nothing smaller is left"):
        _fit(tmp_path, module)
    assert (tmp_path / "checkpoints" / LAST_RESORT_CHECKPOINT).is_file()


def _validate(module: TinyRegressor, fault: OOMFaultInjection | None) -> dict[str, float]:
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[fault] if fault else [],
    )
    loader = DataLoader(_Points(), batch_size=8, shuffle=False)
    (metrics,) = trainer.validate(module, dataloaders=loader, verbose=False)
    return metrics


def test_validation_oom_runs_the_batch_in_halves_with_the_same_metrics():
    reference = _validate(TinyRegressor(), None)
    module = TinyRegressor()
    recovered = _validate(module, OOMFaultInjection(oom_val_above=3))
    for name in ("val/mae", "val/max_error"):
        assert recovered[name] == pytest.approx(reference[name], abs=1e-6)
    # 8 failed, then 4: the second batch ran directly in micro-batches of 2
    assert recovered["oom/val_recoveries"] == 2
    assert recovered["oom/val_micro_batch"] == 2
    assert module.oom_state.val_micro_batch == 2
    # every sample validated exactly once, in order
    assert module.seen_names == [f"point_{i}" for i in range(SAMPLES)]


def test_fault_switch_refuses_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="oom_trian_above"):
        OOMFaultInjection.from_config({"oom_trian_above": 2})
    with pytest.raises(ValueError, match=r"fault\.oom_val_above: must be ≥ 1 or null, got 0"):
        OOMFaultInjection.from_config({"oom_val_above": 0})
    assert not OOMFaultInjection.from_config(None).active


class MaskedRegressor(TinyRegressor):
    """A loss adding a mean over the valid targets (a mask) to a mean over samples: a split
    must weight each term by the micro-batch's share of its own units."""

    def __init__(self, with_terms: bool = True) -> None:
        super().__init__()
        self.with_terms = with_terms

    def training_step(self, batch: dict, batch_idx: int) -> dict:
        prediction = self(batch["x"])
        # valid: 2 of the first batch's 8 samples, as 0, 0, 1, 1 in micro-batches of 2
        valid = batch["x"][:, 0] > 0.5
        masked = ((prediction - batch["y"]) ** 2 * valid).sum() / valid.sum().clamp(min=1)
        per_sample = 0.1 * prediction.abs().mean()
        terms = {"valid": masked, "samples": per_sample}
        output = {"loss": masked + per_sample}
        return {**output, "loss_terms": terms} if self.with_terms else output

    def micro_batch_weight(self, batch: dict) -> dict[str, torch.Tensor]:
        return {"valid": (batch["x"][:, 0] > 0.5).sum(), "samples": torch.tensor(len(batch["x"]))}


def test_a_loss_of_means_over_different_units_is_split_term_by_term(tmp_path):
    reference = MaskedRegressor()
    _fit(tmp_path, reference)
    recovered = MaskedRegressor()
    _fit(tmp_path, recovered, fault=OOMFaultInjection(oom_train_above=2))
    assert recovered.oom_state.train_micro_batch == 2
    assert _moved(reference)
    _assert_same_weights(recovered, reference)


def test_per_unit_weights_without_the_terms_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="must return them as"):
        _fit(
            tmp_path, MaskedRegressor(with_terms=False), fault=OOMFaultInjection(oom_train_above=2)
        )
