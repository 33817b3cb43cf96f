"""The CUDA rule table, op by op (docs/cuda_rules.md): each op traced on fake CPU tensors under
the planner's GPU rules allocates and saves what its CUDA kernel does.

Expected bytes are written from the CUDA source each rule cites, from shapes and dtypes; every
block is rounded as the caching allocator rounds it (`round_allocation`, 512 B). `saved` is what
autograd holds after the forward beyond the inputs and the output; peaks are measured above what
was live when the phase began.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from vramkit.core.planner.cuda.attention_rules import CUDNN, CudaAttention, cuda_sdpa_kernel
from vramkit.core.planner.cuda.cuda_rules import (
    EFFICIENT,
    FLASH,
    MATH,
    DeviceRules,
    round_allocation,
)
from vramkit.core.planner.cuda.op_rules import (
    CudaKernels,
    cublas_workspace_bytes,
    cublaslt_extra_workspace_bytes,
    cudnn_convolution_workspace_bytes,
    embedding_backward_buffers,
)
from vramkit.core.planner.cuda.optimizer_layouts import host_state_tensors, use_cuda_defaults
from vramkit.core.planner.tracing import fake_trace
from vramkit.core.planner.tracing.fake_trace import FakeStepRecorder, cuda_semantics
from vramkit.core.planner.tracing.run_setup import RunSetup

T4 = DeviceRules(capability=(7, 5), flash_attention=False, mem_efficient_attention=True)
A100 = DeviceRules(capability=(8, 0), flash_attention=True, mem_efficient_attention=True)
ADA = DeviceRules(capability=(8, 9), flash_attention=True, mem_efficient_attention=True)
H100 = DeviceRules(capability=(9, 0), flash_attention=True, mem_efficient_attention=True)
B200 = DeviceRules(capability=(10, 0), flash_attention=True, mem_efficient_attention=True)

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def block(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes the caching allocator hands out for one tensor of `shape` and `dtype`."""
    return round_allocation(math.prod(shape) * dtype.itemsize)


@dataclass(frozen=True)
class OpMemory:
    saved: int
    """Bytes live after the forward beyond the inputs and the output."""
    forward_peak: int
    """Most bytes above the inputs during the forward (the output included; with a
    convolution's cuDNN workspace, as `max_memory_allocated` reads it)."""
    backward_peak: int
    """Most bytes above what was live when backward began (gradients included)."""
    saved_tensors: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    """Shape and dtype of every tensor autograd saved, in order."""


def measure(
    build: Callable[[], Sequence[torch.Tensor]],
    op: Callable[..., torch.Tensor],
    *,
    precision: str = "32-true",
    device: DeviceRules = H100,
    kernels: bool = True,
) -> OpMemory:
    """Trace `op(*build())` and its backward as the planner does for `device`.

    `kernels=False` leaves out `CudaKernels` (which `cuda_semantics` enters), to show what the
    CPU path alone records.
    """
    setup = RunSetup(precision=precision, device=device)
    saved_tensors = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved_tensors.append((tuple(tensor.shape), tensor.dtype))
        return tensor

    # cuda_semantics enters CudaKernels; the CPU-path baseline takes it out again.
    rules = (
        contextlib.nullcontext()
        if kernels
        else mock.patch.object(fake_trace, "CudaKernels", contextlib.nullcontext)
    )
    with rules, cuda_semantics(setup) as (semantics, _), FakeTensorMode():
        inputs = build()
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        with recorder:
            recorder.register(inputs, "inputs")
            base = recorder.current
            recorder.reset_peak()
            hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            with hooks, semantics.forward_region():
                output = op(*inputs)
            forward_peak = recorder.peak_with_workspaces.bytes - base
            saved = recorder.current - base - round_allocation(output.untyped_storage().nbytes())
            gradient = torch.ones_like(output)
            recorder.reset_peak()
            before = recorder.current
            output.backward(gradient)
            backward_peak = recorder.peak_with_workspaces.bytes - before
        recorder.close()
    return OpMemory(saved, forward_peak, backward_peak, tuple(saved_tensors))


