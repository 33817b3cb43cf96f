"""The trace zeroes gradients through the module's own `optimizer_zero_grad`, where Lightning does.

lightning/pytorch/loops/optimization/automatic.py: the closure runs `training_step`, then
`zero_grad_fn` (built by `_make_zero_grad_fn` only when `batch_idx % accumulate_grad_batches == 0`,
calling `LightningModule.optimizer_zero_grad(current_epoch, batch_idx, optimizer)`), then backward.
A module that keeps its gradients (`set_to_none=False`) holds them through the backward pass.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.cuda.cuda_rules import round_allocation
from vramkit.core.planner.tracing.fake_trace import (
    FakeStepRecorder,
    StepTrace,
    cuda_semantics,
    trace_training,
)
from vramkit.core.planner.tracing.recorder import GRADIENTS
from vramkit.core.planner.tracing.run_setup import RunSetup


class _ActivationHeavy(L.LightningModule):
    """Three 512-wide layers on 2048 rows: activations (4 MiB each) dwarf the 3 MiB of
    parameters, so a training step peaks in its backward pass."""

    def __init__(self, set_to_none: bool | None) -> None:
        super().__init__()
        self.set_to_none = set_to_none
        self.layers = nn.Sequential(
            nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)
        )
        self.calls: list[tuple[str, int]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.calls.append(("training_step", batch_idx))
        return self.layers(batch).square().mean()

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer) -> None:
        self.calls.append(("optimizer_zero_grad", batch_idx))
        if self.set_to_none is None:
            super().optimizer_zero_grad(epoch, batch_idx, optimizer)  # Lightning's own
        else:
            optimizer.zero_grad(set_to_none=self.set_to_none)


def _trace(set_to_none: bool | None, accumulate: int = 1) -> tuple[StepTrace, _ActivationHeavy]:
    fake_mode = FakeTensorMode()
    with fake_mode:
        module = _ActivationHeavy(set_to_none)
        optimizer = torch.optim.AdamW(module.parameters())
        batch = torch.randn(2048, 512)
    setup = RunSetup(precision="32-true", device=None, accumulate_grad_batches=accumulate)
    with cuda_semantics(setup) as (semantics, _), fake_mode:
        recorder = FakeStepRecorder(scalar_stand_in=8, round_to_device=True, keep_timeline=False)
        return trace_training(module, optimizer, batch, recorder, semantics), module


def test_gradients_kept_by_the_module_are_alive_at_a_backward_peak():
    default, module = _trace(None)
    kept, _ = _trace(False)
    gradients = sum(round_allocation(p.numel() * p.element_size()) for p in module.parameters())
    assert default.peak_at == kept.peak_at == "step 2: backward"
    assert default.breakdown[GRADIENTS] == 0  # Lightning's default freed them after the forward
    assert kept.breakdown[GRADIENTS] == gradients
    assert kept.peak_bytes - default.peak_bytes == gradients


def test_lightnings_default_hook_frees_the_gradients_as_set_to_none_does():
    default, _ = _trace(None)
    freed, _ = _trace(True)
    assert default.peak_bytes == freed.peak_bytes


def test_the_hook_runs_after_the_first_forward_of_each_accumulation_window():
    _, module = _trace(True, accumulate=4)
    # Two windows of two traced micro-batches each: batches 0, 1 and 4, 5.
    assert module.calls == [
        ("training_step", 0),
        ("optimizer_zero_grad", 0),
        ("training_step", 1),
        ("training_step", 4),
        ("optimizer_zero_grad", 4),
        ("training_step", 5),
    ]
