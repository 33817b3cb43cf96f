"""CUDA kernels that allocate or save other tensors than the CPU path a fake trace follows.

A fake trace runs CPU kernels (their meta functions) and CPU-only branches of composite ops. For
the ops below the CUDA build takes another branch or another kernel, so `CudaKernels` replaces
their `AutogradCPU` kernel, while entered, with one that allocates and saves what the CUDA kernel
does (shapes, dtypes, order). Each rule cites the PyTorch source it was read from; the table of
all op rules, including the ops where CPU and CUDA agree, is docs/cuda_rules.md.

- `softmax` / `log_softmax` of fp16 with `dtype=torch.float32` (CUDA autocast asks for it, and
  Hugging Face attention writes it): CUDA runs `_softmax(x, dim, half_to_float=True)`, no fp32 copy
  of the input; the CPU branch converts the input first (aten/src/ATen/native/SoftMax.cpp).
- `_fused_rms_norm` (`F.rms_norm`, `nn.RMSNorm`): a CUDA kernel whose backward saves the input,
  the weight and an fp32 `rstd` (tools/autograd/derivatives.yaml); CPU has no kernel, so the
  composite runs under autograd and saves fp32 copies of the input (aten/src/ATen/native/
  layer_norm.cpp, `rms_norm_composite`): 8 extra bytes per element in bf16.
- `native_layer_norm` of fp16/bf16: CUDA keeps `mean` and `rstd` in fp32
  (aten/src/ATen/native/cuda/layer_norm_kernel.cu, `layer_norm_cuda`: `acc_type`); the CPU kernel
  and its meta keep them in the input dtype.
- `group_norm` of a channels-last input: CUDA copies it to contiguous and saves the copy
  (aten/src/ATen/native/group_norm.cpp, `group_norm`); CPU keeps channels-last, no copy.
- `embedding_dense_backward` with more than 3072 indices: CUDA sorts the indices and sums
  partial segments in fp32 (aten/src/ATen/native/cuda/Embedding.cu, EmbeddingBackwardKernel.cu);
  the CPU kernel allocates only the weight gradient.

`cublas_workspace_bytes` and `cublaslt_extra_workspace_bytes` state the matmul libraries'
workspaces from the capability and the environment (aten/src/ATen/cuda/CublasHandlePool.cpp).
`cudnn_convolution_workspace_bytes` estimates the workspace one cuDNN convolution call takes and
gives back (aten/src/ATen/native/cudnn/Conv_v8.cpp); `FakeStepRecorder` charges it at the op.

On real (not fake) tensors the rules keep PyTorch's values: a kernel that cannot run on a CPU
tensor (half-to-float softmax) falls back to the CPU branch there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import torch
from torch._subclasses.fake_tensor import is_fake

from vramkit.core.planner.cuda.kernel_overrides import KernelOverrides

EMBEDDING_SORT_THRESHOLD = 3072
"""`embedding_dense_backward_cuda` sorts the indices only above this many (Embedding.cu)."""

EMBEDDING_ROWS_PER_SEGMENT = 10
"""`NROWS_PER_THREAD` of EmbeddingBackwardKernel.cu: rows summed per partial segment."""

_HALF_TYPES = (torch.float16, torch.bfloat16)


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """CUDA's accumulate type of `dtype` (`at::toAccumulateType(dtype, /*is_cuda=*/true)`)."""
    return torch.float32 if dtype in _HALF_TYPES else dtype


def _stat_shape(input: torch.Tensor, normalized_ndim: int) -> tuple[int, ...]:
    axis = input.dim() - normalized_ndim
    return (*input.shape[:axis], *([1] * normalized_ndim))


def _below_autograd() -> torch._C._AutoDispatchBelowAutograd:
    return torch._C._AutoDispatchBelowAutograd()


def _softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    if input.dtype == torch.float16 and dtype == torch.float32 and is_fake(input):
        return torch.ops.aten._softmax(input, dim, True)
    return torch.ops.aten.softmax.int.decompose(input, dim, dtype)


def _log_softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    if input.dtype == torch.float16 and dtype == torch.float32 and is_fake(input):
        return torch.ops.aten._log_softmax(input, dim, True)
    return torch.ops.aten.log_softmax.int.decompose(input, dim, dtype)


