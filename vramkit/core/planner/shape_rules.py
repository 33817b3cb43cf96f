"""Batch norm's outputs on fake tensors, without running its decomposition.

Why a re-implementation (measured): FakeTensorMode has no meta kernel for `native_batch_norm`
and `native_batch_norm_backward`; on a cache miss it runs torch/_decomp/decompositions.py
(`native_batch_norm_helper`, `native_batch_norm_backward`), about 20 ops, each dispatched
through the fake mode again, and every trace of a plan (train batch 1, 1000, 826, val 100)
brings new shapes. In the default DBNet plan (`scripts/plan_memory.py +hw=t4`) the 20 forward
misses cost 23 ms each and the 15 backward misses 20 ms each: 0.76 s of the ~4.5 s spent in
fake dispatch, more than any other op. The rules below make the outputs with a few fake
constructors instead, and decide per call: an input they cannot answer exactly (an unusual
stride pattern, a non-CPU fake device, arguments the decomposition would refuse) goes through
the normal fake path, so every error and every odd layout stays PyTorch's.

The metadata is the fake path's (the CPU branch of the decomposition, since the planner's fake
tensors live on the CPU), so plans do not change:

- `native_batch_norm` returns the output in the input's dtype and memory format, and
  `save_mean` / `save_invstd` of shape [C] in the input's dtype when training, [0] in eval
  (`native_batch_norm_helper`: "Very annoying inconsistency where CPU and CUDA give different
  shapes"; the CPU kernel, aten/src/ATen/native/Normalization.cpp `batch_norm_cpu`, agrees).
  The running statistics are updated in place: no allocation.
- `native_batch_norm_backward` returns grad_input in the input's dtype and layout even when
  `output_mask[0]` is False (the decomposition computes it anyway), and grad_weight /
  grad_bias of shape [C] in the weight's dtype (the input's without a weight), or None where
  `output_mask` turns them off.

What CUDA allocates instead (read from the sources; this rule does not apply it, see
docs/cuda_rules.md): with a weight and a bias, fp32 or fp16 input (fp32 weight) and 3-5 dims,
`_batch_norm_impl_index` (aten/src/ATen/native/Normalization.cpp, `_select_batch_norm_backend`)
runs cuDNN, not `native_batch_norm`: `cudnn_batch_norm` (aten/src/ATen/native/cudnn/
BatchNorm.cpp) returns the output in the input's suggested memory format, `save_mean` /
`save_var` of [C] in the weight's dtype (fp32) when training and [0] in eval, plus a uint8
`reserve` (`cudnnGetBatchNormalizationTrainingExReserveSpaceSize`) kept for backward and a
transient workspace; its backward always allocates grad_input, grad_weight and grad_bias.
Otherwise (bf16, no affine, 2-D input) `batch_norm_cuda` (aten/src/ATen/native/cuda/
Normalization.cu) keeps `save_mean` / `save_invstd` of [C] in the accumulate dtype (fp32 for
fp16 / bf16) in training and in eval, and `batch_norm_backward_cuda` allocates grad_input only
when `output_mask[0]`. For fp32 inputs with an affine batch norm (the default plans) both
agree with the fake path in bytes; the [C]-sized statistics of half inputs differ (2 bytes
per channel more on CUDA, and [C] instead of [0] in a bf16 validation step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

FALL_BACK: Any = object()
"""A rule's answer when it cannot give the fake path's outputs exactly: run the op instead."""

_aten = torch.ops.aten


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _channels_last_strides(shape: Sequence[int]) -> tuple[int, ...] | None:
    """`torch.empty(shape, memory_format=channels_last(_3d))`'s strides (4-D / 5-D only)."""
    if len(shape) not in (4, 5):
        return None
    order = [1, *range(len(shape) - 1, 1, -1), 0]  # innermost first: C, W, H, (D,) N
    strides, step = [0] * len(shape), 1
    for dim in order:
        strides[dim] = step
        step *= max(shape[dim], 1)
    return tuple(strides)