def leaf(*shape: int, dtype: torch.dtype = F32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


# --- matmul / linear -------------------------------------------------------------------------


def test_linear_saves_its_input_and_weight_and_nothing_else():
    # derivatives.yaml, addmm: mat1 and mat2 saved; Linear.cpp folds a contiguous 3-D input
    # into addmm on CPU and CUDA alike.
    batch, length, width, out = 4, 128, 64, 96
    memory = measure(lambda: (leaf(batch, length, width), leaf(out, width), leaf(out)), F.linear)
    assert memory.saved == 0
    assert memory.forward_peak == block((batch, length, out), F32)


def test_linear_under_autocast_saves_the_16_bit_copies_it_multiplies():
    batch, length, width, out = 4, 128, 64, 96
    memory = measure(
        lambda: (leaf(batch, length, width), leaf(out, width), leaf(out)),
        F.linear,
        precision="bf16-mixed",
    )
    # x, W and b cast to bf16; addmm saves the copies of x and W; b's copy lives in the
    # weight-cast cache until the autocast region ends
    saved = block((batch, length, width), BF16) + block((out, width), BF16)
    assert memory.saved == saved
    assert memory.forward_peak == saved + block((out,), BF16) + block((batch, length, out), BF16)


def test_batched_matmul_saves_views_of_its_inputs():
    shape = (2, 4, 128, 32)
    memory = measure(lambda: (leaf(*shape), leaf(*shape)), lambda q, k: q @ k.transpose(-2, -1))
    assert memory.saved == 0
    assert memory.forward_peak == block((2, 4, 128, 128), F32)


# --- convolution ---------------------------------------------------------------------------------


def lowering(batch, positions, channels, kernel, dtype=F32):
    """The explicit-GEMM lowering of a convolution (bytes): the cuDNN workspace estimate."""
    return batch * math.prod(positions) * channels * math.prod(kernel) * dtype.itemsize


def test_convolution_saves_its_input_and_weight():
    # derivatives.yaml, convolution: input and weight saved for convolution_backward, on every
    # backend. Conv_v8.cpp (`run_conv_plan`): the workspace is taken and given back within the
    # call, so nothing of it is saved; it shows only in the op's own peak.
    memory = measure(
        lambda: (leaf(8, 16, 32, 32), leaf(32, 16, 3, 3), leaf(32)),
        lambda x, w, b: F.conv2d(x, w, b, padding=1),
    )
    assert memory.saved == 0
    workspace = block((lowering(8, (32, 32), 16, (3, 3)),), torch.uint8)
    assert memory.forward_peak == block((8, 32, 32, 32), F32) + workspace


def test_the_cudnn_workspace_is_the_lowering_of_the_convolution_in_its_direction():
    # One row per output position, one column per weight tap, in the op's dtype: a stride-2
    # 3x3 conv of [4, 8, 20, 20] has 10x10 outputs, 8 x 9 taps; fp16 under autocast halves it.
    # Backward (data, then filter) holds the same lowering once more, beside the gradients.
    build = lambda: (leaf(4, 8, 20, 20), leaf(16, 8, 3, 3), leaf(16))  # noqa: E731
    op = lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1)  # noqa: E731
    fp32 = measure(build, op)
    fp16 = measure(build, op, precision="16-mixed")
    assert fp32.forward_peak == block((4, 16, 10, 10), F32) + lowering(4, (10, 10), 8, (3, 3))
    assert fp16.forward_peak - block((4, 16, 10, 10), F16) - block((16, 8, 3, 3), F16) - block(
        (4, 8, 20, 20), F16
    ) - block((16,), F16) == block((lowering(4, (10, 10), 8, (3, 3), F16),), torch.uint8)
    gradients = block((4, 8, 20, 20), F32) + block((16, 8, 3, 3), F32) + block((16,), F32)
    assert fp32.backward_peak >= gradients + lowering(4, (10, 10), 8, (3, 3))


def test_a_transposed_convolution_lowers_over_its_input_positions():
    # A transposed convolution runs cuDNN's backward-data: rows are the positions of its input,
    # columns its output channels (weight [in, out/groups, k...] x groups) times the taps.
    memory = measure(
        lambda: (leaf(2, 16, 8, 8), leaf(16, 4, 2, 2)),
        lambda x, w: F.conv_transpose2d(x, w, stride=2, groups=2),
    )
    output = block((2, 8, 16, 16), F32)
    assert memory.forward_peak == output + lowering(2, (8, 8), 4 * 2, (2, 2))