class _LayerNorm(torch.autograd.Function):
    """`native_layer_norm` with CUDA's statistics dtype (fp32 for fp16 / bf16 inputs)."""

    @staticmethod
    def forward(ctx, input, normalized_shape, weight, bias, eps):
        with _below_autograd():
            out, mean, rstd = torch.ops.aten.native_layer_norm(
                input, normalized_shape, weight, bias, eps
            )
        statistics = accumulate_dtype(input.dtype)
        mean, rstd = mean.to(statistics), rstd.to(statistics)
        ctx.normalized_shape = normalized_shape
        ctx.save_for_backward(input, weight, bias, mean, rstd)
        ctx.mark_non_differentiable(mean, rstd)
        ctx.set_materialize_grads(False)  # no zero gradients for the statistics
        return out, mean, rstd

    @staticmethod
    def backward(ctx, grad_out, _grad_mean, _grad_rstd):
        input, weight, bias, mean, rstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[2], ctx.needs_input_grad[3]]
        if not is_fake(input):  # the CPU kernel wants its own statistics dtype
            mixed = weight is not None and weight.dtype != input.dtype
            cpu_dtype = torch.float32 if mixed else input.dtype
            mean, rstd = mean.to(cpu_dtype), rstd.to(cpu_dtype)
        grads = torch.ops.aten.native_layer_norm_backward(
            grad_out, input, ctx.normalized_shape, mean, rstd, weight, bias, mask
        )
        return grads[0], None, grads[1], grads[2], None


def _native_layer_norm(input, normalized_shape, weight, bias, eps):
    return _LayerNorm.apply(input, normalized_shape, weight, bias, eps)


class _FusedRmsNorm(torch.autograd.Function):
    """`_fused_rms_norm` as its CUDA kernel: output and fp32 `rstd`; saves input, weight, rstd."""

    @staticmethod
    def forward(ctx, input, normalized_shape, weight, eps):
        if is_fake(input):
            out = torch.empty_like(input, memory_format=torch.contiguous_format)
            rstd = input.new_empty(
                _stat_shape(input, len(normalized_shape)), dtype=accumulate_dtype(input.dtype)
            )
        else:
            with _below_autograd():
                out, rstd = torch.ops.aten._fused_rms_norm(input, normalized_shape, weight, eps)
        ctx.normalized_shape = normalized_shape
        ctx.save_for_backward(input, weight, rstd)
        ctx.mark_non_differentiable(rstd)
        ctx.set_materialize_grads(False)  # no zero gradient for rstd
        return out, rstd

    @staticmethod
    def backward(ctx, grad_out, _grad_rstd):
        input, weight, rstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[2]]
        if is_fake(input):
            backward = torch.ops.aten._fused_rms_norm_backward
        else:  # no CPU kernel: the decomposition computes the same values
            from torch._decomp.decompositions import _fused_rms_norm_backward as backward
        grad_input, grad_weight = backward(
            grad_out, input, ctx.normalized_shape, rstd, weight, mask
        )
        return grad_input, None, grad_weight, None


def _fused_rms_norm(input, normalized_shape, weight=None, eps=None):
    return _FusedRmsNorm.apply(input, normalized_shape, weight, eps)


def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    if not input.is_contiguous():
        input = input.contiguous()
    return torch.ops.aten.group_norm.default.decompose(
        input, num_groups, weight, bias, eps, cudnn_enabled
    )


