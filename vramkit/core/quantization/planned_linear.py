"""A stand-in for bitsandbytes' quantized Linear layers that the memory planner can trace.

bitsandbytes cannot quantize weights that do not exist (the planner builds the model on the meta
device and then gives it fake tensors), and its `Params4bit` / `QuantState` do not survive that
conversion. `PlannedQuantizedLinear` holds what a quantized layer keeps on the device and
allocates what its training step allocates, so a fake-tensor trace counts it. Every rule below
was read from bitsandbytes' sources (tags 0.43.1, 0.43.2 and 0.50.2 of
github.com/bitsandbytes-foundation/bitsandbytes); the version-dependent ones are in
:mod:`vramkit.core.quantization.bitsandbytes_rules`.

Stored (`bitsandbytes/functional.py`, `quantize_4bit` and `quantize_blockwise`):

- 4-bit, NF4 or FP4 alike (`nn.Linear4bit`, blocksize 64): the packed weight,
  ``ceil(out·in / 2)`` uint8 of shape ``(n, 1)``, and a `QuantState` of: the 16-entry fp32 code of
  the data type (`get_4bit_type`, one per layer); with double quantization
  (``compress_statistics=True``, transformers' ``bnb_4bit_use_double_quant``) one uint8 absmax
  per 64 weights, the 0-d fp32 ``offset`` (their mean), one fp32 absmax per 256 of those and the
  256-entry fp32 dynamic code (``code.to(A.device, copy=True)``: a copy per layer); without it one
  fp32 absmax per 64 weights.
- 8-bit (`nn.Linear8bitLt`, ``has_fp16_weights=False``): ``out·in`` int8 (`Int8Params`' ``CB``)
  and one fp32 scale per output row (``SCB``).

Forward and backward:

- `Linear4bit.forward` (`bitsandbytes/nn/modules.py`): without a compute dtype the first input's
  dtype becomes it when that is fp32 or bf16 (`set_compute_type`, kept for later calls; an fp16
  input leaves it unset); the input is cast to the compute dtype, the bias to the input's, and
  the output is cast back to the input's dtype: ``matmul_4bit(x, …).to(inp_dtype)``. Under
  peft's ``prepare_model_for_kbit_training`` the norms are fp32, so a bf16-compute layer reads an
  fp32 input and returns an fp32 output: the casts' copies are allocated, and the output is
  twice the size of a bf16 one.
- `MatMul4Bit` (`bitsandbytes/autograd/_functions.py`): for a training batch (more than 1536
  rows, or any fp32 input) the CUDA `gemm_4bit` falls back to dequantize + `F.linear`
  (`bitsandbytes/backends/cuda/ops.py`, `_dequant_linear_fallback`): with double quantization an
  fp32 absmax of one value per 64 weights, then an ``out × in`` weight in the input's dtype.
  Saved for backward: the packed weight, and up to bitsandbytes 0.43.1 the (cast) input as well.
  Backward dequantizes the weight again in the dtype it was quantized from (`QuantState.dtype`)
  and casts it to the gradient's dtype (``F.dequantize_4bit(B, ctx.state).to(grad_output.dtype)``).
- `MatMul8bitLt`: the input cast to fp16 (when it is not), its int8 copy and one fp32 scale per
  row; the output in the input's dtype; the input saved for backward (``ctx.tensors = (CAt, subA,
  A)``, every version); backward rebuilds an ``out × in`` weight in the input's dtype
  (``state.CB.to(ctx.dtype_A, copy=True)``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from vramkit.core.quantization.bitsandbytes_rules import (
    PlannedBitsandbytes,
    keeps_4bit_input,
    planned_bitsandbytes,
)

NF4_BLOCK = 64
"""Weights per absmax block of bitsandbytes' 4-bit quantization (`Linear4bit`'s default)."""
ABSMAX_BLOCK = 256
"""Absmax values per block of the second (double) quantization (`quantize_4bit`, nested)."""
QUANT_TYPES = ("nf4", "fp4")
KINDS = ("4bit", "8bit")
_SAFE_COMPUTE = (torch.float32, torch.bfloat16)
"""Input dtypes `Linear4bit.set_compute_type` adopts as the compute dtype when none was given."""


def quantized_weight_shapes(
    out_features: int, in_features: int, kind: str, *, double_quant: bool = True
) -> dict[str, Any]:
    """The device tensors of a quantized ``out × in`` weight: name -> (shape, dtype).

    ``double_quant`` (4-bit only; bitsandbytes' ``compress_statistics``, transformers'
    ``bnb_4bit_use_double_quant``) quantizes the absmax values again; without it they stay fp32.
    NF4 and FP4 store the same sizes.
    """
    numel = out_features * in_features
    if kind == "4bit":
        blocks = math.ceil(numel / NF4_BLOCK)
        shapes: dict[str, Any] = {
            "weight": ((math.ceil(numel / 2), 1), torch.uint8),
            "code": ((16,), torch.float32),
        }
        if not double_quant:
            shapes["absmax"] = ((blocks,), torch.float32)
            return shapes
        shapes["absmax"] = ((blocks,), torch.uint8)
        shapes["offset"] = ((), torch.float32)
        shapes["absmax2"] = ((math.ceil(blocks / ABSMAX_BLOCK),), torch.float32)
        shapes["code2"] = ((256,), torch.float32)
        return shapes
    if kind == "8bit":
        return {
            "weight": ((out_features, in_features), torch.int8),
            "absmax": ((out_features,), torch.float32),
        }
    raise ValueError(f"unknown quantization {kind!r}; one of {KINDS}")


def _fake_dense(
    shape: tuple[int, ...], dtype: torch.dtype, like: torch.Tensor, nested_blocks: int
) -> torch.Tensor:
    # Memory only: the planner's trace needs the allocations, not the values. A nested state's
    # fp32 absmax is rebuilt first and freed with the weight (`_dequant_linear_fallback`).
    absmax = torch.empty(nested_blocks, dtype=torch.float32, device=like.device)
    weight = torch.zeros(shape, dtype=dtype, device=like.device)
    del absmax
    return weight


class _Dequantized4bitMatmul(torch.autograd.Function):
    """`MatMul4Bit`: y = x·Wᵀ + b, W rebuilt from its packed form in forward and in backward."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, packed: torch.Tensor, layer: PlannedQuantizedLinear, bias: Any
    ) -> torch.Tensor:
        weight = _fake_dense(layer.dense_shape, x.dtype, packed, layer.nested_blocks)
        out = F.linear(x, weight, bias)
        del weight
        # bitsandbytes <= 0.43.1 kept the input too: `ctx.tensors = (A, B)`.
        ctx.save_for_backward(packed, x if layer.keeps_input else None)
        ctx.layer = layer
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        packed, _ = ctx.saved_tensors
        layer = ctx.layer
        grad_bias = grad_out.sum(dim=tuple(range(grad_out.dim() - 1))) if ctx.has_bias else None
        weight = _fake_dense(layer.dense_shape, layer.weight_dtype, packed, layer.nested_blocks)
        weight = weight.to(grad_out.dtype)
        grad_x = grad_out @ weight
        return grad_x, None, None, grad_bias