def test_the_cudnn_workspace_respects_its_cap_variable(monkeypatch):
    # CUDNN_CONV_WSCAP_DBG (MiB; PyTorch docs, cuda_environment_variables.rst): cuDNN offers no
    # engine whose workspace is larger.
    args = {"batch": 64, "channels_per_group": 64, "groups": 1, "kernel_size": (3, 3)}
    free = cudnn_convolution_workspace_bytes(**args, positions=(56, 56), itemsize=2, environ={})
    assert free == 64 * 56 * 56 * 64 * 9 * 2
    capped = cudnn_convolution_workspace_bytes(
        **args, positions=(56, 56), itemsize=2, environ={"CUDNN_CONV_WSCAP_DBG": "64"}
    )
    assert capped == 64 * 2**20


def test_a_patch_embedding_workspace_is_its_input_not_a_flat_allowance():
    # ViT's stride-16 16x16 patch conv: the lowering is the image itself (each pixel in one
    # patch), 0.6 MB for one 224x224 image, not the 128 MiB the planner used to add.
    memory = measure(
        lambda: (leaf(1, 3, 224, 224), leaf(768, 3, 16, 16), leaf(768)),
        lambda x, w, b: F.conv2d(x, w, b, stride=16),
    )
    image = 3 * 224 * 224 * 4
    assert memory.forward_peak == block((1, 768, 14, 14), F32) + block((image,), torch.uint8)


# --- normalization --------------------------------------------------------------------------------


def test_batch_norm_saves_two_fp32_statistics_per_channel():
    # cuDNN (Normalization.cpp, _select_batch_norm_backend) and native CUDA both keep save_mean
    # and save_var / save_invstd as fp32 [C] for fp32 input; the CPU kernel does the same.
    channels = 64
    memory = measure(
        lambda: (leaf(8, channels, 16, 16), leaf(channels), leaf(channels)),
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
    )
    assert memory.saved == 2 * block((channels,), F32)


def test_layer_norm_keeps_fp32_statistics_for_16_bit_inputs():
    # layer_norm_kernel.cu (layer_norm_cuda): mean and rstd [M] in the accumulate type.
    rows, width = 8 * 256, 64

    def build():
        return leaf(8, 256, width, dtype=BF16), leaf(width, dtype=BF16), leaf(width, dtype=BF16)

    def op(x, w, b):
        return F.layer_norm(x, (width,), w, b)

    assert measure(build, op, precision="bf16-true").saved == 2 * block((rows,), F32)
    cpu = measure(build, op, precision="bf16-true", kernels=False)
    assert cpu.saved == 2 * block((rows,), BF16)  # what the CPU kernel alone records


def test_group_norm_copies_a_channels_last_input_to_contiguous():
    # group_norm.cpp (group_norm): CUDA takes input.contiguous(), CPU keeps channels-last.
    shape, groups = (4, 32, 16, 16), 8

    def build():
        x = torch.randn(*shape).contiguous(memory_format=torch.channels_last).requires_grad_()
        return x, leaf(shape[1]), leaf(shape[1])

    def op(x, w, b):
        return F.group_norm(x, groups, w, b)

    statistics = 2 * block((shape[0], groups), F32)
    assert measure(build, op).saved == block(shape, F32) + statistics
    assert measure(build, op, kernels=False).saved == statistics


