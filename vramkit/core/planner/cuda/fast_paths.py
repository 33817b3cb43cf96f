"""The inference fast path of `nn.MultiheadAttention`, as a GPU validation step takes it.

In eval mode without grad, `nn.MultiheadAttention.forward` (torch/nn/modules/activation.py) and
`nn.TransformerEncoderLayer.forward` (torch/nn/modules/transformer.py) hand self-attention to
`torch._native_multi_head_attention`. They refuse while any `TorchFunctionMode` is active ("some
Tensor argument has_torch_function"), and the planner's CUDA rules are such modes, so a plain
trace follows the Python path, which a real run never takes. The CUDA kernel
(`native_multi_head_attention_cuda`, aten/src/ATen/native/transformers/cuda/attention.cu) runs
fused SDPA only without a mask; with a mask (a key-padding mask, always, for padded batches) or
when the weights are asked for, it materialises the attention scores:

1. ``qkv = qkv_projection(query)``: [B, T, 3D];
2. ``_transform_bias_rescale_qkv`` copies it into q, k, v: [3, B, H, T, D/H], ``qkv`` freed;
3. ``qkt = bmm_nt(q, k)``: [B, H, T, T] in the query's dtype;
4. ``qkt = masked_softmax(qkt, mask)``: a second [B, H, T, T], the first freed after it;
5. ``bmm_nn`` writes the context into q's storage (no new block); ``qkt`` freed unless the
   weights are returned (averaged over heads: [B, T, T]);
6. ``transform0213_gemm_nt_bias``: the output projection, [B, T, D].

The SAGE student of the field (8 heads, T = 5164, fp32) died on exactly step 4's block:
8 × 8 × 5164² × 4 B = 6.36 GiB at validation batch 8. `InferenceFastPaths` makes every
`nn.MultiheadAttention` of a module that the real run would send down this path allocate what
the CUDA kernel allocates, in that order.

A `TransformerEncoder` of post-norm layers may first pack a padded batch into a nested tensor
and drop the mask (its `use_nested_tensor`); that path is planned as the masked one, which
needs more memory, so the plan errs on the safe side there.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from vramkit.core.planner.cuda.attention_rules import cuda_sdpa_kernel
from vramkit.core.planner.cuda.cuda_rules import MATH, DeviceRules


def takes_fast_path(
    attention: nn.MultiheadAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    autocast: bool,
) -> bool:
    """Whether `attention(query, key, value)` runs `_native_multi_head_attention` on a GPU.

    The conditions of `nn.MultiheadAttention.forward` (torch 2.x), less the ones the planner's
    own modes and fake tensors break (`has_torch_function`, the device type); ``autocast`` says
    whether the real run has autocast on (mixed precision), which blocks the path.
    """
    return (
        torch.backends.mha.get_fastpath_enabled()
        and not attention.training
        and not torch.is_grad_enabled()
        and not autocast
        and query.dim() == 3
        and query is key
        and key is value
        and attention.batch_first
        and attention.in_proj_weight is not None
        and attention.in_proj_bias is not None
        and query.dtype == attention.in_proj_weight.dtype == attention.in_proj_bias.dtype
        and attention.num_heads % 2 == 0
        and attention.bias_k is None
        and attention.bias_v is None
        and not attention.add_zero_attn
        and attention._qkv_same_embed_dim
        and not query.is_nested
    )


def layer_takes_fast_path(
    layer: nn.TransformerEncoderLayer, src: torch.Tensor, *, autocast: bool
) -> bool:
    """Whether `layer(src, …)` runs `torch._transformer_encoder_layer_fwd` on a GPU.

    The conditions of `nn.TransformerEncoderLayer.forward` (torch 2.x), less the ones the
    planner's own modes and fake tensors break; that path calls `_native_multi_head_attention`
    with the merged (boolean) masks, which the layer's Python path would have turned into a
    float mask that `nn.MultiheadAttention` refuses on its own fast path.
    """
    attention = layer.self_attn
    hooks = any(
        len(getattr(m, "_forward_hooks", {})) + len(getattr(m, "_forward_pre_hooks", {}))
        for m in layer.modules()
    )
    return (
        torch.backends.mha.get_fastpath_enabled()
        and src.dim() == 3
        and not src.is_nested
        and not layer.training
        and not torch.is_grad_enabled()
        and not autocast
        and attention.batch_first
        and attention.in_proj_bias is not None
        and attention._qkv_same_embed_dim
        and bool(layer.activation_relu_or_gelu)
        and layer.norm1.eps == layer.norm2.eps
        and attention.num_heads % 2 == 0
        and not hooks
    )


def _sdpa_kernel(rules: DeviceRules, query: torch.Tensor, heads: int, head_dim: int) -> str:
    """The SDPA kernel `native_multi_head_attention_cuda` asks `select_sdp_backend` for
    (attention.cu, PyTorch 2.5+: fused whenever it is not math; no head-dimension condition of
    its own). The [B, H, T, D] shape is described on the meta device, outside every mode, so the
    question allocates nothing the trace would count."""
    batch, length, _ = query.shape
    with _disable_current_modes():
        shape = torch.empty((batch, heads, length, head_dim), dtype=query.dtype, device="meta")
    return cuda_sdpa_kernel(rules, shape, shape, shape, has_mask=False)


def native_attention_cuda(
    attention: nn.MultiheadAttention,
    query: torch.Tensor,
    *,
    masked: bool,
    need_weights: bool,
    rules: DeviceRules,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What `native_multi_head_attention_cuda` allocates, on the tensors at hand (module doc).

    Values are not computed faithfully (a fake trace has none); shapes, dtypes and the order
    of allocations and frees are the kernel's.
    """
    batch, length, width = query.shape
    heads = attention.num_heads
    head_dim = width // heads
    fused = not masked and not need_weights and _sdpa_kernel(rules, query, heads, head_dim) != MATH
    if fused:
        qkv = F.linear(query, attention.in_proj_weight, attention.in_proj_bias)
        q, k, v = (
            chunk.view(batch, length, heads, head_dim).transpose(1, 2) for chunk in qkv.chunk(3, -1)
        )
        context = F.scaled_dot_product_attention(q, k, v)
        del q, k, v, qkv
        merged = context.transpose(1, 2).reshape(batch, length, width)
        del context
        return F.linear(merged, attention.out_proj.weight, attention.out_proj.bias), None
    qkv = torch.matmul(query, attention.in_proj_weight.t())
    q_k_v = qkv.new_empty((3, batch, heads, length, head_dim))
    del qkv
    scores = q_k_v.new_empty((batch, heads, length, length))
    probabilities = torch.empty_like(scores)
    del scores
    weights = probabilities.sum(1) / heads if need_weights else None
    del probabilities
    merged = q_k_v.new_empty((batch, length, width))
    output = F.linear(merged, attention.out_proj.weight, attention.out_proj.bias)
    del merged, q_k_v
    return output, weights