class _Int8Matmul(torch.autograd.Function):
    """`MatMul8bitLt` with int8 weights: the input's int8 copy in forward, the input saved."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, int8: torch.Tensor, layer: PlannedQuantizedLinear, bias: Any
    ) -> torch.Tensor:
        half = x if x.dtype == torch.float16 else x.to(torch.float16)
        rows = half.numel() // half.shape[-1]
        quantized = torch.empty(half.shape, dtype=torch.int8, device=x.device)
        scales = torch.empty(rows, dtype=torch.float32, device=x.device)
        del half, quantized, scales
        weight = torch.zeros(layer.dense_shape, dtype=x.dtype, device=x.device)
        out = F.linear(x, weight, bias)
        del weight
        ctx.save_for_backward(int8, x)
        ctx.layer = layer
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        int8, x = ctx.saved_tensors
        grad_bias = grad_out.sum(dim=tuple(range(grad_out.dim() - 1))) if ctx.has_bias else None
        weight = torch.zeros(ctx.layer.dense_shape, dtype=x.dtype, device=int8.device)
        grad_x = grad_out.to(x.dtype) @ weight
        return grad_x, None, None, grad_bias


class PlannedQuantizedLinear(nn.Linear):
    """A frozen Linear layer stored as bitsandbytes stores it, for planning only (no values).

    A subclass of `nn.Linear` so that peft puts its adapters on it as on the real layer. Its
    fp32 quantization state keeps its dtype when the planner makes the model fake under a 16-bit
    precision (bitsandbytes' `QuantState` is no buffer: ``module.to(dtype)`` leaves it).
    ``dtype`` is the dtype the weight was quantized from (`QuantState.dtype`) and the bias's;
    ``keeps_input`` is bitsandbytes' version rule (`bitsandbytes_rules.keeps_4bit_input`);
    ``bitsandbytes`` the release whose rules built the layer (the plan names it).
    """

    keeps_own_dtypes = True
    """Read by the planner's `materialize_fake` (`subject.KEEPS_OWN_DTYPES`)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        kind: str,
        quant_type: str = "nf4",
        double_quant: bool = True,
        compute_dtype: torch.dtype | None = None,
        keeps_input: bool = False,
        bitsandbytes: PlannedBitsandbytes | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        nn.Module.__init__(self)
        if quant_type not in QUANT_TYPES:
            raise ValueError(f"unknown 4-bit quant_type {quant_type!r}; one of {QUANT_TYPES}")
        self.in_features = in_features
        self.out_features = out_features
        self.kind = kind
        self.quant_type = quant_type
        self.double_quant = double_quant and kind == "4bit"
        self.compute_dtype = compute_dtype
        self.keeps_input = keeps_input
        self.bitsandbytes = bitsandbytes or planned_bitsandbytes()
        self.weight_dtype = dtype or torch.get_default_dtype()
        self.dense_shape = (out_features, in_features)
        self.nested_blocks = (
            math.ceil(out_features * in_features / NF4_BLOCK) if self.double_quant else 0
        )
        tensors = quantized_weight_shapes(
            out_features, in_features, kind, double_quant=double_quant
        )
        shape, packed_dtype = tensors["weight"]
        self.weight = nn.Parameter(
            torch.empty(shape, dtype=packed_dtype, device=device), requires_grad=False
        )
        for name, (buffer_shape, buffer_dtype) in tensors.items():
            if name != "weight":
                buffer = torch.empty(buffer_shape, dtype=buffer_dtype, device=device)
                self.register_buffer(name, buffer)
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
            if bias
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Output (…, out_features) for input (…, in_features), in the input's dtype."""
        if self.kind == "8bit":
            return self._forward_8bit(x)
        if self.compute_dtype is None and x.dtype in _SAFE_COMPUTE:
            self.compute_dtype = x.dtype  # `set_compute_type`, once: later inputs keep it
        input_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        bias = self.bias
        if bias is not None:
            if bias.dtype != x.dtype:
                bias.data = bias.data.to(x.dtype)
            bias = bias.to(x.dtype)
        if torch.is_grad_enabled() and x.requires_grad:
            out = _Dequantized4bitMatmul.apply(x, self.weight, self, bias)
        else:
            # No grad (validation, or a first layer's frozen input): the same temporaries.
            weight = _fake_dense(self.dense_shape, x.dtype, self.weight, self.nested_blocks)
            out = F.linear(x, weight, bias)
            del weight
        return out.to(input_dtype)

    def _forward_8bit(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None and self.bias.dtype != x.dtype:
            self.bias.data = self.bias.data.to(x.dtype)  # `Linear8bitLt.forward`
        if torch.is_grad_enabled() and x.requires_grad:
            return _Int8Matmul.apply(x, self.weight, self, self.bias)
        weight = torch.zeros(self.dense_shape, dtype=x.dtype, device=x.device)
        return F.linear(x, weight, self.bias)


def plan_quantized_linears(
    linears: Iterable[tuple[nn.Module, str, nn.Linear]],
    kind: str,
    *,
    quant_type: str = "nf4",
    double_quant: bool = True,
    compute_dtype: torch.dtype | None = None,
) -> int:
    """Replace each ``(parent, name, layer)`` Linear layer by a `PlannedQuantizedLinear` of
    `kind` ("4bit" or "8bit") on the same device; return how many.

    ``quant_type`` ("nf4" or "fp4"), ``double_quant`` and ``compute_dtype`` are the 4-bit
    layer's settings as transformers' ``BitsAndBytesConfig`` names them (``bnb_4bit_*``;
    ``compute_dtype=None`` is `Linear4bit`'s own default: the first input's dtype when fp32 or
    bf16). Each layer is quantized from its current weight dtype (load the model in bf16 or fp16
    first, as ``from_pretrained(torch_dtype=…)`` does). What a 4-bit layer saves for backward
    follows the bitsandbytes version `bitsandbytes_rules.planned_bitsandbytes` names.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown quantization {kind!r}; one of {KINDS}")
    rules = planned_bitsandbytes()
    keeps_input = kind == "4bit" and keeps_4bit_input(rules.version)
    replaced = 0
    for parent, name, child in linears:
        layer = PlannedQuantizedLinear(
            child.in_features,
            child.out_features,
            bias=child.bias is not None,
            kind=kind,
            quant_type=quant_type,
            double_quant=double_quant,
            compute_dtype=compute_dtype,
            keeps_input=keeps_input,
            bitsandbytes=rules,
            device=child.weight.device,
            dtype=child.weight.dtype,
        )
        setattr(parent, name, layer)
        replaced += 1
    return replaced