def embedding_backward_buffers(
    num_indices: int,
    num_weights: int,
    embedding_dim: int,
    grad_dtype: torch.dtype,
    index_dtype: torch.dtype,
    *,
    scale_grad_by_freq: bool,
) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes `embedding_dense_backward_cuda` holds beside the weight gradient.

    Below `EMBEDDING_SORT_THRESHOLD` indices (without frequency scaling) a direct kernel needs
    none. Above it: sorted and original indices (plus counts), segment offsets, per-segment
    partial counts and offsets, and the partial sums of `num_indices / 10 + min(num_indices,
    num_weights)` segments in the accumulate type (Embedding.cu, EmbeddingBackwardKernel.cu).
    """
    if num_indices <= EMBEDDING_SORT_THRESHOLD and not scale_grad_by_freq:
        return []
    max_segments = min(num_indices, num_weights)
    max_partial_segments = num_indices // EMBEDDING_ROWS_PER_SEGMENT + max_segments
    buffers = [((num_indices,), index_dtype)] * (3 if scale_grad_by_freq else 2)
    return [
        *buffers,
        ((num_indices,), index_dtype),  # segment_offsets
        ((), torch.int64),  # num_of_segments
        ((max_segments,), index_dtype),  # partials_per_segment
        ((max_segments,), index_dtype),  # partials_per_segment_offset
        ((), torch.int64),  # num_of_partial_segments
        ((max_partial_segments,), index_dtype),  # partial_segment_offset
        ((max_partial_segments, embedding_dim), accumulate_dtype(grad_dtype)),
    ]


def _embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    held = [grad_output.contiguous()] if not grad_output.is_contiguous() else []
    buffers = embedding_backward_buffers(
        indices.numel(),
        num_weights,
        grad_output.shape[-1],
        grad_output.dtype,
        indices.dtype,
        scale_grad_by_freq=scale_grad_by_freq,
    )
    for position, (shape, dtype) in enumerate(buffers):
        if position == 2:  # the arange the radix sort pairs with the indices: through the sort
            torch.arange(indices.numel(), dtype=indices.dtype, device=indices.device)
        held.append(torch.empty(shape, dtype=dtype, device=grad_output.device))
    with _below_autograd():
        grad_weight = torch.ops.aten.embedding_dense_backward(
            grad_output, indices, num_weights, padding_idx, scale_grad_by_freq
        )
    del held
    return grad_weight


_KERNELS = {
    "softmax.int": _softmax,
    "log_softmax.int": _log_softmax,
    "native_layer_norm": _native_layer_norm,
    "_fused_rms_norm": _fused_rms_norm,
    "group_norm": _group_norm,
    "embedding_dense_backward": _embedding_dense_backward,
}


class CudaKernels:
    """While entered, the ops of this module allocate and save what their CUDA kernels do."""

    def __init__(self) -> None:
        self._overrides = KernelOverrides()

    def __enter__(self) -> CudaKernels:
        self._overrides.register(_KERNELS, "AutogradCPU")
        return self

    def __exit__(self, *exc: object) -> None:
        self._overrides.remove()


def cublas_workspace_bytes(capability: tuple[int, int], environ: Mapping[str, str]) -> int:
    """cuBLAS workspace of one (handle, stream) pair, held by the caching allocator (bytes).

    aten/src/ATen/cuda/CublasHandlePool.cpp (`parseChosenWorkspaceSize`): the
    `CUBLAS_WORKSPACE_CONFIG` pairs `:SIZE:COUNT` (KiB times count, summed) when set, else
    32 MiB on Hopper and Blackwell (sm_9x to sm_12x) and `:4096:2:16:8` (8 MiB + 128 KiB) below.
    """
    config = environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs)
    if 9 <= capability[0] <= 12:
        return 4096 * 8 * 1024
    return 4096 * 1024 * 2 + 16 * 1024 * 8


def cublaslt_extra_workspace_bytes(environ: Mapping[str, str]) -> int:
    """Workspace cuBLASLt matmuls (addmm with a bias epilogue, `linear`) add per (handle, stream).

    CublasHandlePool.cpp (`getCUDABlasLtWorkspace`): with `TORCH_CUBLASLT_UNIFIED_WORKSPACE`
    unset or true, the default of open-source CUDA builds (torch/backends/cuda/__init__.py,
    `blas_workspace_size`), cuBLASLt reuses the cuBLAS workspace: nothing more. Turned off, it
    holds its own `CUBLASLT_WORKSPACE_SIZE` KiB (1024 by default).
    """
    unified = environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1").strip().lower()
    if unified not in ("0", "false", "off", "no"):
        return 0
    return int(environ.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024


CUDNN_WORKSPACE_CAP_VARIABLE = "CUDNN_CONV_WSCAP_DBG"
"""cuDNN's own cap on a convolution engine's workspace, in MiB: engines that need more are not
offered (PyTorch docs, docs/source/cuda_environment_variables.rst)."""


CUDNN_ESTIMATE_BAND = (0.74, 1.18)
"""Measured `max_memory_allocated` over the planned estimate with cuDNN workspaces
(`PhasePlan.max_allocated_estimate`) on held-out convolutional runs with `benchmark=False`
(issue 30): 1/1.35 (7x7 stems and transposed convolutions, whose heuristic engines take less than
the lowering) to 1.18 (an engine taking more). An estimate's band, not a bound."""


