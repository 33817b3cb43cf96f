"""Elementwise outputs made directly equal what the fake mode makes, and the rest is left to it."""

from __future__ import annotations

import itertools

import pytest
import torch
from fake_metadata import metadata
from fake_traces import assert_same_trace, traced_with_and_without
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from vramkit.core.planner.shortcuts.elementwise_outputs import elementwise_output

aten = torch.ops.aten

SHAPES = [(), (7,), (3, 5), (2, 1, 4), (2, 3, 4, 5), (1, 3, 1, 5)]
LAYOUTS = ["contiguous", "channels_last", "transposed", "expanded"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool]


def _make(shape, layout, dtype):
    tensor = torch.empty(shape, dtype=dtype)
    if layout == "channels_last" and len(shape) == 4:
        tensor = tensor.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed" and len(shape) >= 2:
        tensor = torch.empty(shape[::-1], dtype=dtype).transpose(0, -1)
    elif layout == "expanded" and len(shape) >= 1:
        tensor = torch.empty((1, *shape[1:]), dtype=dtype).expand(shape)
    return tensor


# (op, how to call it): "tt" two tensors, "tn" a tensor and a number, "t" one tensor.
CALLS = [
    (aten.add.Tensor, "tt", {}),
    (aten.add.Tensor, "tt", {"alpha": 2}),
    (aten.sub.Tensor, "tt", {}),
    (aten.mul.Tensor, "tt", {}),
    (aten.div.Tensor, "tt", {}),
    (aten.mul.Tensor, "tn", {}),
    (aten.add.Tensor, "tn", {}),
    (aten.div.Tensor, "tn", {}),
    (aten.add.Scalar, "tn", {}),
    (aten.mul.Scalar, "tn", {}),
    (aten.rsub.Scalar, "tn", {}),
    (aten.neg.default, "t", {}),
    (aten.sigmoid.default, "t", {}),
    (aten.tanh.default, "t", {}),
    (aten.exp.default, "t", {}),
    (aten.silu.default, "t", {}),
]


def _args(how, first, second):
    return {"tt": (first, second), "tn": (first, 3), "t": (first,)}[how]


def _dispatched(op, args, kwargs):
    try:
        return op(*args, **kwargs)
    except RuntimeError:
        return None  # e.g. neg of a bool tensor: nothing to compare


@pytest.mark.parametrize(("op", "how", "kwargs"), CALLS, ids=lambda v: str(v))
def test_a_direct_output_has_the_fake_modes_metadata(op, how, kwargs):
    compared = []
    for shape, layout, dtype in itertools.product(SHAPES, LAYOUTS, DTYPES):
        with FakeTensorMode():
            first = _make(shape, layout, dtype)
            args = _args(how, first, _make(shape, layout, dtype))
            direct = elementwise_output(op, args, kwargs)
            dispatched = _dispatched(op, args, kwargs)
        if direct is None:
            continue  # the fake mode answers: nothing to compare
        assert isinstance(direct, FakeTensor)
        assert metadata(direct) == metadata(dispatched), (shape, layout, dtype)
        assert direct.untyped_storage()._cdata != first.untyped_storage()._cdata  # fresh
        compared.append((shape, layout, dtype))
    # Every floating dtype was made directly, in both fresh layouts, and no odd layout was.
    assert {dtype for *_, dtype in compared} == {torch.float32, torch.float16, torch.bfloat16}
    assert ((2, 3, 4, 5), "channels_last", torch.bfloat16) in compared
    assert ((3, 5), "contiguous", torch.float16) in compared
    assert ((3, 5), "transposed", torch.float32) not in compared
    assert ((2, 3, 4, 5), "expanded", torch.float32) not in compared


def test_it_answers_the_common_cases():
    with FakeTensorMode():
        image = torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
        half = torch.empty(8, 16, dtype=torch.float16)
        assert elementwise_output(aten.add.Tensor, (image, image.clone()), {}) is not None
        assert elementwise_output(aten.mul.Tensor, (half, 0.5), {}) is not None
        assert elementwise_output(aten.rsub.Scalar, (half, 1), {}) is not None
        assert elementwise_output(aten.sigmoid.default, (half,), {}) is not None


@pytest.mark.parametrize(
    "case",
    [
        "broadcast",
        "mixed dtypes",
        "integers",
        "bool number",
        "complex number",
        "zero-dim tensor operand",
        "mixed layouts",
        "constant",
        "real tensor",
        "unknown keyword",
        "other op",
    ],
)
def test_what_is_left_to_the_fake_mode(case):
    with FakeTensorMode():
        x = torch.empty(2, 3)
        op, args, kwargs = aten.add.Tensor, (x, x), {}
        if case == "broadcast":
            args = (x, torch.empty(3))
        elif case == "mixed dtypes":
            args = (x, torch.empty(2, 3, dtype=torch.float16))
        elif case == "integers":
            op, args = aten.div.Tensor, (torch.empty(2, 3, dtype=torch.int64),) * 2
        elif case == "bool number":
            args = (x, True)
        elif case == "complex number":
            args = (x, 1j)
        elif case == "zero-dim tensor operand":
            args = (x, torch.empty(()))
        elif case == "mixed layouts":
            args = (x, torch.empty(3, 2).t())
        elif case == "constant":
            args = (torch.tensor(1.0), torch.tensor(2.0))
        elif case == "unknown keyword":
            kwargs = {"alpha": True}
        elif case == "other op":
            op, args = aten.maximum.default, (x, x)
    if case == "real tensor":
        args = (torch.empty(2, 3), torch.empty(2, 3))
    assert elementwise_output(op, args, kwargs) is None


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        y = x + self.conv(x)
        return torch.sigmoid(y) * y - 0.5 * y


def test_direct_elementwise_outputs_leave_the_traced_step_unchanged(monkeypatch):
    direct, dispatched, made = traced_with_and_without(
        monkeypatch,
        "elementwise_output",
        _Residual,
        lambda: torch.empty(2, 4, 8, 8).contiguous(memory_format=torch.channels_last),
    )
    assert made >= 6  # forward and backward
    assert_same_trace(direct, dispatched)
