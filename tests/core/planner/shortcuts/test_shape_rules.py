"""Batch norm's shape rules give exactly what the fake mode gives, and step aside otherwise."""

from __future__ import annotations

import itertools

import pytest
import torch
from fake_metadata import metadata
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.shortcuts import shape_rules
from vramkit.core.planner.shortcuts.shape_rules import FALL_BACK, batch_norm, batch_norm_backward
from vramkit.core.planner.tracing.fake_trace import FakeStepRecorder

aten = torch.ops.aten
MASKS = [(True, True, True), (False, True, True), (True, False, False), (True, False, True)]
SHAPES = {
    2: [(4, 3)],
    3: [(2, 3, 5), (1, 3, 5)],
    4: [(2, 3, 4, 5), (1, 3, 4, 5), (2, 3, 1, 1)],
    5: [(2, 3, 2, 4, 5), (1, 3, 1, 4, 5)],
}
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}
LAYOUTS = [(ndim, "contiguous") for ndim in SHAPES] + [(4, "channels_last"), (5, "channels_last")]
# A half input with fp32 affine parameters and statistics is what autocast hands batch norm.
PARAMETER_DTYPES = ["none", "float32", "same"]


def _input(shape, layout, dtype):
    value = torch.empty(shape, dtype=dtype)
    if layout == "channels_last":
        value = value.contiguous(memory_format=CHANNELS_LAST[len(shape)])
        if value.is_contiguous():  # a size-1 dim makes it both: the rule leaves it to the mode
            return None
    return value


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("ndim", "layout"), LAYOUTS)
def test_outputs_match_the_fake_mode(ndim, layout, dtype):
    compared = 0
    with FakeTensorMode():
        for shape, parameters in itertools.product(SHAPES[ndim], PARAMETER_DTYPES):
            x = _input(shape, layout, dtype)
            if x is None:
                continue
            channels = shape[1]
            param_dtype = {"none": None, "float32": torch.float32, "same": dtype}[parameters]
            weight = None if param_dtype is None else torch.empty(channels, dtype=param_dtype)
            stats_dtype = param_dtype or torch.float32
            running = (
                torch.empty(channels, dtype=stats_dtype),
                torch.empty(channels, dtype=stats_dtype),
            )
            for training, with_stats in [(True, True), (True, False), (False, True)]:
                mean, var = running if with_stats else (None, None)
                args = (x, weight, weight, mean, var, training, 0.1, 1e-5)
                expected = aten.native_batch_norm(*args)
                got = batch_norm(*args)
                assert got is not FALL_BACK, (shape, layout, parameters, training)
                assert [metadata(t) for t in got] == [metadata(t) for t in expected]
                assert all(t.fake_mode is x.fake_mode for t in got)
                grad_out = torch.empty_like(expected[0])
                for mask in MASKS:
                    args = (grad_out, x, weight, mean, var, *expected[1:], training, 1e-5, mask)
                    want = aten.native_batch_norm_backward(*args)
                    have = batch_norm_backward(*args)
                    assert have is not FALL_BACK, (shape, layout, parameters, training, mask)
                    assert [metadata(t) for t in have] == [metadata(t) for t in want]
                    compared += 1
    assert compared > 0


def _affine(channels):
    return torch.empty(channels), torch.empty(channels), torch.empty(channels)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: torch.empty(5, 4, 3, 2).permute(3, 2, 1, 0), id="permuted"),
        pytest.param(lambda: torch.empty(2, 3, 4, 10)[..., ::2], id="strided-slice"),
        pytest.param(lambda: torch.empty(2, 3, 1, 1, memory_format=torch.channels_last), id="both"),
    ],
)
def test_unusual_layouts_go_to_the_fake_mode(make):
    with FakeTensorMode():
        x = make()
        weight, mean, var = _affine(x.shape[1])
        assert batch_norm(x, weight, weight, mean, var, True, 0.1, 1e-5) is FALL_BACK
        out, save_mean, save_invstd = aten.native_batch_norm(
            x, weight, weight, mean, var, True, 0.1, 1e-5
        )
        args = (out.new_empty(out.shape), x, weight, mean, var, save_mean, save_invstd, True, 1e-5)
        assert batch_norm_backward(*args, [True, True, True]) is FALL_BACK