def test_rms_norm_runs_the_fused_kernel_with_an_fp32_rstd():
    # layer_norm.cpp (rms_norm_symint) calls _fused_rms_norm; derivatives.yaml saves input,
    # weight and result1 (rstd, fp32 [*, 1]); its backward allocates dX and dW.
    batch, length, width = 4, 256, 128

    def build():
        return leaf(batch, length, width, dtype=BF16), leaf(width, dtype=BF16)

    def op(x, w):
        return F.rms_norm(x, (width,), w)

    memory = measure(build, op, precision="bf16-true")
    rstd = block((batch, length, 1), F32)
    assert memory.saved == rstd
    assert memory.saved_tensors == (
        ((batch, length, width), BF16),
        ((width,), BF16),
        ((batch, length, 1), F32),
    )
    assert memory.forward_peak == block((batch, length, width), BF16) + rstd
    assert memory.backward_peak == block((batch, length, width), BF16) + block((width,), BF16)
    cpu = measure(build, op, precision="bf16-true", kernels=False)
    assert cpu.saved >= 2 * block((batch, length, width), F32)  # the composite's fp32 copies


# --- softmax, log_softmax, cross-entropy ---------------------------------------------------------


@pytest.mark.parametrize("function", [F.softmax, F.log_softmax])
def test_half_softmax_to_float_makes_no_fp32_copy_of_its_input(function):
    # SoftMax.cpp: on CUDA, fp16 input with dtype=float runs _softmax(x, dim, half_to_float);
    # CPU converts the input first. Autocast (fp32_set_opt_dtype) asks for dtype=float.
    shape = (8, 4, 256, 256)
    memory = measure(
        lambda: (leaf(*shape, dtype=F16),), lambda x: function(x, -1), precision="16-mixed"
    )
    assert memory.saved_tensors == ((shape, F32),)  # the fp32 result, for the backward
    assert memory.forward_peak == block(shape, F32)
    cpu = measure(
        lambda: (leaf(*shape, dtype=F16),),
        lambda x: function(x, -1),
        precision="16-mixed",
        kernels=False,
    )
    assert cpu.forward_peak == 2 * block(shape, F32)


def test_bf16_softmax_to_float_converts_on_cuda_too():
    shape = (8, 4, 256, 256)
    memory = measure(
        lambda: (leaf(*shape, dtype=BF16),), lambda x: F.softmax(x, -1), precision="bf16-mixed"
    )
    assert memory.forward_peak == 2 * block(shape, F32)  # the copy, then the result


def test_cross_entropy_under_autocast_saves_log_probabilities_twice():
    # LossNLL.cpp: cross_entropy = log_softmax(x, dtype=x.dtype) then nll_loss, which autocast
    # runs in fp32: the fp16 log-probabilities (saved by log_softmax) and their fp32 copy (saved
    # by nll_loss, with total_weight), on CPU and CUDA alike.
    rows, classes = 512, 1000
    memory = measure(
        lambda: (leaf(rows, classes, dtype=F16), torch.randint(0, classes, (rows,))),
        F.cross_entropy,
        precision="16-mixed",
    )
    log_probabilities = block((rows, classes), F16) + block((rows, classes), F32)
    assert memory.saved == log_probabilities + block((), F32)


# --- activations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "activation",
    [F.gelu, F.silu, lambda x: F.gelu(x, approximate="tanh")],
    ids=["gelu", "silu", "gelu_tanh"],
)
def test_activations_save_their_input_only(activation):
    # derivatives.yaml: gelu, silu save self; their CUDA backward kernels allocate grad_input.
    shape = (8, 128, 256)
    memory = measure(lambda: (leaf(*shape),), activation)
    assert memory.saved_tensors == ((shape, F32),)
    assert memory.saved == 0
    assert memory.forward_peak == block(shape, F32)
    assert memory.backward_peak == block(shape, F32)


# --- embedding -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [2048, 8192])
def test_embedding_backward_holds_cudas_sort_buffers(tokens):
    # Embedding.cu: at most 3072 indices take a direct kernel; more are sorted, and
    # EmbeddingBackwardKernel.cu sums partial segments of 10 rows in the accumulate type.
    vocab, width = 5000, 64
    memory = measure(
        lambda: (leaf(vocab, width), torch.randint(0, vocab, (tokens,))),
        lambda w, i: F.embedding(i, w),
    )
    assert memory.saved_tensors == (((tokens,), torch.int64),)
    assert memory.saved == 0
    if tokens <= 3072:
        buffers = 0
    else:
        segments = min(tokens, vocab)
        partial = tokens // 10 + segments
        buffers = (
            3 * block((tokens,), torch.int64)  # sorted, original indices, segment offsets
            + 2 * block((), torch.int64)
            + 2 * block((segments,), torch.int64)
            + block((partial,), torch.int64)
            + block((partial, width), F32)
        )
    assert buffers == sum(
        block(shape, dtype)
        for shape, dtype in embedding_backward_buffers(
            tokens, vocab, width, F32, torch.int64, scale_grad_by_freq=False
        )
    )
    assert memory.backward_peak == block((vocab, width), F32) + buffers


