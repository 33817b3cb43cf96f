"""The attention kernel a GPU would run, for `scaled_dot_product_attention` on CPU tensors.

On a CPU tensor `F.scaled_dot_product_attention` picks a CPU kernel. `CudaAttention` replaces the
op's autograd kernel for CPU tensors, while entered, with the kernel the target GPU picks
(`cuda_sdpa_kernel`, after `select_sdp_backend` in aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp) and allocates what that kernel allocates:

- cuDNN attention (first choice on sm_90 / sm_100 with cuDNN >= 9.9, which PyTorch 2.8+ wheels
  ship): output and an fp32 log-sum-exp [B, H, T, 1] saved, masks taken as they are;
- flash (sm_80+, fp16/bf16, no explicit mask): output and an fp32 log-sum-exp [B, H, T] saved; a
  head dimension that is not a multiple of 8 is padded first (attention.cpp pads q, k, v and the
  flash op saves the padded copies); grouped-query attention runs without expanding k and v; its
  backward holds an fp32 `dq_accum` [B, round128(T), H, round32(D)] and an fp32 `softmax_d`
  [B, H, round128(T)] (and [B, S, H, D] expansions of dk, dv under GQA) besides the gradients
  (flash_attn/flash_api.cpp, `mha_bwd`);
- memory efficient (masks, fp32; bf16 only on sm_80+; the same number of heads for q, k, v):
  output and a log-sum-exp padded to 32 queries, plus the mask it pads and expands;
- math otherwise: the [B, H, T, S] attention matrix materialised and saved.

Fake tensors get the CUDA kernels' allocations; real CPU tensors run CPU kernels of the same
family, so that the values stay right.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from vramkit.core.planner.cuda.cuda_rules import EFFICIENT, FLASH, MATH, DeviceRules
from vramkit.core.planner.cuda.kernel_overrides import KernelOverrides

CUDNN = "cudnn"

# The memory-efficient kernel wants its bias' last dimension padded to a multiple of this.
_EFFICIENT_BIAS_ALIGNMENT = 16
# attention.cu (_efficient_attention_forward) pads the logsumexp to this many queries (kAlignLSE).
_EFFICIENT_LSE_ALIGNMENT = 32
# flash_api.cpp rounds the query length to 128 and the head dimension to 32 (256 above 192).
_FLASH_LENGTH_ROUNDING = 128
_FLASH_HEAD_ROUNDING = 32


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    # As ATen does first: a boolean mask becomes an additive one (0 or -inf) in the query dtype.
    if mask is None or mask.dtype != torch.bool:
        return mask
    zeros = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zeros, torch.full((), -math.inf, dtype=dtype, device=mask.device))


def _repeat_heads(key: torch.Tensor, value: torch.Tensor, heads: int) -> tuple[torch.Tensor, ...]:
    groups = heads // key.shape[-3]
    return key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)


def _efficient_bias(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    length = key.shape[-2]
    pad = -length % _EFFICIENT_BIAS_ALIGNMENT
    if pad:
        mask = F.pad(mask, (0, pad))[..., :length]
    shape = (*query.shape[:-1], length)
    return mask.expand(shape)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def cudnn_attention_preferred(rules: DeviceRules) -> bool:
    """cuDNN attention goes first on sm_90 and sm_100 (`check_prefer_cudnn_attention`, sm_X.0
    with cuDNN >= 9.9) unless `TORCH_CUDNN_SDPA_PREFERRED=0`."""
    if os.environ.get("TORCH_CUDNN_SDPA_PREFERRED", "1").strip().lower() in ("0", "false", "off"):
        return False
    return rules.capability in ((9, 0), (10, 0))


def cuda_sdpa_kernel(
    rules: DeviceRules,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    has_mask: bool,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> str:
    """The kernel `select_sdp_backend` (sdp_utils.cpp) picks on `rules`' GPU for these inputs.

    Fused kernels take 4-D inputs only. cuDNN: sm_80+, fp16/bf16, head dimensions multiples of 8
    up to 128 (256 on sm_90), masks and grouped-query attention allowed, key length above 1.
    Flash: fp16/bf16, no mask, equal head dimensions up to 256 (padded to a multiple of 8),
    causal only with equal lengths, grouped-query attention allowed; training on sm_86/89/120
    refuses head dimensions in (192, 224]. Memory efficient: fp16/fp32 (bf16 on sm_80+), head
    dimensions aligned to 8 (16 bit) or 4 (fp32), the same number of heads for q, k and v.
    """
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return MATH
    sixteen_bit = query.dtype in (torch.float16, torch.bfloat16)
    low_precision = query.dtype == torch.float16 or (
        query.dtype == torch.bfloat16 and rules.capability >= (8, 0)
    )
    head_dim, value_dim = query.shape[-1], value.shape[-1]
    same_heads = query.shape[-3] == key.shape[-3] == value.shape[-3]
    grouped = enable_gqa and query.shape[-3] % key.shape[-3] == 0
    heads_ok = same_heads or grouped
    requires_grad = query.requires_grad or key.requires_grad or value.requires_grad

    cudnn_limit = 256 if rules.capability == (9, 0) else 128
    cudnn = (
        rules.capability >= (8, 0)
        and low_precision
        and heads_ok
        and head_dim % 8 == 0
        and value_dim % 8 == 0
        and max(head_dim, value_dim) <= cudnn_limit
        and key.shape[-2] > 1
    )
    sm86_89_120 = (8, 6) <= rules.capability <= (8, 9) or (12, 0) <= rules.capability <= (12, 1)
    flash = (
        rules.flash_attention
        and (8, 0) <= rules.capability <= (12, 1)
        and low_precision
        and not has_mask
        and head_dim == key.shape[-1] == value_dim
        and head_dim <= 256
        and heads_ok
        and not (is_causal and query.shape[-2] != key.shape[-2])
        and not (requires_grad and sm86_89_120 and 192 < head_dim <= 224)
    )
    efficient_dtype = query.dtype in (torch.float16, torch.float32) or (
        query.dtype == torch.bfloat16 and rules.capability >= (8, 0)
    )
    alignment = 8 if sixteen_bit else 4
    efficient = (
        rules.mem_efficient_attention
        and rules.capability >= (5, 0)
        and efficient_dtype
        and same_heads
        and head_dim == key.shape[-1]
        and head_dim % alignment == 0
        and value_dim % alignment == 0
    )
    order = (CUDNN, FLASH, EFFICIENT) if cudnn_attention_preferred(rules) else (FLASH, EFFICIENT)
    usable = {CUDNN: cudnn, FLASH: flash, EFFICIENT: efficient}
    return next((kernel for kernel in order if usable[kernel]), MATH)


class _FusedAttention(torch.autograd.Function):
    """A fused attention kernel as memory: output and an fp32 log-sum-exp saved with q, k, v
    (and the mask); its backward allocates the gradients and `backward_buffers` beside them."""

    @staticmethod
    def forward(ctx, query, key, value, mask, lse_shape, backward_buffers):
        batch_heads_length = query.shape[:-1]
        output = query.new_empty((*batch_heads_length, value.shape[-1]))
        logsumexp = query.new_empty(lse_shape, dtype=torch.float32)
        ctx.backward_buffers = backward_buffers
        ctx.save_for_backward(query, key, value, mask, output, logsumexp)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, _mask, _output, _logsumexp = ctx.saved_tensors
        held = [query.new_empty(shape, dtype=dtype) for shape, dtype in ctx.backward_buffers]
        grads = (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value))
        del held
        return (*grads, None, None, None)


def flash_backward_buffers(
    query: torch.Tensor, key: torch.Tensor
) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """What flash attention's backward holds beside dq, dk, dv (flash_api.cpp, `mha_bwd`)."""
    batch, heads, length, head_dim = query.shape
    rounded_length = _round_up(length, _FLASH_LENGTH_ROUNDING)
    rounded_head = _round_up(head_dim, _FLASH_HEAD_ROUNDING) if head_dim <= 192 else 256
    buffers = [
        ((batch, heads, rounded_length), torch.float32),  # softmax_d
        ((batch, rounded_length, heads, rounded_head), torch.float32),  # dq_accum
    ]
    if key.shape[-3] != heads:  # dk, dv over all query heads before the group sum
        expanded = (batch, key.shape[-2], heads, head_dim)
        buffers += [(expanded, query.dtype), (expanded, query.dtype)]
    return buffers


