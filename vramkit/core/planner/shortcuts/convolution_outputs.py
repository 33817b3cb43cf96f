"""Fake outputs of 2-D convolutions and their gradients, made without the fake dispatch.

`FakeTensorMode` answers `aten.convolution` and `aten.convolution_backward` with its own
implementation (`conv` in torch/_subclasses/fake_impls.py): it asks the backend selector which
memory format the real kernel would write (`torch._C._select_conv_backend`,
`_conv_determine_backend_memory_format`), runs the meta kernel and converts the outputs to that
format. Reaching it costs a full dispatch: 0.47-0.49 ms a call on a cache hit, about 0.9 ms on
average in a default plan (its 439 convolutions, forward and backward, take 0.4 s). The same
steps are taken here directly, with the same calls in the same order, so the outputs are the
fake mode's (`tests/core/planner/shortcuts/test_convolution_outputs.py` compares them over strides,
padding, dilation, groups, transposed convolutions, bias, layouts and gradient masks).

Only what that implementation answers the same way every time is taken: plain fake CPU tensors
of one dtype, 2-D convolutions (4-D weights; 1-D ones are reshaped there and 3-D ones are rare),
and positional arguments. Everything else goes through the fake mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

from vramkit.core.planner.shortcuts.fresh_outputs import on_fake_cpu

aten = torch.ops.aten

_FORWARD_ARGS = 9
"""input, weight, bias, stride, padding, dilation, transposed, output_padding, groups"""
_BACKWARD_ARGS = 11
"""grad_output, input, weight, bias_sizes, the six settings above, output_mask"""


def convolution_output(func: Any, args: tuple, kwargs: dict) -> Any:
    """The output of a 2-D `aten.convolution` (a tensor) or `aten.convolution_backward`
    (grad_input, grad_weight, grad_bias; None where the mask leaves one out), or None when the
    fake mode must answer."""
    if kwargs:
        return None
    if func is aten.convolution.default and len(args) == _FORWARD_ARGS:
        tensors, (input_, weight, bias), settings = args[:3], args[:3], args[3:]
        selected = {"bias": bias} if bias is not None else {"bias": None, "bias_sizes": None}
    elif func is aten.convolution_backward.default and len(args) == _BACKWARD_ARGS:
        tensors, (input_, weight), settings = args[:3], args[1:3], args[4:10]
        selected = {"bias": None, "bias_sizes": args[3]}
    else:
        return None
    if weight.dim() != 4 or input_.dtype != weight.dtype or not on_fake_cpu(*tensors):
        return None
    stride, padding, dilation, transposed, output_padding, groups = settings
    mode = input_.fake_mode
    backend = torch._C._select_conv_backend(
        input_,
        weight,
        stride=stride,
        padding=padding,
        dilation=dilation,
        transposed=transposed,
        output_padding=output_padding,
        groups=groups,
        **selected,
    )
    memory_format = torch._C._conv_determine_backend_memory_format(input_, weight, backend)
    device = input_.device  # inside the kernel invocation a fake tensor reports "meta"
    with in_kernel_invocation_manager(mode):
        out = func(*args)
        if func is aten.convolution.default:
            return _wrapped(mode, out, memory_format, device)
        grad_input, grad_weight, grad_bias = out
        return (
            _wrapped(mode, grad_input, memory_format, device),
            _wrapped(mode, grad_weight, memory_format, device),
            _wrapped(mode, grad_bias, None, device),
        )


def _wrapped(
    mode: Any, meta: torch.Tensor | None, memory_format: Any, device: torch.device
) -> FakeTensor | None:
    if meta is None:
        return None
    if memory_format is not None:
        meta = meta.to(memory_format=memory_format)
    return FakeTensor(mode, meta, device)