# --- scaled dot-product attention ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "dtype", "heads", "head_dim", "mask", "kernel"),
    [
        (H100, BF16, (8, 8), 64, False, CUDNN),  # cuDNN first on sm_90
        (H100, BF16, (8, 8), 64, True, CUDNN),  # and it takes masks
        (H100, BF16, (8, 8), 256, False, CUDNN),  # head dim up to 256 on sm_90
        (B200, BF16, (8, 8), 256, False, FLASH),  # 128 elsewhere
        (H100, F32, (8, 8), 64, False, EFFICIENT),  # fused kernels but efficient are 16-bit
        (A100, BF16, (8, 8), 64, False, FLASH),
        (A100, BF16, (8, 8), 20, False, FLASH),  # head dim padded to 24 for flash
        (A100, BF16, (8, 8), 64, True, EFFICIENT),  # flash takes no mask
        (A100, BF16, (8, 2), 64, False, FLASH),  # grouped-query attention, natively
        (A100, BF16, (8, 2), 64, True, MATH),  # efficient needs equal heads
        (T4, F16, (8, 8), 64, True, EFFICIENT),
        (T4, F16, (8, 8), 20, False, MATH),  # efficient wants 8-aligned 16-bit head dims
        (T4, BF16, (8, 8), 64, False, MATH),  # bf16 kernels need sm_80
    ],
)
def test_the_attention_kernel_follows_select_sdp_backend(
    rules, dtype, heads, head_dim, mask, kernel
):
    with FakeTensorMode():
        query = torch.empty(2, heads[0], 128, head_dim, dtype=dtype)
        key = torch.empty(2, heads[1], 128, head_dim, dtype=dtype)
    grouped = heads[0] != heads[1]
    assert cuda_sdpa_kernel(rules, query, key, key, has_mask=mask, enable_gqa=grouped) == kernel


def test_cudnn_attention_can_be_turned_off_by_the_environment(monkeypatch):
    with FakeTensorMode():
        query = torch.empty(2, 8, 128, 64, dtype=BF16)
    monkeypatch.setenv("TORCH_CUDNN_SDPA_PREFERRED", "0")
    assert cuda_sdpa_kernel(H100, query, query, query, has_mask=False) == FLASH


def sdpa(*, heads=8, kv_heads=8, length=512, head_dim=64, dtype=BF16, mask=False):
    def build():
        tensors = [
            leaf(2, heads, length, head_dim, dtype=dtype),
            leaf(2, kv_heads, length, head_dim, dtype=dtype),
            leaf(2, kv_heads, length, head_dim, dtype=dtype),
        ]
        if mask:
            tensors.append(torch.ones(2, 1, 1, length, dtype=torch.bool))
        return tensors

    def op(q, k, v, m=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=heads != kv_heads)

    return build, op


def test_cudnn_attention_saves_its_output_and_an_fp32_logsumexp():
    build, op = sdpa(mask=True)
    memory = measure(build, op, precision="bf16-true", device=H100)
    additive_mask = block((2, 1, 1, 512), BF16)  # the bool mask made additive, saved
    assert memory.saved == additive_mask + block((2, 8, 512, 1), F32)
    assert memory.forward_peak == additive_mask + block((2, 8, 512, 64), BF16) + block(
        (2, 8, 512, 1), F32
    )


def test_flash_attention_backward_holds_fp32_dq_accumulators():
    # flash_api.cpp (mha_bwd): softmax_d [B, H, round128(T)] and dq_accum
    # [B, round128(T), H, round32(D)], both fp32, live beside dq, dk, dv.
    batch, heads, length, head_dim = 2, 8, 500, 80
    build, op = sdpa(length=length, head_dim=head_dim)
    memory = measure(build, op, precision="bf16-true", device=A100)
    assert memory.saved == block((batch, heads, length), F32)  # the logsumexp
    qkv = block((batch, heads, length, head_dim), BF16)
    accumulators = block((batch, heads, 512), F32) + block((batch, 512, heads, 96), F32)
    assert memory.backward_peak == 3 * qkv + accumulators


