"""Fresh fake outputs of the commonest allocating ops, made without the fake dispatch.

`_to_copy` (every autocast cast of a weight or an input: 13,600 calls in a Phi-1.5 plan) and
`zeros_like` (every optimizer state and the gradients of a validation trace: 7,300) each cost a
full `FakeTensorMode` dispatch: 0.31-0.37 ms on a cache hit, 2.1-2.3 ms when `_to_copy` misses
and runs its Python decomposition (torch/_decomp/decompositions.py `_to_copy`). AdamW's
`_foreach_sqrt` returns a list, which the fake mode's cache refuses: 20-77 ms per step (DBNet,
Phi-1.5). Each output is a fresh tensor whose metadata follows from its input's alone, so it is
made here as the fake mode makes a cached op's outputs (`FakeTensorMode._output_from_cache_entry`:
a meta tensor, wrapped for the input's mode and device), about 30 µs.

The rules answer only what they answer exactly: a plain fake tensor (no constant) whose layout
is a fresh contiguous or channels-last one, which both ops keep (`_to_copy`'s decomposition via
`prims.convert_element_type` with elementwise output strides; `zeros_like` with
`preserve_format`), and no change of device or layout. Everything else goes through the fake
mode, so its errors and odd layouts stay PyTorch's
(`tests/core/planner/shortcuts/test_fresh_outputs.py` compares the two over dtypes, ranks and
layouts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager

aten = torch.ops.aten

_KEPT_AS_IS = {"layout": (None, torch.strided), "memory_format": (None, torch.preserve_format)}
"""Keyword values that ask for nothing beyond the input's layout."""


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a fresh contiguous tensor of `shape` (elements)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def channels_last_strides(shape: Sequence[int]) -> tuple[int, ...] | None:
    """The strides of a fresh channels-last(-3d) tensor of `shape` (4-D / 5-D only)."""
    if len(shape) not in (4, 5):
        return None
    order = [1, *range(len(shape) - 1, 1, -1), 0]  # innermost first: C, W, H, (D,) N
    strides, step = [0] * len(shape), 1
    for dim in order:
        strides[dim] = step
        step *= max(shape[dim], 1)
    return tuple(strides)


def fresh_layout(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """`tensor`'s strides when they are a fresh contiguous or channels-last tensor's, which
    elementwise and `*_like` ops keep; None for any other layout."""
    shape, strides = tensor.shape, tensor.stride()
    if strides == contiguous_strides(shape):
        return strides
    # A tensor that is also contiguous by `is_contiguous()` (size-1 dims) has two readings;
    # which one TensorIterator picks is not worth re-deriving: the fake path answers it.
    if strides == channels_last_strides(shape) and not tensor.is_contiguous():
        return strides
    return None


def new_fake(
    mode: FakeTensorMode,
    device: torch.device,
    shape: Sequence[int],
    strides: Sequence[int],
    dtype: torch.dtype,
    *,
    constant: torch.Tensor | None = None,
) -> FakeTensor:
    """A fresh fake tensor of `mode` on `device`: a meta tensor of that layout, wrapped as the
    fake mode wraps a cached op's outputs (`FakeTensorMode._output_from_cache_entry`)."""
    with in_kernel_invocation_manager(mode):
        meta = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
    return FakeTensor(mode, meta, device, constant=constant)


def fresh_fake(
    like: FakeTensor, shape: Sequence[int], strides: Sequence[int], dtype: torch.dtype
) -> FakeTensor:
    """A fresh fake tensor beside `like`, on its mode and device."""
    return new_fake(like.fake_mode, like.device, shape, strides, dtype)


def on_fake_cpu(*tensors: torch.Tensor | None) -> bool:
    """Plain fake CPU tensors (or None): a fake constant's outputs may carry its value, and the
    planner's fake tensors live on the CPU."""
    return all(
        t is None or (type(t) is FakeTensor and t.device.type == "cpu" and t.constant is None)
        for t in tensors
    )


def _each_fresh(tensors: Any) -> list[FakeTensor] | None:
    """A fresh tensor like each of `tensors` (same shape, layout and dtype), or None."""
    if not isinstance(tensors, (list, tuple)):
        return None
    layouts = []
    for tensor in tensors:
        if tensor is None or not on_fake_cpu(tensor):
            return None
        if not tensor.is_floating_point() or (strides := fresh_layout(tensor)) is None:
            return None
        layouts.append(strides)
    pairs = zip(tensors, layouts, strict=True)
    return [fresh_fake(tensor, tensor.shape, strides, tensor.dtype) for tensor, strides in pairs]


def fresh_output(func: Any, args: tuple, kwargs: dict) -> Any:
    """The output of `_to_copy` (a change of dtype), `zeros_like` or `_foreach_sqrt` (AdamW's
    one temporary per parameter) made directly, or None when the fake mode must answer."""
    if func is aten._foreach_sqrt.default:
        return _each_fresh(args[0]) if len(args) == 1 and not kwargs else None
    if func is aten._to_copy.default:
        dtype = kwargs.get("dtype")
        if len(args) != 1 or dtype is None or dtype == args[0].dtype:
            return None
    elif func is aten.zeros_like.default:
        dtype = kwargs.get("dtype")
        if len(args) != 1:
            return None
    else:
        return None
    source = args[0]
    if source is None or not on_fake_cpu(source):
        return None
    for key, value in kwargs.items():
        if key in _KEPT_AS_IS:
            if value not in _KEPT_AS_IS[key]:
                return None
        elif key == "device":
            if value is not None and torch.device(value) != source.device:
                return None
        elif key not in ("dtype", "pin_memory", "non_blocking") or (key == "pin_memory" and value):
            return None
    strides = fresh_layout(source)
    if strides is None:
        return None
    return fresh_fake(source, source.shape, strides, dtype or source.dtype)
