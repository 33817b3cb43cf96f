"""The attention kernel a GPU would run, for `scaled_dot_product_attention` on CPU tensors.

On a CPU tensor `F.scaled_dot_product_attention` picks a CPU kernel. `CudaAttention` replaces the
op's autograd kernel for CPU tensors, while entered, with one that calls the kernel the target
GPU would pick (`DeviceRules.sdpa_backend`): flash (output and log-sum-exp saved), memory
efficient (the same, plus the mask it pads and expands) or math (the attention matrix
materialised and saved, about twice the memory). Each of those ops has its own autograd
formula, so the backward pass allocates what the GPU's backward would.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from vramkit.core.planner.cuda_rules import EFFICIENT, FLASH, DeviceRules

# The memory-efficient kernel wants its bias' last dimension padded to a multiple of this.
_EFFICIENT_BIAS_ALIGNMENT = 16


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


class CudaAttention:
    """`scaled_dot_product_attention` runs the target GPU's kernel while entered."""

    def __init__(self, rules: DeviceRules) -> None:
        self.rules = rules
        self.choices: list[str] = []
        """The kernel picked for each call, in order (a trace reports them)."""
        self._library: torch.library.Library | None = None

    def __enter__(self) -> CudaAttention:
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            library.impl("scaled_dot_product_attention", self._attention, "AutogradCPU")
        self._library = library
        return self

    def __exit__(self, *exc: object) -> None:
        if self._library is not None:
            self._library._destroy()
            self._library = None

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
        backend = self.rules.sdpa_backend(
            query.dtype,
            query.shape[-1],
            has_mask=mask is not None,
            same_head_dims=key.shape[-1] == query.shape[-1] == value.shape[-1],
        )
        self.choices.append(backend)
        if backend != FLASH and backend != EFFICIENT:
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
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            key, value = _repeat_heads(key, value, query.shape[-3])
        if backend == FLASH:
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, dropout_p, is_causal, scale=scale
            )[0]
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