def test_flash_attention_keeps_grouped_keys_unexpanded():
    batch, heads, kv_heads, length, head_dim = 2, 8, 2, 512, 64
    build, op = sdpa(heads=heads, kv_heads=kv_heads, length=length, head_dim=head_dim)
    memory = measure(build, op, precision="bf16-true", device=A100)
    assert memory.saved == block((batch, heads, length), F32)
    q_block = block((batch, heads, length, head_dim), BF16)
    kv_block = block((batch, kv_heads, length, head_dim), BF16)
    expanded = 2 * block((batch, length, heads, head_dim), BF16)  # dk, dv over all heads
    accumulators = block((batch, heads, length), F32) + block((batch, length, heads, 64), F32)
    assert memory.backward_peak == q_block + 2 * kv_block + expanded + accumulators


def test_flash_attention_pads_a_head_dim_off_multiples_of_8():
    # attention.cpp: pad_last_dim<8> copies q, k, v; the flash op saves the padded copies.
    batch, heads, length = 2, 8, 256
    build, op = sdpa(length=length, head_dim=20)
    memory = measure(build, op, precision="bf16-true", device=A100)
    padded = block((batch, heads, length, 24), BF16)
    # three padded inputs, the padded output (the returned slice's storage) and the logsumexp
    assert memory.saved + padded == 4 * padded + block((batch, heads, length), F32)


def test_efficient_attention_saves_a_logsumexp_padded_to_32_queries():
    batch, heads, length, head_dim = 2, 8, 500, 64
    build, op = sdpa(length=length, head_dim=head_dim, dtype=F32)
    memory = measure(build, op, device=T4)
    assert memory.saved == block((batch, heads, 512), F32)


def test_the_math_path_materialises_fp32_scores_for_16_bit_inputs():
    # attention.cpp (_scaled_dot_product_attention_math): 16-bit q, k, v are upcast to fp32
    # and the softmaxed [B, H, T, S] scores are saved, on CUDA as on CPU.
    batch, heads, length, head_dim = 2, 8, 256, 64
    build, op = sdpa(length=length, head_dim=head_dim)
    memory = measure(build, op, precision="bf16-true", device=T4)
    assert ((batch, heads, length, length), F32) in memory.saved_tensors
    assert memory.saved >= block((batch, heads, length, length), F32) + 3 * block(
        (batch, heads, length, head_dim), F32
    )


# --- optimizers and the gradient scaler ----------------------------------------------------------

PARAMETER_SIZES = (1 << 16, 1 << 14, 3000)


@dataclass(frozen=True)
class StepMemory:
    state: int
    """Optimizer-state bytes created by the first step."""
    temporaries: int
    """Most bytes above the resident state during the second step."""
    host: int
    """Bytes of the state CUDA keeps in host memory (`host_state_tensors`)."""


def optimizer_steps(
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
) -> StepMemory:
    with FakeTensorMode():
        params = [torch.nn.Parameter(torch.zeros(size)) for size in PARAMETER_SIZES]
        optimizer = make(params)
        use_cuda_defaults(optimizer)
        for param in params:
            param.grad = torch.zeros_like(param)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        with recorder:
            recorder.register([*params, *(p.grad for p in params)], "parameters")
            before = recorder.current
            optimizer.step()
            state = recorder.current - before
            recorder.reset_peak()
            optimizer.step()
            temporaries = recorder.peak.bytes - recorder.current
        recorder.close()
        host = sum(
            round_allocation(t.untyped_storage().nbytes()) for t in host_state_tensors(optimizer)
        )
    return StepMemory(state, temporaries, host)


def parameter_blocks() -> int:
    return sum(block((size,), F32) for size in PARAMETER_SIZES)


