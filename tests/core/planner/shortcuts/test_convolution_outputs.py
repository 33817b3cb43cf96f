"""2-D convolution outputs made directly equal the fake mode's, forward and backward."""

from __future__ import annotations

import itertools

import pytest
import torch
from fake_metadata import metadata
from fake_traces import assert_same_trace, traced_with_and_without
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.shortcuts.convolution_outputs import convolution_output

aten = torch.ops.aten

# (in channels, out channels, kernel, stride, padding, dilation, groups, transposed, output_padding)
CONVOLUTIONS = [
    (4, 8, 3, 1, 1, 1, 1, False, 0),
    (4, 8, 1, 2, 0, 1, 1, False, 0),
    (8, 8, 3, 2, 2, 2, 4, False, 0),
    (6, 6, 3, 1, 1, 1, 6, False, 0),  # depthwise
    (8, 4, 2, 2, 0, 1, 1, True, 0),  # DBNet's head upsamples with these
    (8, 4, 3, 2, 1, 1, 2, True, 1),
]
LAYOUTS = ["contiguous", "channels_last"]
SIZES = [(2, 9, 9), (1, 1, 1), (3, 5, 7)]  # batch, height, width


def _tensors(config, layout, size, dtype, bias):
    c_in, c_out, k, *_rest, groups, transposed, _ = config
    batch, height, width = size
    memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    weight_shape = (c_in, c_out // groups, k, k) if transposed else (c_out, c_in // groups, k, k)
    image = torch.empty(batch, c_in, height, width, dtype=dtype).contiguous(
        memory_format=memory_format
    )
    weight = torch.empty(weight_shape, dtype=dtype).contiguous(memory_format=memory_format)
    return image, weight, torch.empty(c_out, dtype=dtype) if bias else None


def _forward_args(config, image, weight, bias):
    _, _, _, stride, padding, dilation, groups, transposed, output_padding = config
    return (
        image,
        weight,
        bias,
        [stride] * 2,
        [padding] * 2,
        [dilation] * 2,
        transposed,
        [output_padding] * 2,
        groups,
    )


def _compare(op, args):
    direct = convolution_output(op, args, {})
    try:
        dispatched = op(*args)
    except RuntimeError:
        return None  # e.g. an output size below one: nothing to compare
    assert direct is not None
    if isinstance(dispatched, torch.Tensor):
        return metadata(direct), metadata(dispatched)
    return [metadata(t) for t in direct], [metadata(t) for t in dispatched]


@pytest.mark.parametrize("config", CONVOLUTIONS, ids=str)
def test_forward_and_backward_outputs_are_the_fake_modes(config):
    compared = 0
    cases = itertools.product(LAYOUTS, SIZES, [torch.float32, torch.float16], [True, False])
    for layout, size, dtype, bias in cases:
        with FakeTensorMode():
            image, weight, bias_tensor = _tensors(config, layout, size, dtype, bias)
            forward = _forward_args(config, image, weight, bias_tensor)
            found = _compare(aten.convolution.default, forward)
            if found is None:
                continue
            assert found[0] == found[1], (layout, size, dtype, bias)
            grad_output = torch.empty_like(aten.convolution.default(*forward))
            for mask in ([True, True, bias], [False, True, False], [True, False, False]):
                backward = (
                    grad_output,
                    image,
                    weight,
                    [config[1]] if bias else None,
                    *forward[3:],
                    mask,
                )
                found = _compare(aten.convolution_backward.default, backward)
                assert found[0] == found[1], (layout, size, dtype, bias, mask)
            compared += 1
    assert compared >= len(LAYOUTS) * 2 * 2  # at least one size in every layout, dtype and bias


@pytest.mark.parametrize(
    "case", ["3-D convolution", "1-D convolution", "mixed dtypes", "keyword", "real tensors"]
)
def test_what_is_left_to_the_fake_mode(case):
    config = CONVOLUTIONS[0]
    if case == "real tensors":
        image, weight, bias = _tensors(config, "contiguous", (2, 9, 9), torch.float32, True)
        args = _forward_args(config, image, weight, bias)
        assert convolution_output(aten.convolution.default, args, {}) is None
        return
    with FakeTensorMode():
        image, weight, bias = _tensors(config, "contiguous", (2, 9, 9), torch.float32, True)
        args, kwargs = _forward_args(config, image, weight, bias), {}
        if case == "3-D convolution":
            args = (image.unsqueeze(2), weight.unsqueeze(2), bias, [1] * 3, [1] * 3, [1] * 3)
            args = (*args, False, [0] * 3, 1)
        elif case == "1-D convolution":
            args = (image[:, :, 0], weight[:, :, 0], bias, [1], [1], [1], False, [0], 1)
        elif case == "mixed dtypes":
            args = (image.half(), *args[1:])
        elif case == "keyword":
            args, kwargs = args[:-1], {"groups": 1}
        assert convolution_output(aten.convolution.default, args, kwargs) is None


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2, bias=False)

    def forward(self, x):
        return self.up(self.down(x).relu())


def test_direct_convolutions_leave_the_traced_step_unchanged(monkeypatch):
    direct, dispatched, made = traced_with_and_without(
        monkeypatch,
        "convolution_output",
        _Block,
        lambda: torch.empty(2, 3, 16, 16).contiguous(memory_format=torch.channels_last),
    )
    # Two convolutions, forward and backward, in the first step; the second step's are the
    # output memo's.
    assert made == 4
    assert_same_trace(direct, dispatched)