def test_a_gradient_in_another_layout_goes_to_the_fake_mode():
    with FakeTensorMode():
        x = torch.empty(2, 3, 4, 5)
        weight, mean, var = _affine(3)
        _, save_mean, save_invstd = aten.native_batch_norm(
            x, weight, weight, mean, var, True, 0.1, 1e-5
        )
        grad_out = torch.empty(2, 3, 4, 5, memory_format=torch.channels_last)
        args = (grad_out, x, weight, mean, var, save_mean, save_invstd, True, 1e-5, [True] * 3)
        assert batch_norm_backward(*args) is FALL_BACK


def test_calls_the_decomposition_refuses_keep_its_error():
    with FakeTensorMode():
        x = torch.empty(2, 3, 4, 5)
        weight, _, _ = _affine(3)
        assert batch_norm(x, weight, weight, None, None, False, 0.1, 1e-5) is FALL_BACK
        with pytest.raises(AssertionError, match="running_mean and running_var"):
            aten.native_batch_norm(x, weight, weight, None, None, False, 0.1, 1e-5)
        single = torch.empty(1, 3)  # one value per channel: no unbiased variance
        _, mean, var = _affine(3)
        assert batch_norm(single, weight, weight, mean, var, True, 0.1, 1e-5) is FALL_BACK
        assert (
            batch_norm(torch.empty(2, 4, 5, 5), weight, weight, mean, var, True, 0.1, 1e-5)
            is FALL_BACK
        )


def test_real_tensors_are_left_alone():
    x = torch.randn(2, 3, 4, 4)
    assert batch_norm(x, None, None, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5) is FALL_BACK


class _ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.BatchNorm2d(8, affine=False),
        )

    def forward(self, x):
        return self.layers(x).square().mean()


def _trace_block(batch: int):
    """A forward and backward of `_ConvBlock` under the planner's recorder: the allocations and
    frees it records, and the ops that reached the fake mode."""
    mode = FakeTensorMode()
    seen = []
    dispatch = mode.dispatch

    def counting(func, types, args=(), kwargs=None):
        seen.append(func)
        return dispatch(func, types, args, kwargs)

    mode.dispatch = counting
    with mode:
        block = _ConvBlock()
        x = torch.empty(batch, 3, 16, 16)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=True)
        with recorder:
            block(x).backward()
        recorder.close()
    return recorder.events, recorder.timeline, recorder.peak.bytes, seen


def test_the_recorder_takes_the_rule_and_records_the_same_allocations(monkeypatch):
    with_rules = _trace_block(batch=4)
    monkeypatch.setattr(shape_rules, "SHAPE_RULES", {})
    without = _trace_block(batch=4)
    assert with_rules[:3] == without[:3]
    ruled = {
        aten.native_batch_norm.default,
        aten.native_batch_norm_backward.default,
        aten.threshold_backward.default,
    }
    assert not ruled & set(with_rules[3])
    assert ruled <= set(without[3])


def _layouts(shape):
    """A fake tensor of `shape` in each layout a rule answers itself, then ones it leaves."""
    answered = [torch.empty(shape), torch.empty(shape, memory_format=torch.channels_last)]
    answered.append(torch.empty(shape[0] + 1, *shape[1:])[1:])  # an offset into its storage
    left = [
        torch.empty(shape[::-1]).permute(3, 2, 1, 0),
        torch.empty(*shape[:3], 2 * shape[3])[..., ::2],
    ]
    return answered, left


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_activation_gradients_match_the_fake_mode(dtype):
    ops = [(aten.threshold_backward.default, (0.0,)), (aten.sigmoid_backward.default, ())]
    with FakeTensorMode():
        for shape in [(2, 3, 4, 5), (1, 3, 1, 5)]:
            answered, left = _layouts(shape)
            for (op, extra), x in itertools.product(ops, answered):
                x = x.to(dtype)
                grad = torch.empty_strided(x.shape, x.stride(), dtype=dtype)
                got = shape_rules.activation_backward(grad, x, *extra)
                assert got is not FALL_BACK
                assert metadata(got) == metadata(op(grad, x, *extra))
            grad = torch.empty(shape, dtype=dtype)
            for x in [*left, answered[1], torch.empty(shape, dtype=torch.float32)]:
                if x.dtype == dtype and x.stride() == grad.stride():
                    continue
                assert shape_rules.activation_backward(grad, x, 0.0) is FALL_BACK