def test_foreach_adamw_holds_one_parameter_sized_list_in_its_step():
    # torch/optim/adam.py (_multi_tensor_adam, AdamW = decoupled weight decay):
    # exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs), alive through the update.
    memory = optimizer_steps(lambda p: torch.optim.AdamW(p, lr=1e-3))
    assert memory.temporaries == parameter_blocks()
    assert memory.state == 2 * parameter_blocks()  # exp_avg, exp_avg_sq; the steps on the host


def test_fused_adamw_updates_in_place_with_device_step_counters():
    # _fused_adamw_ (aten/src/ATen/native/cuda/FusedAdamWKernel.cu): no temporaries; the step
    # counters of a fused group live on the device.
    memory = optimizer_steps(lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True))
    assert memory.temporaries == 0
    assert memory.host == 0
    assert memory.state == 2 * parameter_blocks() + len(PARAMETER_SIZES) * block((), F32)


@pytest.mark.parametrize(("weight_decay", "lists"), [(0.0, 0), (0.01, 1)])
def test_foreach_sgd_with_momentum_adds_a_list_only_for_weight_decay(weight_decay, lists):
    # torch/optim/sgd.py (_multi_tensor_sgd): grads = _foreach_add(grads, params, alpha=wd);
    # the momentum buffers update in place.
    memory = optimizer_steps(
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=weight_decay)
    )
    assert memory.state == parameter_blocks()  # one momentum buffer per parameter
    assert memory.temporaries == lists * parameter_blocks()


def test_foreach_step_counters_are_not_device_memory():
    # torch/optim/adam.py (`_init_group`): without `capturable` or `fused`, state["step"] is
    # `torch.tensor(0.0, dtype=_get_scalar_dtype())`, a CPU tensor; the recorder leaves it out
    # after each optimizer step (`FakeStepRecorder`, `host_state_tensors`).
    memory = optimizer_steps(lambda p: torch.optim.AdamW(p, lr=1e-3))
    assert memory.host == len(PARAMETER_SIZES) * block((), F32)
    assert memory.state == 2 * parameter_blocks()


@pytest.mark.parametrize(("flags", "on_host"), [({}, True), ({"capturable": True}, False)])
def test_the_recorder_leaves_out_only_host_step_counters(flags, on_host):
    # A capturable AdamW cannot step on a CPU build (adam.py asserts CUDA parameters), so its
    # state is laid out as `_init_group` makes it, and a step without gradients (which updates
    # nothing) runs the optimizer's post-step hooks, where the recorder leaves out the host ones.
    with FakeTensorMode():
        param = torch.nn.Parameter(torch.zeros(1 << 12))
        optimizer = torch.optim.AdamW([param], lr=1e-3, **flags)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        with recorder:
            before = recorder.current
            optimizer.state[param] = {
                "step": torch.zeros(()),
                "exp_avg": torch.zeros_like(param),
                "exp_avg_sq": torch.zeros_like(param),
            }
            optimizer.step()
            state = recorder.current - before
        recorder.close()
    counter = 0 if on_host else block((), F32)
    assert state == 2 * block((1 << 12,), F32) + counter


def scaler_step():
    """One GradScaler step (scale, backward, unscale_, step, update) traced on fake tensors."""
    with FakeTensorMode():
        param = torch.nn.Parameter(torch.zeros(1 << 16))
        optimizer = torch.optim.AdamW([param], lr=1e-3)
        scaler = torch.amp.GradScaler("cpu")
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        with recorder:
            recorder.register([param], "parameters")
            (scaler.scale((param * 2).sum())).backward()
            recorder.reset_peak()
            before = recorder.current
            scaler.unscale_(optimizer)
            unscale_peak = recorder.peak.bytes - before
            scaler.step(optimizer)
            scaler.update()
            stepped = bool(optimizer.state)
            scaler_bytes = sum(
                round_allocation(t.untyped_storage().nbytes())
                for t in (scaler._scale, scaler._growth_tracker)
            )
        recorder.close()
    return unscale_peak, stepped, scaler_bytes


