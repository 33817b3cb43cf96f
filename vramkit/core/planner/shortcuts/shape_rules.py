"""Batch norm's and two activation gradients' fake outputs, without their decomposition.

Why a re-implementation (measured with a per-op timer around the recorder's dispatch and the
fake mode's cache counters, default DBNet plan `scripts/plan_memory.py +hw=t4`, 2-core machine):
FakeTensorMode has no meta kernel for these ops; on a cache miss it runs their Python
decomposition (torch/_decomp/decompositions.py: `native_batch_norm_helper`,
`native_batch_norm_backward`, and the elementwise references of the two gradients), every inner
op dispatched through the fake mode again, and each trace of a plan (train batch 1, 1000, 826,
val 100) brings new shapes.

- `native_batch_norm`: 20 misses at 16-28 ms + 146 hits at 0.45-0.7 ms; its backward 15
  misses at 12-23 ms + 129 hits at 0.5-1.1 ms: 0.64-0.83 s per plan, the most of any op.
  With the rules: 310 calls, 0.06-0.10 s.
- `threshold_backward` (ReLU) / `sigmoid_backward`: 21 misses at 3-6 ms + 111 hits,
  0.10-0.13 s; with the rules 0.01 s.

Each rule builds its outputs as the fake mode's cache builds a hit's (`fresh_outputs.fresh_fake`)
and decides per call: where it cannot be exact (an unusual stride pattern, broadcasting, mixed
dtypes, a fake constant, arguments the decomposition would refuse) it answers `FALL_BACK` and
the op runs through the fake mode, so every error and every odd layout stays PyTorch's. The
metadata is the fake path's (the CPU branch of the decompositions: the planner's fake tensors
live on the CPU), so plans do not change
(`tests/core/planner/shortcuts/test_shape_rules.py` compares both over dtypes, parameters, ranks,
layouts and output masks):

- `native_batch_norm`: the output in the input's dtype and memory format; `save_mean` /
  `save_invstd` of [C] in the input's dtype when training, [0] in eval
  (`native_batch_norm_helper`; the CPU kernel, aten/src/ATen/native/Normalization.cpp
  `batch_norm_cpu`, agrees). The running statistics are updated in place: no allocation.
- `native_batch_norm_backward`: grad_input in the input's dtype and layout even when
  `output_mask[0]` is False (the decomposition computes it anyway); grad_weight / grad_bias of
  [C] in the weight's dtype (the input's without a weight), None where `output_mask` is False.
- the threshold / sigmoid gradients are elementwise (TensorIterator): with two operands of one
  shape, dtype and fresh layout, the gradient has theirs.

What CUDA allocates for batch norm (read from the sources; not applied here): with a weight and
a bias, fp32 input or fp16 input with fp32 weight, and 3-5 dims, `_batch_norm_impl_index`
(aten/src/ATen/native/Normalization.cpp, `_select_batch_norm_backend`) calls cuDNN:
`cudnn_batch_norm` (aten/src/ATen/native/cudnn/BatchNorm.cpp) returns the output in the input's
suggested memory format, `save_mean` / `save_var` of [C] in the weight's dtype (fp32) when
training and [0] in eval, a uint8 `reserve` kept for backward
(`cudnnGetBatchNormalizationTrainingExReserveSpaceSize`) and a transient workspace; its backward
allocates grad_input, grad_weight and grad_bias whatever the mask. Otherwise (bf16, no affine,
2-D input) `batch_norm_cuda` (aten/src/ATen/native/cuda/Normalization.cu) keeps `save_mean` /
`save_invstd` of [C] in the accumulate dtype (fp32 for fp16 / bf16) in training and in eval, and
`batch_norm_backward_cuda` allocates grad_input only under `output_mask[0]`. So for fp16 inputs
(16-mixed) CUDA's statistics are fp32 where the fake path's are fp16: 2 bytes per channel more,
no difference after the allocator's 512-byte rounding up to 128 channels. The default plans are
identical either way (checked by giving the rule CUDA's dtypes); cuDNN's reserve size needs a
GPU to read and is not planned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vramkit.core.planner.shortcuts.fresh_outputs import fresh_fake, fresh_layout, on_fake_cpu

FALL_BACK: Any = object()
"""A rule's answer when it cannot give the fake path's outputs exactly: run the op instead."""

_aten = torch.ops.aten


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
    if not on_fake_cpu(input, weight, bias, running_mean, running_var) or input.dim() < 2:
        return FALL_BACK
    strides = fresh_layout(input)
    channels = input.shape[1]
    if strides is None or input.numel() == 0 or not input.is_floating_point():
        return FALL_BACK
    if not _per_channel(channels, weight, bias, running_mean, running_var):
        return FALL_BACK
    if training and running_var is not None and input.numel() // channels <= 1:
        return FALL_BACK  # the decomposition's Bessel correction divides by zero: its error
    if not training and (running_mean is None or running_var is None):
        return FALL_BACK  # refused by the decomposition: keep its message
    output = fresh_fake(input, input.shape, strides, input.dtype)
    stat = (channels,) if training else (0,)
    return (
        output,
        fresh_fake(input, stat, (1,), input.dtype),
        fresh_fake(input, stat, (1,), input.dtype),
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
    if not on_fake_cpu(*tensors) or input.dim() < 2 or len(output_mask) != 3:
        return FALL_BACK
    strides = fresh_layout(input)
    # grad_input follows both operands' layouts; only equal ones give the input's for sure.
    if strides is None or grad_out.shape != input.shape or grad_out.stride() != strides:
        return FALL_BACK
    if input.numel() == 0 or not input.is_floating_point():
        return FALL_BACK
    channels = input.shape[1]
    statistics = (save_mean, save_invstd) if train else (running_mean, running_var)
    if any(t is None for t in statistics) or not _per_channel(channels, weight, *statistics):
        return FALL_BACK
    grad_input = fresh_fake(input, input.shape, strides, input.dtype)
    dtype = weight.dtype if weight is not None else input.dtype
    grad_weight = fresh_fake(input, (channels,), (1,), dtype) if output_mask[1] else None
    grad_bias = fresh_fake(input, (channels,), (1,), dtype) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


def activation_backward(grad_output: torch.Tensor, saved: torch.Tensor, *_: Any) -> Any:
    """`threshold_backward` / `sigmoid_backward`'s gradient: an elementwise op of two tensors
    (TensorIterator), so with the same shape, dtype and dense layout it has theirs; otherwise
    `FALL_BACK` (broadcasting, type promotion and mixed layouts stay with the fake mode)."""
    if not on_fake_cpu(grad_output, saved) or grad_output.dtype != saved.dtype:
        return FALL_BACK
    strides = fresh_layout(grad_output)
    if strides is None or saved.shape != grad_output.shape or saved.stride() != strides:
        return FALL_BACK
    return fresh_fake(grad_output, grad_output.shape, strides, grad_output.dtype)


SHAPE_RULES: dict[Any, Callable[..., Any]] = {
    _aten.native_batch_norm.default: batch_norm,
    _aten.native_batch_norm_backward.default: batch_norm_backward,
    _aten.threshold_backward.default: activation_backward,
    _aten.sigmoid_backward.default: activation_backward,
}
"""The ops whose fake outputs a rule gives directly, by overload."""


def direct_outputs(func: Any, args: tuple, kwargs: dict) -> Any:
    """The outputs of `func(*args, **kwargs)` on fake tensors from its rule, or `FALL_BACK`
    when it has none or its rule cannot be exact for these arguments."""
    rule = SHAPE_RULES.get(func)
    if rule is None or kwargs:  # the dispatcher passes these ops' arguments by position
        return FALL_BACK
    return rule(*args, **kwargs)
