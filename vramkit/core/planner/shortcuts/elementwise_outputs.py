"""Fresh fake outputs of elementwise arithmetic whose operands need no broadcasting or promotion.

A default-task plan runs about 600 elementwise ops (DBNet's residual and FPN additions, the
loss's products and quotients, sigmoid): 0.33-0.72 ms each through the fake dispatch, most of
them cache misses that run the op's Python reference (`torch/_refs`) because every trace has
another batch size. When every tensor operand is a plain fake CPU tensor of one shape, one
floating dtype and one fresh layout (contiguous or channels-last), and any other operand is a
Python number, the output is a fresh tensor of that shape, dtype and layout
(`torch/_prims_common` `compute_elementwise_output_strides` keeps a layout all operands share;
a Python number does not change a floating tensor's dtype, `elementwise_dtypes`). Everything
else (broadcasting, mixed dtypes, integer division, odd layouts, fake constants) goes through
the fake mode; `tests/core/planner/shortcuts/test_elementwise_outputs.py` compares the two.
"""

from __future__ import annotations

from typing import Any

import torch

from vramkit.core.planner.shortcuts.fresh_outputs import fresh_fake, fresh_layout, on_fake_cpu

aten = torch.ops.aten

_BINARY = {
    aten.add.Tensor,
    aten.sub.Tensor,
    aten.mul.Tensor,
    aten.div.Tensor,
    aten.add.Scalar,
    aten.sub.Scalar,
    aten.mul.Scalar,
    aten.div.Scalar,
    aten.rsub.Scalar,
}
_UNARY = {
    aten.neg.default,
    aten.sigmoid.default,
    aten.tanh.default,
    aten.exp.default,
    aten.silu.default,
}
_NUMBER_KWARGS = {"alpha"}
"""Keywords these ops take that are numbers and change nothing of the output's metadata."""


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)  # not bool or complex: they can change the dtype


def elementwise_output(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The output of an elementwise op above made directly, or None when the fake mode must
    answer (see the module docstring for when it can be made)."""
    if func in _UNARY:
        if len(args) != 1 or kwargs:
            return None
    elif func not in _BINARY or len(args) != 2:
        return None
    if any(key not in _NUMBER_KWARGS or not _is_number(value) for key, value in kwargs.items()):
        return None
    tensors = [arg for arg in args if isinstance(arg, torch.Tensor)]
    if not tensors or len(tensors) + sum(map(_is_number, args)) != len(args):
        return None
    first = tensors[0]
    if not on_fake_cpu(*tensors) or not first.is_floating_point():
        return None
    strides = fresh_layout(first)
    if strides is None:
        return None
    for other in tensors[1:]:
        if (other.shape, other.dtype, other.stride()) != (first.shape, first.dtype, strides):
            return None
    return fresh_fake(first, first.shape, strides, first.dtype)