def test_grad_scaler_unscales_in_place_and_keeps_two_scalars():
    # torch/amp/grad_scaler.py: _scale (fp32) and _growth_tracker (int32) live on the device;
    # unscale_ makes inv_scale and found_inf, and _MultiDeviceReplicator.get copies each to the
    # gradients' device (copy=True): four scalars; _amp_foreach_non_finite_check_and_unscale_
    # then works in place, with no gradient-sized temporary.
    unscale_peak, _, scaler_bytes = scaler_step()
    assert scaler_bytes == block((), F32) + block((), torch.int32)
    assert unscale_peak == 4 * block((), F32)


def test_a_traced_grad_scaler_step_runs_the_optimizer():
    _, stepped, _ = scaler_step()
    assert stepped


# --- library workspaces --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "environ", "expected"),
    [
        ((7, 5), {}, 4096 * 1024 * 2 + 16 * 1024 * 8),
        ((8, 0), {}, 4096 * 1024 * 2 + 16 * 1024 * 8),
        ((9, 0), {}, 32 * 2**20),
        ((10, 0), {}, 32 * 2**20),
        ((7, 5), {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, 32 * 2**20),
        ((9, 0), {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}, 128 * 1024),
    ],
)
def test_the_cublas_workspace_follows_capability_and_config(capability, environ, expected):
    assert cublas_workspace_bytes(capability, environ) == expected


def test_cublaslt_shares_the_cublas_workspace_unless_told_not_to():
    assert cublaslt_extra_workspace_bytes({}) == 0
    assert cublaslt_extra_workspace_bytes({"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}) == 2**20
    separate = {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0", "CUBLASLT_WORKSPACE_SIZE": "4096"}
    assert cublaslt_extra_workspace_bytes(separate) == 4 * 2**20


def test_the_planners_cublas_workspace_reads_cublas_workspace_config(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert T4.cublas_workspace_bytes() == 32 * 2**20


# --- the planner's path --------------------------------------------------------------------------


def test_the_planners_cuda_semantics_apply_the_op_rules():
    width = 128
    memory = measure(
        lambda: (leaf(4, 256, width, dtype=BF16), leaf(width, dtype=BF16)),
        lambda x, w: F.rms_norm(x, (width,), w),
        precision="bf16-true",
    )
    assert memory.saved == block((4, 256, 1), F32)


def test_real_tensors_keep_pytorch_values():
    torch.manual_seed(0)
    x = torch.randn(4, 16, 64, dtype=BF16, requires_grad=True)
    w = torch.randn(64, dtype=BF16, requires_grad=True)
    half = torch.randn(4, 8, dtype=F16)
    table = torch.randn(100, 8, requires_grad=True)
    indices = torch.randint(0, 100, (4000,))
    channels_last = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)

    def results():
        outputs = [
            F.layer_norm(x, (64,), w, w),
            F.rms_norm(x, (64,), w),
            F.softmax(half, -1, dtype=F32),
            F.group_norm(channels_last, 4),
        ]
        F.embedding(indices, table).sum().backward()
        (outputs[0].float().sum() + outputs[1].float().sum()).backward()
        grads = [t.grad.clone() for t in (x, w, table)]
        for t in (x, w, table):
            t.grad = None
        return [o.detach().float() for o in outputs] + [g.float() for g in grads]

    expected = results()
    with CudaKernels():
        actual = results()
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


# --- nn.MultiheadAttention inference fast path ---------------------------------------------------


def test_the_unmasked_fast_path_fuses_whenever_sdpa_has_a_fused_kernel():
    from vramkit.core.planner.cuda.fast_paths import native_attention_cuda

    batch, length, heads, width = 2, 512, 8, 32  # head dim 4: efficient in fp32 (4-aligned)
    with FakeTensorMode():
        attention = torch.nn.MultiheadAttention(width, heads, batch_first=True).eval()
        query = torch.randn(batch, length, width)
        recorder = FakeStepRecorder(scalar_stand_in=1, round_to_device=True, keep_timeline=False)
        with torch.no_grad(), CudaAttention(T4), recorder:
            recorder.register([query], "inputs")
            base = recorder.current
            native_attention_cuda(attention, query, masked=False, need_weights=False, rules=T4)
            peak = recorder.peak.bytes - base
        recorder.close()
    assert peak < block((batch, heads, length, length), F32)
