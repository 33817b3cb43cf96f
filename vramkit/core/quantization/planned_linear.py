"""A stand-in for bitsandbytes' quantized Linear layers that the memory planner can trace.

bitsandbytes cannot quantize weights that do not exist (the planner builds the model on the meta
device and then gives it fake tensors), and its `Params4bit` / `QuantState` do not survive that
conversion. `PlannedQuantizedLinear` holds what a quantized layer keeps on the device and
allocates what its training step allocates, so a fake-tensor trace counts it:

- 4-bit NF4 (`bitsandbytes.nn.Linear4bit` defaults: blocksize 64, ``compress_statistics=True``,
  i.e. double quantization; `bitsandbytes/functional.py`, `quantize_4bit`): the packed weight,
  ``ceil(out·in / 2)`` uint8; one uint8 absmax per 64 weights; one fp32 absmax per 256 of those;
  the 256-entry fp32 code of the second quantization, the 16-entry NF4 code and the offset.
- 8-bit (`bitsandbytes.nn.Linear8bitLt`, ``has_fp16_weights=False``): ``out·in`` int8 and one
  fp32 scale per output row (`Int8Params`, ``SCB``).
- Forward with grad (`bitsandbytes/autograd/_functions.py`, `MatMul4Bit`): for a training batch
  (many rows) the CUDA `gemm_4bit` kernel falls back to dequantize + `F.linear`
  (`bitsandbytes/backends/cuda/ops.py`, `_dequant_linear_fallback`): a temporary
  ``out × in`` weight in the input's dtype. Only the quantized weight is saved for backward,
  which dequantizes it again for the input's gradient; the frozen weight gets no gradient.
  The 8-bit layer is planned with the same rule (its int8 matmul temporaries are smaller).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

NF4_BLOCK = 64
"""Weights per absmax block of bitsandbytes' 4-bit quantization (`Linear4bit`'s default)."""
ABSMAX_BLOCK = 256
"""Absmax values per block of the second (double) quantization (`quantize_4bit`, nested)."""


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
        packed = ((math.ceil(numel / 2), 1), torch.uint8)
        if not double_quant:
            # one fp32 absmax per block and the 16-entry code
            return {
                "weight": packed,
                "absmax": ((blocks,), torch.float32),
                "codes": ((16,), torch.float32),
            }
        return {
            "weight": packed,
            "absmax": ((blocks,), torch.uint8),
            "absmax2": ((math.ceil(blocks / ABSMAX_BLOCK),), torch.float32),
            # state2.code (256), the NF4 code (16) and the offset (1), fp32
            "codes": ((256 + 16 + 1,), torch.float32),
        }
    if kind == "8bit":
        return {
            "weight": ((out_features, in_features), torch.int8),
            "absmax": ((out_features,), torch.float32),
        }
    raise ValueError(f"unknown quantization {kind!r}; 4bit or 8bit")


class _DequantizedMatmul(torch.autograd.Function):
    """y = x·Wᵀ + b with W rebuilt from its quantized form in forward and again in backward."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, packed: torch.Tensor, shape: tuple[int, int], bias: Any
    ) -> torch.Tensor:
        weight = _dequantize(packed, shape, x.dtype)
        out = F.linear(x, weight, bias)
        del weight
        ctx.save_for_backward(packed)
        ctx.shape = shape
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        (packed,) = ctx.saved_tensors
        weight = _dequantize(packed, ctx.shape, grad_out.dtype)
        grad_x = grad_out @ weight
        grad_bias = grad_out.sum(dim=tuple(range(grad_out.dim() - 1))) if ctx.has_bias else None
        return grad_x, None, None, grad_bias


def _dequantize(packed: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    # Memory only: the planner's trace needs the allocation, not the values.
    return torch.zeros(shape, dtype=dtype, device=packed.device)


class PlannedQuantizedLinear(nn.Linear):
    """A frozen Linear layer stored as bitsandbytes stores it, for planning only (no values).

    A subclass of `nn.Linear` so that peft puts its adapters on it as on the real layer.
    """

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
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features = in_features
        self.out_features = out_features
        self.kind = kind
        self.quant_type = quant_type
        self.double_quant = double_quant
        self.compute_dtype = compute_dtype
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
        """Output (…, out_features) for input (…, in_features)."""
        shape = (self.out_features, self.in_features)
        if torch.is_grad_enabled() and x.requires_grad:
            return _DequantizedMatmul.apply(x, self.weight, shape, self.bias)
        # No grad (validation, or a first layer's input): the same temporary, nothing saved.
        weight = _dequantize(self.weight, shape, x.dtype)
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
    layer's settings as transformers' ``BitsAndBytesConfig`` names them (``bnb_4bit_*``).
    """
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
            device=child.weight.device,
            dtype=child.weight.dtype,
        )
        setattr(parent, name, layer)
        replaced += 1
    return replaced
