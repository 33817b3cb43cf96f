"""Traces the planner tests share: training steps for the tests that check a planner shortcut
leaves a trace as it was, and steps of the padded encoder (`planning_models.PaddedEncoder`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.config.instantiate import instantiate
from vramkit.core.planner.cuda.cuda_rules import DeviceRules
from vramkit.core.planner.shortcuts.output_memo import OutputMemo
from vramkit.core.planner.tracing import fake_trace
from vramkit.core.planner.tracing.batches import grow_batch
from vramkit.core.planner.tracing.fake_trace import (
    FakeStepRecorder,
    StepTrace,
    cuda_semantics,
    trace_training,
)
from vramkit.core.planner.tracing.run_setup import RunSetup
from vramkit.core.planner.tracing.subject import build_module, build_optimizer


def traced_steps(
    make_module: Callable[[], nn.Module],
    make_batch: Callable[[], torch.Tensor],
    *,
    precision: str = "16-mixed",
    foreach: bool = True,
    output_memo: OutputMemo | None = None,
) -> tuple[StepTrace, FakeStepRecorder]:
    """Two AdamW training steps of `make_module()` on `make_batch()`, both made on fake tensors,
    recorded as a GPU plan records them (device rounding, timeline kept)."""
    torch.manual_seed(0)
    fake_mode = FakeTensorMode()
    with fake_mode:
        module = make_module()
        module.training_step = lambda batch, _: module(batch).square().mean()
        optimizer = torch.optim.AdamW(module.parameters(), foreach=foreach, weight_decay=0.1)
        batch = make_batch()
    with cuda_semantics(RunSetup(precision=precision, device=None)) as (semantics, _), fake_mode:
        recorder = FakeStepRecorder(
            scalar_stand_in=8, round_to_device=True, keep_timeline=True, output_memo=output_memo
        )
        trace = trace_training(module, optimizer, batch, recorder, semantics)
    return trace, recorder


def traced_padded_encoder(
    trace: Callable[..., StepTrace],
    *,
    device: DeviceRules,
    precision: str,
    batch: int,
    length: int,
    width: int,
    **net: Any,
) -> StepTrace:
    """One step (`trace_training` or `trace_validation`) of the padded encoder, built as a plan
    builds the task's module, on `batch` unpadded sequences of `length` tokens of `width`
    features; `net` goes to the encoder (`heads`, `layers`, ...)."""
    setup = RunSetup(precision=precision, device=device)
    fake_mode = FakeTensorMode()
    model = OmegaConf.create(
        {
            "_target_": "planning_models.PaddedEncoder",
            "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True},
            "width": width,
            **net,
        }
    )
    module = build_module(lambda: instantiate(model), setup, fake_mode)
    one = {
        "tokens": torch.randn(1, length, width),
        "padding": torch.zeros(1, length, dtype=torch.bool),
        "label": torch.tensor([3]),
    }
    with cuda_semantics(setup) as (semantics, _), fake_mode:
        grown = grow_batch(one, batch)
        optimizer = build_optimizer(module, setup)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        return trace(module, optimizer, grown, recorder, semantics)


def assert_same_trace(direct: StepTrace, dispatched: StepTrace) -> None:
    """The two traces allocate and free the same bytes in the same order, to the same peak."""
    assert direct.timeline == dispatched.timeline
    assert direct.events == dispatched.events
    assert (direct.peak_bytes, direct.peak_at) == (dispatched.peak_bytes, dispatched.peak_at)


def _counting(made: list[bool], rule: Callable[..., Any]) -> Callable[..., Any]:
    """`rule`, noting in `made` whether each call answered (not the answer: a reference would
    keep the tensors alive and change the trace)."""

    def counted(*args: Any) -> Any:
        output = rule(*args)
        made.append(output is not None)
        return output

    return counted


def traced_with_and_without(
    monkeypatch: Any,
    shortcut: str,
    make_module: Callable[[], nn.Module],
    make_batch: Callable[[], torch.Tensor],
    **options: Any,
) -> tuple[StepTrace, StepTrace, int]:
    """`traced_steps` twice: with `fake_trace.<shortcut>` as it is, then with it answering
    nothing (every op through the fake mode); and how many ops the shortcut answered."""
    rule = getattr(fake_trace, shortcut)
    made: list[bool] = []
    monkeypatch.setattr(fake_trace, shortcut, _counting(made, rule))
    direct, _ = traced_steps(make_module, make_batch, **options)
    monkeypatch.setattr(fake_trace, shortcut, lambda *_: None)
    dispatched, _ = traced_steps(make_module, make_batch, **options)
    monkeypatch.setattr(fake_trace, shortcut, rule)
    return direct, dispatched, sum(made)