class CudaAttention:
    """`scaled_dot_product_attention` runs the target GPU's kernel while entered."""

    def __init__(self, rules: DeviceRules) -> None:
        self.rules = rules
        self.choices: list[str] = []
        """The kernel picked for each call, in order (a trace reports them)."""
        self._overrides = KernelOverrides()

    def __enter__(self) -> CudaAttention:
        self._overrides.register({"scaled_dot_product_attention": self._attention}, "AutogradCPU")
        return self

    def __exit__(self, *exc: object) -> None:
        self._overrides.remove()

    def _attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        **extra: Any,
    ) -> torch.Tensor:
        if extra:
            raise TypeError(f"scaled_dot_product_attention: unexpected arguments {sorted(extra)}")
        mask = _float_mask(attn_mask, query.dtype)
        backend = cuda_sdpa_kernel(
            self.rules,
            query,
            key,
            value,
            has_mask=mask is not None,
            is_causal=is_causal,
            enable_gqa=enable_gqa,
        )
        self.choices.append(backend)
        if is_fake(query) and backend != MATH:
            return self._fused(backend, query, key, value, mask)
        if backend == EFFICIENT:
            bias = None if mask is None else _efficient_bias(mask, query, key)
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query,
                key,
                value,
                bias,
                query.requires_grad or key.requires_grad or value.requires_grad,
                dropout_p,
                is_causal,
                scale=scale,
            )[0]
        if backend == MATH or mask is not None:
            return torch.ops.aten._scaled_dot_product_attention_math(
                query,
                key,
                value,
                mask,
                dropout_p,
                is_causal,
                None,
                scale=scale,
                enable_gqa=enable_gqa,
            )[0]
        if key.shape[-3] != query.shape[-3]:
            key, value = _repeat_heads(key, value, query.shape[-3])
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, scale=scale
        )[0]

    @classmethod
    def _fused(
        cls,
        backend: str,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """What the fused CUDA kernel allocates and saves (values are not computed)."""
        if backend == FLASH:
            return cls._flash(query, key, value)
        grad = query.requires_grad or key.requires_grad or value.requires_grad
        if backend == CUDNN:  # attention.cu: logsumexp [B, H, T, 1] when grad is needed
            lse_shape = (*query.shape[:-1], 1 if grad else 0)
            return _FusedAttention.apply(query, key, value, mask, lse_shape, [])
        # efficient: logsumexp padded to 32 queries, empty without grad
        rounded = _round_up(query.shape[-2], _EFFICIENT_LSE_ALIGNMENT)
        lse_shape = (*query.shape[:-2], rounded if grad else 0)
        bias = None if mask is None else _efficient_bias(mask, query, key)
        return _FusedAttention.apply(query, key, value, bias, lse_shape, [])

    @staticmethod
    def _flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        head_dim = query.shape[-1]
        pad = -head_dim % 8
        if pad:  # attention.cpp: pad_last_dim<8> before the flash op, which saves the copies
            query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
        output = _FusedAttention.apply(
            query, key, value, None, query.shape[:-1], flash_backward_buffers(query, key)
        )
        return output[..., :head_dim] if pad else output