def cudnn_convolution_workspace_bytes(
    batch: int,
    channels_per_group: int,
    groups: int,
    kernel_size: Sequence[int],
    positions: Sequence[int],
    itemsize: int,
    environ: Mapping[str, str],
) -> int:
    """Estimated workspace of one cuDNN convolution call while it runs (bytes, before rounding).

    aten/src/ATen/native/cudnn/Conv_v8.cpp (`run_conv_plan`): every call, forward, backward-data
    and backward-filter alike, asks the caching allocator for the chosen engine's
    `getWorkspaceSize()` and gives it back when the call returns: a temporary of the op, never
    resident. Which engine runs is cuDNN's choice: with `cudnn.benchmark=False` (the default)
    `get_configs_from_heuristics` asks cuDNN's heuristics (`CUDNN_HEUR_MODE_INSTANT`, mode A;
    mode B when `cudnnv8_use_heur_mode_b()`) and `try_configs` runs the first engine whose plan
    builds and whose workspace the allocator can give (an out-of-memory error moves on to the
    next, then to the fallback list); with `True`, `generate_and_filter_plans` times every
    engine whose workspace fits the largest free cached block. The heuristics and each engine's
    workspace live inside cuDNN, not in PyTorch's sources, so the size is not knowable without
    the GPU. The estimate charged is the explicit-GEMM lowering of the convolution, the matrix
    the GEMM engines materialise (cuDNN API reference, `CUDNN_CONVOLUTION_FWD_ALGO_GEMM`): one
    row per output position (`batch` x prod(`positions`), the spatial size on the convolution's
    output side, the input side of a transposed one) and one column per weight tap
    (`channels_per_group` x `groups` x prod(`kernel_size`)), in the op's dtype. It is neither a
    bound nor exact: implicit-GEMM engines need less (none to a few index tables), FFT and
    Winograd engines may need more (PyTorch issue 22741: a >8 GB FFT backward-filter workspace
    on a V100, cuDNN 7.4/7.5, for a 3x3 convolution whose lowering is 24.8 MB); the step's
    `max_allocated` lands within `CUDNN_ESTIMATE_BAND` of the estimate. With
    `CUDNN_CONV_WSCAP_DBG` set, cuDNN offers no engine above that many MiB.
    """
    rows = batch * math.prod(positions)
    columns = channels_per_group * groups * math.prod(kernel_size)
    lowered = rows * columns * itemsize
    cap = environ.get(CUDNN_WORKSPACE_CAP_VARIABLE, "").strip()
    if cap.isdigit():
        return min(lowered, int(cap) * 1024 * 1024)
    return lowered


_CONVOLUTION = "convolution"
_CONVOLUTION_BACKWARD = "convolution_backward"
CUDNN_CONVOLUTIONS = {
    torch.ops.aten.convolution.default: _CONVOLUTION,
    torch.ops.aten.convolution_backward.default: _CONVOLUTION_BACKWARD,
}
"""The aten ops that run cuDNN convolutions on CUDA, by name (`convolution_workspace_bytes`)."""


def convolution_workspace_bytes(name: str, args: tuple, environ: Mapping[str, str]) -> int:
    """The cuDNN workspace of one `aten.convolution` / `aten.convolution_backward` call (bytes).

    `convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
    groups)`; `convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    dilation, transposed, output_padding, groups, output_mask)`. Backward runs backward-data and
    backward-filter one after the other (aten/src/ATen/native/cudnn/ConvShared.cpp), each with
    its own workspace of the same lowering: the larger of the two is charged once.
    """
    if name == _CONVOLUTION:
        input, weight = args[0], args[1]
        transposed, groups = args[6], args[8]
        output_side = input if transposed else None
    elif name == _CONVOLUTION_BACKWARD:
        grad_output, input, weight = args[0], args[1], args[2]
        if not any(args[10][:2]):  # output_mask: neither grad_input nor grad_weight is asked for
            return 0
        transposed, groups = args[7], args[9]
        output_side = input if transposed else grad_output
    else:
        return 0
    kernel_size = tuple(weight.shape[2:])
    if output_side is None:  # a forward convolution: positions of its output
        positions = _output_positions(input, weight, args[3], args[4], args[5])
    else:
        positions = tuple(output_side.shape[2:])
    return cudnn_convolution_workspace_bytes(
        batch=input.shape[0],
        channels_per_group=weight.shape[1],
        groups=groups,
        kernel_size=kernel_size,
        positions=positions,
        itemsize=input.dtype.itemsize,
        environ=environ,
    )


def _output_positions(input, weight, stride, padding, dilation) -> tuple[int, ...]:
    spatial = input.shape[2:]
    kernel = weight.shape[2:]

    def pick(values, axis):
        return values[axis] if len(values) > 1 else values[0]

    return tuple(
        (size + 2 * pick(padding, axis) - pick(dilation, axis) * (k - 1) - 1) // pick(stride, axis)
        + 1
        for axis, (size, k) in enumerate(zip(spatial, kernel, strict=True))
    )
