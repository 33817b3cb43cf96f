"""Training traces for the tests that check a planner shortcut leaves a trace as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.shortcuts.output_memo import OutputMemo
from vramkit.core.planner.tracing import fake_trace
from vramkit.core.planner.tracing.fake_trace import (
    FakeStepRecorder,
    StepTrace,
    cuda_semantics,
    trace_training,
)
from vramkit.core.planner.tracing.run_setup import RunSetup


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