class InferenceFastPaths:
    """While entered, the attention of `module` plans the GPU's inference fast path.

    A call the real run would send down `_native_multi_head_attention` (from an
    `nn.TransformerEncoderLayer`'s fast path or `nn.MultiheadAttention`'s own) allocates what the
    CUDA kernel allocates (`native_attention_cuda`); every other call runs as it is.
    ``autocast``: the run's precision turns autocast on (then no call takes the fast path).
    """

    def __init__(self, module: nn.Module, rules: DeviceRules, *, autocast: bool) -> None:
        self.attentions = [m for m in module.modules() if isinstance(m, nn.MultiheadAttention)]
        self.layers = [m for m in module.modules() if isinstance(m, nn.TransformerEncoderLayer)]
        self.rules = rules
        self.autocast = autocast
        self.calls = 0
        """Calls planned on the fast path (a trace can report them)."""
        self._inside_fast_layer: set[int] = set()

    def __enter__(self) -> InferenceFastPaths:
        for attention in self.attentions:
            attention.forward = types.MethodType(self._forward, attention)
        for layer in self.layers:
            layer.forward = types.MethodType(self._layer_forward, layer)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for module in (*self.attentions, *self.layers):
            del module.forward  # the class's forward again

    def _layer_forward(
        self, layer: nn.TransformerEncoderLayer, src: torch.Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        if not layer_takes_fast_path(layer, src, autocast=self.autocast):
            return type(layer).forward(layer, src, *args, **kwargs)
        self._inside_fast_layer.add(id(layer.self_attn))
        try:
            return type(layer).forward(layer, src, *args, **kwargs)
        finally:
            self._inside_fast_layer.discard(id(layer.self_attn))

    def _forward(
        self,
        attention: nn.MultiheadAttention,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> Any:
        floating_mask = any(
            mask is not None and torch.is_floating_point(mask)
            for mask in (key_padding_mask, attn_mask)
        )
        fast = id(attention) in self._inside_fast_layer or (
            not floating_mask
            and takes_fast_path(attention, query, key, value, autocast=self.autocast)
        )
        if not fast or (need_weights and not average_attn_weights):
            return type(attention).forward(
                attention,
                query,
                key,
                value,
                key_padding_mask=key_padding_mask,
                need_weights=need_weights,
                attn_mask=attn_mask,
                average_attn_weights=average_attn_weights,
                is_causal=is_causal,
            )
        self.calls += 1
        masked = key_padding_mask is not None or attn_mask is not None
        return native_attention_cuda(
            attention, query, masked=masked, need_weights=need_weights, rules=self.rules
        )
