"""In-place value writes skip the fake dispatch; everything else still runs through it."""

from __future__ import annotations

import pytest
import torch
from fake_traces import assert_same_trace, traced_steps
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.shortcuts.in_place_writes import writes_values_only
from vramkit.core.planner.tracing import fake_trace
from vramkit.core.planner.tracing.fake_trace import FakeStepRecorder

aten = torch.ops.aten


def _dispatched() -> int:
    info = FakeTensorMode.cache_info()
    return info.hits + info.misses + sum(info.bypasses.values())


def _recorder() -> FakeStepRecorder:
    return FakeStepRecorder(scalar_stand_in=1, round_to_device=False, keep_timeline=False)


@pytest.mark.parametrize(
    ("op", "skipped"),
    [
        (aten.add_.Tensor, True),
        (aten.relu_.default, True),
        (aten._foreach_addcdiv_.ScalarList, True),
        (aten._amp_foreach_non_finite_check_and_unscale_.default, True),
        (aten.add.Tensor, False),  # a fresh output
        (aten.add.out, False),  # may resize its `out`
        (aten.t_.default, False),  # changes strides
        (aten.resize_.default, False),  # changes the storage
        (aten.set_.source_Tensor, False),
    ],
)
def test_which_ops_only_write_values(op, skipped):
    with FakeTensorMode():
        tensor = torch.empty(4, 4)
    args = ([tensor],) if op.__name__.startswith("_foreach") else (tensor,)
    assert writes_values_only(op, args, {}) is skipped


def test_a_value_write_on_a_fake_tensor_returns_it_without_a_fake_dispatch():
    with FakeTensorMode():
        weights = torch.empty(8, 8)
        other = torch.empty(8, 8)
        with _recorder():
            before = _dispatched()
            result = weights.add_(other)
            torch._foreach_mul_([weights, other], 0.5)
            after = _dispatched()
            product = weights @ other  # not in place: the fake mode runs it
    assert result is weights
    assert after == before
    assert _dispatched() > after and product.shape == (8, 8)


def test_a_constant_is_still_written_so_host_values_stay_right():
    # Adam's step counters are fake constants: the bias correction reads them with `.item()`.
    with FakeTensorMode():
        step = torch.tensor(0.0)
        with _recorder():
            step.add_(1)
            torch._foreach_add_([step], 1)
            value = step.item()
    assert value == 2.0


def test_a_real_tensor_is_written_for_real():
    real = torch.zeros(3)
    assert not writes_values_only(aten.add_.Tensor, (real, torch.ones(3)), {})


def _adam_trace(monkeypatch, *, skip: bool):
    if not skip:
        monkeypatch.setattr(fake_trace, "writes_values_only", lambda *_: False)
    trace, recorder = traced_steps(
        lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
        lambda: torch.empty(8, 16),
    )
    return trace, recorder.op_names


def test_skipping_value_writes_leaves_the_traced_step_unchanged(monkeypatch):
    skipped, skipped_ops = _adam_trace(monkeypatch, skip=True)
    monkeypatch.undo()
    ran, ran_ops = _adam_trace(monkeypatch, skip=False)
    assert_same_trace(skipped, ran)
    assert skipped_ops == ran_ops and "_foreach_addcdiv_.ScalarList" in ran_ops


def test_a_constant_is_read_without_a_fake_dispatch():
    with FakeTensorMode():
        step = torch.tensor(3.0)
        with _recorder():
            before = _dispatched()
            value = step.item()
            after = _dispatched()
    assert value == 3.0 and after == before