def _dense_layout(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """The strides of `tensor` when they are those of a fresh contiguous or channels-last
    tensor, which elementwise ops keep (TensorIterator); None for any other layout."""
    shape, strides = tensor.shape, tensor.stride()
    if strides == _contiguous_strides(shape):
        return strides
    # A tensor that is also contiguous by `is_contiguous()` (size-1 dims) has two readings;
    # which one TensorIterator picks is not worth re-deriving: the fake path answers it.
    if strides == _channels_last_strides(shape) and not tensor.is_contiguous():
        return strides
    return None


def _fake_empty(
    like: FakeTensor, shape: Sequence[int], strides: Sequence[int], dtype: torch.dtype
) -> FakeTensor:
    """A fresh fake tensor beside `like`, made as the fake mode makes a cached op's outputs
    (`FakeTensorMode._output_from_cache_entry`, torch/_subclasses/fake_tensor.py): a meta tensor
    wrapped for `like`'s mode and device. 30 us here against 230-310 us for `new_empty_strided`,
    which goes through the whole fake dispatch."""
    mode = like.fake_mode
    with in_kernel_invocation_manager(mode):
        meta = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
    return FakeTensor(mode, meta, like.device)


def _on_fake_cpu(*tensors: torch.Tensor | None) -> bool:
    """Plain fake CPU tensors (or None): a fake constant's outputs may carry its value."""
    return all(
        t is None or (type(t) is FakeTensor and t.device.type == "cpu" and t.constant is None)
        for t in tensors
    )


def _per_channel(channels: int, *tensors: torch.Tensor | None) -> bool:
    return all(t is None or t.numel() == channels for t in tensors)


def batch_norm(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> Any:
    """`aten.native_batch_norm`'s (output, save_mean, save_invstd) on fake CPU tensors, or
    `FALL_BACK`."""
    if not _on_fake_cpu(input, weight, bias, running_mean, running_var) or input.dim() < 2:
        return FALL_BACK
    strides = _dense_layout(input)
    channels = input.shape[1]
    if strides is None or input.numel() == 0 or not input.is_floating_point():
        return FALL_BACK
    if not _per_channel(channels, weight, bias, running_mean, running_var):
        return FALL_BACK
    if training and running_var is not None and input.numel() // channels <= 1:
        return FALL_BACK  # the decomposition's Bessel correction divides by zero: its error
    if not training and (running_mean is None or running_var is None):
        return FALL_BACK  # refused by the decomposition: keep its message
    output = _fake_empty(input, input.shape, strides, input.dtype)
    stat = (channels,) if training else (0,)
    return (
        output,
        _fake_empty(input, stat, (1,), input.dtype),
        _fake_empty(input, stat, (1,), input.dtype),
    )


def batch_norm_backward(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    save_mean: torch.Tensor | None,
    save_invstd: torch.Tensor | None,
    train: bool,
    eps: float,
    output_mask: Sequence[bool],
) -> Any:
    """`aten.native_batch_norm_backward`'s (grad_input, grad_weight, grad_bias) on fake CPU
    tensors, or `FALL_BACK`."""
    tensors = (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd)
    if not _on_fake_cpu(*tensors) or input.dim() < 2 or len(output_mask) != 3:
        return FALL_BACK
    strides = _dense_layout(input)
    # grad_input follows both operands' layouts; only equal ones give the input's for sure.
    if strides is None or grad_out.shape != input.shape or grad_out.stride() != strides:
        return FALL_BACK
    if input.numel() == 0 or not input.is_floating_point():
        return FALL_BACK
    channels = input.shape[1]
    statistics = (save_mean, save_invstd) if train else (running_mean, running_var)
    if any(t is None for t in statistics) or not _per_channel(channels, weight, *statistics):
        return FALL_BACK
    grad_input = _fake_empty(input, input.shape, strides, input.dtype)
    dtype = weight.dtype if weight is not None else input.dtype
    grad_weight = _fake_empty(input, (channels,), (1,), dtype) if output_mask[1] else None
    grad_bias = _fake_empty(input, (channels,), (1,), dtype) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


SHAPE_RULES: dict[Any, Callable[..., Any]] = {
    _aten.native_batch_norm.default: batch_norm,
    _aten.native_batch_norm_backward.default: batch_norm_backward,
}
"""The ops whose fake outputs a rule gives directly, by overload."""


def direct_outputs(func: Any, args: tuple, kwargs: dict) -> Any:
    """The outputs of `func(*args, **kwargs)` on fake tensors from its rule, or `FALL_BACK`
    when it has none or its rule cannot be exact for these arguments."""
    rule = SHAPE_RULES.get(func)
    if rule is None:
        return FALL_BACK
    return rule(*args, **kwargs)
